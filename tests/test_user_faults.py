"""Faults of the user's own data and settings, each injected for real (issue 22): files that are not regular
files (a real FIFO, socket, directory, device link), datasets whose samples the loader cannot batch, settings
the machine cannot honour, runs started at the same moment. Each says so first, exits non-zero, never hangs."""
from __future__ import annotations

import json
import multiprocessing as mp
import os
import shutil
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import torch
from PIL import Image
from torch.utils.data import Dataset

from pipeprof.cli import main
from pipeprof.config import ConfigError
from pipeprof.data.cache import evict, warm
from pipeprof.data.check import check_paths, dataset_paths
from pipeprof.data.sources.files import FileSource
from pipeprof.data.sources.memory import MemorySource
from pipeprof.data.sources.shards import ShardSource, pack_folder
from pipeprof.data.user_samples import check_user_dataset
from pipeprof.results import new_run_dir
from pipeprof.trials.skeleton import collate_user

HERE = Path(__file__).resolve().parents[1]
QUICK = ["measure.warmup_s=0.1", "measure.window_s=0.2", "measure.window_batches=2", "measure.windows=2",
         "measure.max_windows=2", "measure.cpu_reference_s=0", "measure.max_trial_s=20", "loader.batch_size=4",
         "device=cpu", "model.threads=1", "stage_timing=false", "name=t"]
# what each odd path is, as the reason names it
ODD = {"fifo.jpg": "a FIFO (named pipe), not a regular file", "sock.jpg": "a socket, not a regular file",
       "folder.jpg": "a directory, not a regular file",
       "device.jpg": "a symbolic link to a character device (/dev/null), not a regular file",
       "to_fifo.jpg": "a symbolic link to a FIFO (named pipe)", "chain.jpg": "a symbolic link to a symbolic link"}


def within(seconds: float, fn, *args):
    """``fn(*args)`` in a thread, failing the test if it has not returned in ``seconds`` (a read that hangs)."""
    out: dict = {}

    def call():
        try:
            out["value"] = fn(*args)
        except BaseException as exc:  # raised again in the test's thread
            out["error"] = exc

    thread = threading.Thread(target=call, name="test-within", daemon=True)
    thread.start()
    thread.join(seconds)
    assert not thread.is_alive(), f"{getattr(fn, '__name__', fn)} still running after {seconds} s: it hangs"
    if "error" in out:
        raise out["error"]
    return out.get("value")


@pytest.fixture
def odd_dataset(tiny_dataset, tmp_path):
    """The 12-image dataset plus one path of each kind that is not a regular file, named like an image."""
    root = tmp_path / "odd"
    shutil.copytree(tiny_dataset, root)
    cls = root / "class_000"
    os.mkfifo(cls / "fifo.jpg")
    (root / "class_001" / "folder.jpg").mkdir()
    (root / "class_001" / "device.jpg").symlink_to("/dev/null")
    (root / "class_002" / "to_fifo.jpg").symlink_to(cls / "fifo.jpg")
    (root / "class_002" / "link.jpg").symlink_to(cls / "img_0000000.jpg")  # one link to a file: read as one
    (root / "class_002" / "chain.jpg").symlink_to(root / "class_002" / "link.jpg")
    server = socket.socket(socket.AF_UNIX)
    server.bind(str(root / "class_002" / "sock.jpg"))
    yield root
    server.close()


