"""Faults of the user's own data and settings, each injected for real (issue 22): files that are not regular
files (a real FIFO, socket, directory, device link), datasets whose samples the loader cannot batch, settings
the machine cannot honour, runs started at the same moment. Each says so first, exits non-zero, never hangs."""

from __future__ import annotations

import json
import multiprocessing as mp
import os
import re
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
from pipeprof.data.sources.url import UrlSource
from pipeprof.data.user_samples import check_user_dataset
from pipeprof.results import new_run_dir
from pipeprof.trials.skeleton import collate_user

HERE = Path(__file__).resolve().parents[1]
QUICK = [
    "measure.warmup_s=0.1",
    "measure.warmup_max_s=0.5",
    "measure.window_s=0.1",
    "measure.window_batches=2",
    "measure.windows=2",
    "measure.max_windows=2",
    "measure.cpu_reference_s=0",
    "measure.max_trial_s=20",
    "loader.batch_size=4",
    "device=cpu",
    "model.threads=1",
    "stage_timing=false",
    "name=t",
]
# what each odd path is, as the reason names it
ODD = {
    "fifo.jpg": "a FIFO (named pipe), not a regular file",
    "sock.jpg": "a socket, not a regular file",
    "folder.jpg": "a directory, not a regular file",
    "device.jpg": "a symbolic link to a character device (/dev/null), not a regular file",
    "to_fifo.jpg": "a symbolic link to a FIFO (named pipe)",
    "chain.jpg": "a symbolic link to a symbolic link",
}


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
    regular = sum(p.stat().st_size for p in [*odd_dataset.rglob("img_*.jpg"), odd_dataset / "class_002" / "link.jpg"])
    assert within(20, warm, source.files())["bytes"] == regular == within(20, evict, source.files())["bytes"]
    memory = within(20, MemorySource, source)  # read at construction: the odd ones are bad samples, not a failure
    assert memory.nbytes(source.paths.index(str(odd_dataset / "class_000" / "fifo.jpg"))) == 0
    packed = within(30, pack_folder, odd_dataset, tmp_path / "shards", 0.3)
    assert packed["samples"] == 13 and sorted(Path(s.split(": ")[0]).name for s in packed["skipped"]) == sorted(ODD)
    os.mkfifo(tmp_path / "shards" / "shard-999999.tar")  # a FIFO among the shards is skipped and named too
    shards = within(20, ShardSource, tmp_path / "shards")
    assert len(shards) == 13 and "shard-999999.tar: a FIFO" in shards.describe()["skipped"][0]
    urls = UrlSource(str(odd_dataset), [(os.path.relpath(p, odd_dataset), 0, 1) for p in source.paths])
    fifo = source.paths.index(str(odd_dataset / "class_000" / "fifo.jpg"))  # a local "URL" is a path too
    with pytest.raises(OSError, match="fifo.jpg: a FIFO"):
        within(5, urls.read, fifo)


def test_a_run_over_a_folder_with_a_fifo_skips_and_counts_it_and_check_data_names_it(odd_dataset, tmp_path, capsys):
    assert main(["check-data", str(odd_dataset)]) == 1
    printed = capsys.readouterr().out
    assert printed.startswith("checked 19 of 19 files") and "6 unreadable" in printed
    for name, why in ODD.items():
        assert f"{name}: {why}" in printed
    out, t0 = tmp_path / "out", time.monotonic()
    sets = [
        *QUICK,
        "data.kind=folder",
        f"data.path={odd_dataset}",
        f"out_dir={out}",
        "data.max_bad_frac=0.5",
        "trials=[cpu_pipeline]",
        "loader.num_workers=[0,1]",
        "data.cache=[cold]",
        "augment.preset=light",
    ]
    run = subprocess.run(
        [sys.executable, "-m", "pipeprof", "run", *[a for s in sets for a in ("--set", s)]],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=HERE,
    )  # a hang fails here
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


# ---- the user's samples ---------------------------------------------------------------------------------


class Returns(Dataset):
    """A user's Dataset whose ``__getitem__`` returns ``make(index)``."""

    def __init__(self, make, n: int = 16):
        self.make, self.n = make, n

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, index: int):
        return self.make(index)


RGB = np.zeros((64, 48, 3), np.uint8)
SAMPLES = {  # what __getitem__ returns -> what the refusal says
    "pil": (
        lambda i: (Image.fromarray(RGB), 1),
        ["image is a PIL image (RGB, 48×64)", "add torchvision.transforms.ToTensor()"],
    ),
    "hwc": (lambda i: (RGB, 1), ["image is a uint8 ndarray of shape 64×48×3", "channels last", "permute(2, 0, 1)"]),
    "dict": (
        lambda i: {"image": torch.zeros(3, 8, 8), "label": 1},
        ["returns a dict with keys ['image', 'label']", "return (sample['image'], sample['label'])"],
    ),
    "no label": (lambda i: torch.zeros(3, 8, 8), ["returns a float32 tensor of shape 3×8×8", "add the label"]),
    "grey": (lambda i: (torch.zeros(8, 8), 1), ["image is a float32 tensor of shape 8×8", "unsqueeze(0)"]),
    "float64": (lambda i: (torch.zeros(3, 8, 8, dtype=torch.float64), 1), ["64-bit floats", "image.float()"]),
    "int64": (lambda i: (torch.zeros(3, 8, 8, dtype=torch.int64), 1), ["dtype int64", ".to(torch.uint8)"]),
    "one-hot": (
        lambda i: (torch.zeros(3, 8, 8), torch.eye(10)[1]),
        ["label is a float32 tensor of shape 10", "label.argmax()"],
    ),
    "sizes": (
        lambda i: (torch.zeros(3, 80 if i % 2 == 0 else 72, 64), 1),
        [
            "samples differ in size: 3×80×64 (sample 0) vs 3×72×64 (sample 1)",
            "crop or resize them to one size",
            "a collate_fn",
        ],
    ),
    "later form": (
        lambda i: (torch.zeros(3, 8, 8), 1) if i < 3 else (Image.fromarray(RGB), 1),
        ["PIL image", "(sample 3; sample 0 is a tuple of 2 (a float32 tensor of shape 3×8×8"],
    ),
    "raises": (lambda i: (_ for _ in ()).throw(KeyError("no such row")), ["sample 0 raised KeyError: 'no such row'"]),
}


@pytest.mark.parametrize("case", list(SAMPLES))
def test_each_sample_the_loader_cannot_batch_is_refused_with_its_fix(case):
    make, words = SAMPLES[case]
    with pytest.raises(ConfigError) as caught:
        check_user_dataset(Returns(make), 8, collate_user, cap_s=10)
    for w in words:
        assert w in str(caught.value)


def test_samples_the_loader_batches_pass_with_their_facts():
    facts = check_user_dataset(
        Returns(lambda i: (torch.zeros(3, 8, 12, dtype=torch.uint8), np.int64(i % 3))), 8, collate_user
    )
    assert facts == ("uint8", 12, (3, 8, 12))
    # an ndarray in C×H×W and a one-element label tensor are what collate_user batches too
    assert check_user_dataset(
        Returns(lambda i: (np.zeros((1, 5, 5), np.float32), torch.tensor([2]))), 4, collate_user
    ).shape == (1, 5, 5)


@pytest.mark.one_core  # a time cap of 1 s
def test_a_getitem_that_blocks_is_refused_after_the_cap():
    release = threading.Event()
    t0 = time.monotonic()
    with pytest.raises(ConfigError, match=r"sample 1 did not return in 1 s \(measure.max_trial_s\)"):
        check_user_dataset(Returns(lambda i: release.wait() if i else (torch.zeros(3, 8, 8), 1)), 8, collate_user, 1)
    assert time.monotonic() - t0 < 3
    release.set()  # the cut-off thread returns and ends: wait for it, or the leak check at teardown races it
    for t in [t for t in threading.enumerate() if t.name == "pipeprof-sample-check"]:
        t.join(5)
        assert not t.is_alive()


USER_DATASETS = """
import numpy as np, torch
from PIL import Image
from torch.utils.data import Dataset

class Made(Dataset):
    def __init__(self, make, n=32):
        self.make, self.n = make, n
    def __len__(self):
        return self.n
    def __getitem__(self, i):
        return self.make(i)

def pil():
    return Made(lambda i: (Image.fromarray(np.zeros((64, 64, 3), np.uint8)), i % 10))

def sizes():
    return Made(lambda i: (torch.zeros(3, 80 if i % 2 == 0 else 72, 64), i % 10))

def huge():  # 4096² RGB: 50 MB a sample, made only when read
    return Made(lambda i: (torch.zeros(3, 4096, 4096, dtype=torch.uint8), i % 10), n=1000)

def _later(i):  # the first batch passes the check; the rows after it are missing
    if i >= 8:
        raise ValueError(f"row {i} of the table is missing")
    return torch.zeros(3, 16, 16), i % 10

def later():
    return Made(_later, n=64)

def _in_workers(i):  # fine in the training process, not in a DataLoader worker
    from torch.utils.data import get_worker_info
    if get_worker_info() is not None:
        raise OSError("the share is not mounted in the workers")
    return torch.zeros(3, 16, 16), i % 10

def in_workers():
    return Made(_in_workers, n=64)
"""