def test_paths_that_are_not_regular_files_are_named_and_never_opened(odd_dataset, tmp_path):
    paths = dataset_paths(odd_dataset)
    assert len(paths) == 12 + 7  # every path named like an image is in the list...
    found = within(20, check_paths, paths)
    assert sorted(Path(p).name for p, _ in found.unreadable) == sorted(ODD)  # ...and the scan names what it is
    for path, why in found.unreadable:
        assert ODD[Path(path).name] in why
    source = FileSource(odd_dataset)
    for k, path in enumerate(source.paths):
        name = Path(path).name
        if name in ODD:
            with pytest.raises(OSError, match="cannot read .*" + ODD[name].split(" (")[0]):
                within(5, source.read, k)
        else:
            assert within(5, source.read, k)[:2] == b"\xff\xd8"  # a JPEG, the link's target's bytes
    # the page cache is set and measured over the same list: neither blocks on the FIFO
    regular = sum(p.stat().st_size for p in odd_dataset.rglob("img_*.jpg")) + (odd_dataset / "class_002" / "link.jpg").stat().st_size
    assert within(20, warm, source.files())["bytes"] == regular and within(20, evict, source.files())["bytes"] == regular
    memory = within(20, MemorySource, source)  # read at construction: the odd ones are bad samples, not a failure
    assert memory.nbytes(source.paths.index(str(odd_dataset / "class_000" / "fifo.jpg"))) == 0
    packed = within(30, pack_folder, odd_dataset, tmp_path / "shards", 0.3)
    assert packed["samples"] == 13 and sorted(Path(s.split(": ")[0]).name for s in packed["skipped"]) == sorted(ODD)
    os.mkfifo(tmp_path / "shards" / "shard-999999.tar")  # a FIFO among the shards is skipped and named too
    shards = within(20, ShardSource, tmp_path / "shards")
    assert len(shards) == 13 and "shard-999999.tar: a FIFO" in shards.describe()["skipped"][0]


def test_a_run_over_a_folder_with_a_fifo_skips_and_counts_it_and_check_data_names_it(odd_dataset, tmp_path, capsys):
    assert main(["check-data", str(odd_dataset)]) == 1
    printed = capsys.readouterr().out
    assert printed.startswith("checked 19 of 19 files") and "6 unreadable" in printed
    for name, why in ODD.items():
        assert f"{name}: {why}" in printed
    out, t0 = tmp_path / "out", time.monotonic()
    sets = [*QUICK, "data.kind=folder", f"data.path={odd_dataset}", f"out_dir={out}", "data.max_bad_frac=0.5",
            "trials=[cpu_pipeline]", "loader.num_workers=[0,1]", "data.cache=[cold]", "augment.preset=light"]
    run = subprocess.run([sys.executable, "-m", "pipeprof", "run", *[a for s in sets for a in ("--set", s)]],
                         capture_output=True, text=True, timeout=120, cwd=HERE)  # a hang fails here
    assert run.returncode == 0, run.stdout + run.stderr
    (folder,) = out.glob("t-*")
    meta = json.loads((folder / "run.json").read_text())
    assert meta["status"] == "complete" and meta["dataset"]["check"]["unreadable"] == 6
    rows = pd.read_parquet(folder / "trials.parquet")
    assert list(rows["num_workers"]) == [0, 1] and (rows["status"] == "ok").all()
    for r in rows.itertuples():  # in the main process and in a worker, the odd paths were skipped and named
        assert r.bad_samples >= 1 and any(name in r.bad_samples_first for name in ODD)
    assert "not a regular file" in run.stdout and time.monotonic() - t0 < 100


def _claim(out: str, barrier, queue) -> None:
    barrier.wait()  # every process leaves the barrier at once: the same second, the same name
    queue.put(str(new_run_dir(out, "same")))


def test_runs_started_at_the_same_moment_get_their_own_folders(tmp_path):
    ctx = mp.get_context("fork")
    for _attempt in range(3):  # a second boundary between the processes would give distinct names anyway
        out = tmp_path / f"out{_attempt}"
        barrier, queue = ctx.Barrier(6), ctx.Queue()
        procs = [ctx.Process(target=_claim, args=(str(out), barrier, queue)) for _ in range(6)]
        for p in procs:
            p.start()
        for p in procs:
            p.join(30)
        assert [p.exitcode for p in procs] == [0] * 6  # none failed on a folder another made first
        folders = sorted(queue.get(timeout=5) for _ in procs)
        assert len(set(folders)) == 6 and sorted(str(p) for p in out.iterdir()) == folders
        if any(f.endswith("-1") for f in folders):  # they did collide on one name, and each got its own
            break
    else:
        pytest.fail("the six processes never started in the same second")