def _cli(tmp_path, monkeypatch, *sets) -> int:
    """``pipeprof run`` in this process with the user's datasets importable as ``userds:<fn>``."""
    (tmp_path / "userds.py").write_text(USER_DATASETS)
    monkeypatch.syspath_prepend(str(tmp_path))
    argv = ["run"] + [
        a
        for s in (*QUICK, f"out_dir={tmp_path}/out", f"data.cache_dir={tmp_path}/datasets", *sets)
        for a in ("--set", s)
    ]
    return main(argv)


@pytest.mark.parametrize(
    "factory, message",
    [
        (
            "pil",
            "data: the dataset's image is a PIL image (RGB, 64×64): the loader batches tensors: add "
            "torchvision.transforms.ToTensor()",
        ),
        ("sizes", "data: samples differ in size: 3×80×64 (sample 0) vs 3×72×64 (sample 1); crop or resize"),
    ],
)
def test_a_dataset_the_loader_cannot_batch_stops_the_run_with_exit_2_and_no_folder(
    tmp_path, monkeypatch, capsys, factory, message
):
    code = _cli(tmp_path, monkeypatch, "data.kind=factory", f"data.factory=userds:{factory}", "loader.num_workers=[0]")
    err = capsys.readouterr().err
    assert code == 2 and f"pipeprof run: {message}" in err and "Traceback" not in err
    assert list((tmp_path / "out").iterdir()) == []  # refused before a run folder was made


# ---- settings the machine cannot honour -----------------------------------------------------------------


def test_settings_the_machine_cannot_honour_are_refused_at_once_naming_field_and_limit(tmp_path, monkeypatch, capsys):
    cores = len(os.sched_getaffinity(0))
    t0 = time.monotonic()
    assert _cli(tmp_path, monkeypatch, "loader.num_workers=[5000]") == 2
    assert time.monotonic() - t0 < 10  # at once: no dataset made, no worker started
    err = capsys.readouterr().err
    assert (
        f"loader.num_workers: 5000 is above pipeprof's cap of {8 * cores} (8 workers per usable core, a "
        f"chosen multiple; {cores} usable cores here)" in err
    )
    assert not (tmp_path / "datasets").exists()
    assert (
        _cli(tmp_path, monkeypatch, "data.images=8", "data.classes=2", "loader.batch_size=16", "loader.num_workers=[0]")
        == 2
    )
    assert (
        "loader.batch_size: 16 is more than the dataset's 8 samples: every batch would hold samples twice; at "
        "most 8, or a larger dataset (data.images)" in capsys.readouterr().err
    )
    # 4 workers × 2 batches of 128 4096² images (6.4 GB each) in flight: more than /dev/shm or the memory holds
    assert (
        _cli(
            tmp_path,
            monkeypatch,
            "data.kind=factory",
            "data.factory=userds:huge",
            "loader.batch_size=128",
            "loader.num_workers=[4]",
            "trials=[cpu_pipeline]",
        )
        == 2
    )
    err = capsys.readouterr().err
    assert (
        "loader.num_workers, loader.batch_size, loader.prefetch_factor: 4 workers × 2 batches in flight of 128 "
        "images (6,442 MB each, 4096² px) need" in err
    )
    assert ("/dev/shm has" in err and "docker run --shm-size" in err) or "the machine has" in err
    assert list((tmp_path / "out").iterdir()) == []


def test_batches_in_flight_are_checked_against_a_small_dev_shm():
    from pipeprof import config as C
    from pipeprof.orchestrate.limits import check_plan
    from pipeprof.orchestrate.sweep import expand, preset_probe

    cfg = C.resolve(
        C.build(
            {
                "device": "cpu",
                "loader": {"batch_size": [64], "num_workers": [0, 2]},
                "trials": ["cpu_pipeline"],
                "augment": {"preset": ["light"]},
            }
        ),
        False,
        False,
        2,
    )
    specs = expand(cfg)
    # light hands 224² uint8 images: 9.6 MB a batch; 2 workers × 2 in shared memory = 38.5 MB
    check_plan(cfg, specs, preset_probe, 512, 1e12, 39e6)
    with pytest.raises(
        ConfigError,
        match=r"2 workers × 2 batches in flight of 64 images \(10 MB each, 224² px\) "
        r"need 39 MB, but /dev/shm has 38 MB free",
    ):
        check_plan(cfg, specs, preset_probe, 512, 1e12, 38e6)
    with pytest.raises(ConfigError, match="loader.batch_size: 64 is more than the dataset's 32 samples"):
        check_plan(cfg, specs, preset_probe, 32, None, None)
    ceiling = cfg.model_copy(update={"trials": ["gpu_ceiling"]})  # its batch is made on the device, not read
    check_plan(ceiling, expand(ceiling), preset_probe, 32, None, None)


# ---- no answer --------------------------------------------------------------------------------------------

STEP = ["model.name=pipeprof.checks.calibrate:fixed_step_model_5ms", "loader.num_workers=[0,1]"]


def test_a_run_in_which_every_end_to_end_trial_failed_says_there_is_no_answer_and_exits_1(
    tmp_path, monkeypatch, capsys
):
    t0 = time.monotonic()
    code = _cli(tmp_path, monkeypatch, "data.kind=factory", "data.factory=userds:later", *STEP)
    printed = capsys.readouterr().out
    assert code == 1 and time.monotonic() - t0 < 120
    first = next(line for line in printed.splitlines() if line.strip() and not line.startswith("run folder"))
    assert first.startswith("no answer: every end_to_end trial failed (2 of 2), all with ValueError: row ")
    (folder,) = (tmp_path / "out").glob("t-*")
    meta = json.loads((folder / "run.json").read_text())
    assert re.fullmatch(r"failed: ValueError: row \d+ of the table is missing", meta["status"])
    assert meta["analysis"]["failures"]["no_answer"].startswith(first[:60])
    rows = pd.read_parquet(folder / "trials.parquet")  # the failed rows stay, with their errors
    failed = rows[rows["kind"].isin(["end_to_end", "cpu_pipeline"])]
    assert len(failed) == 4 and (failed["status"] == "error").all()
    assert failed["error"].str.contains("of the table is missing").all()
    assert (rows.loc[rows["kind"] == "gpu_ceiling", "status"] == "ok").all()


def test_a_run_in_which_some_trials_failed_says_which_and_what_the_answer_rests_on(tmp_path, monkeypatch, capsys):
    code = _cli(
        tmp_path,
        monkeypatch,
        "data.kind=factory",
        "data.factory=userds:in_workers",
        *STEP,
        "trials=[end_to_end,cpu_pipeline]",
    )
    printed = capsys.readouterr().out
    (folder,) = (tmp_path / "out").glob("t-*")
    meta = json.loads((folder / "run.json").read_text())
    assert code == 0 and meta["status"] == "complete"
    rests = meta["analysis"]["failures"]["rests_on"]
    assert rests == (
        "trials failed: 1 of 2 cpu_pipeline at 1 worker (OSError: the share is not mounted in the "
        "workers); 1 of 2 end_to_end at 1 worker (OSError: the share is not mounted in the workers); "
        "the answer rests on the 1 end_to_end trials that ran (at 0 workers)"
    )
    assert rests in " ".join(printed.split())  # printed with the answer (the console wraps long lines)


def test_failures_name_the_kind_its_count_and_the_cause_they_share():
    from pipeprof.analysis.failures import failures

    rows = pd.DataFrame(
        [
            {
                "kind": "gpu_ceiling",
                "batch_size": 512,
                "num_workers": None,
                "status": "oom",
                "error": "OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB\n(stack)",
            },
            {
                "kind": "gpu_ceiling",
                "batch_size": 256,
                "num_workers": None,
                "status": "oom",
                "error": "OutOfMemoryError: CUDA out of memory. Tried to allocate 1.00 GiB",
            },
        ]
    )
    found = failures(rows)  # a run of step trials only: each kind it has is its answer
    assert found["cause"] == "oom: OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB"
    assert found["no_answer"].startswith("no answer: every gpu_ceiling trial failed (2 of 2), all with oom: ")
    assert found["failed"][0]["where"] == "at batch 256, 512"
    mixed = pd.concat([rows, pd.DataFrame([{"kind": "gpu_ceiling", "batch_size": 64, "status": "ok", "error": None}])])
    assert failures(mixed)["no_answer"] is None and failures(mixed)["rests_on"].endswith(
        "the answer rests on the 1 gpu_ceiling trials that ran (at batch 64)"
    )


@pytest.mark.parametrize(
    "case, fix",
    [
        ("pil", "the dataset returns PIL images: add torchvision.transforms.ToTensor()"),
        ("sizes", "samples differ in size: crop or resize them to one size"),
    ],
)
def test_a_users_own_loader_whose_batch_cannot_be_made_is_refused_with_the_fix(tmp_path, case, fix):
    from torch.utils.data import DataLoader

    import pipeprof

    make = SAMPLES[case][0]
    with pytest.raises(ConfigError) as caught:
        pipeprof.profile(
            loader=lambda w: DataLoader(Returns(make), batch_size=4, num_workers=w),
            device="cpu",
            out_dir=str(tmp_path / "out"),
            log=lambda *a: None,
        )
    assert str(caught.value).startswith("data.factory: fn(num_workers=0) must return a DataLoader") and fix in str(
        caught.value
    )
    assert list((tmp_path / "out").iterdir()) == []
