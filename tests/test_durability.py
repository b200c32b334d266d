"""The run folder survives what stops a run: a write that fails on a full disk keeps the old file, a kill -9
mid-sweep leaves every completed trial readable, stale temporary files are removed, and `report` says when
a run did not finish."""

import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import numpy as np
import pandas as pd
import psutil
import pytest

from conftest import session_alive
from pipeprof.cli import main
from pipeprof.results import DiskFull, Run, load_run

OLD_RUN = Path(__file__).parent / "data" / "run-schema1"


def _dead_pid() -> int:
    child = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    return int(child.stdout)


def test_stale_tmp_files_are_removed_when_the_folder_is_opened_a_live_writers_kept(tmp_path, capfd):
    run = tmp_path / "run"
    shutil.copytree(OLD_RUN, run)
    stale = [run / f"trials.parquet.{_dead_pid()}.tmp", run / "run.json.tmp"]  # a killed writer's, an old-style one
    live = run / f"timeline.parquet.{os.getpid()}.tmp"  # this process is alive: it may be writing it
    for f in [*stale, live]:
        f.write_bytes(b"half a file")
    assert main(["report", str(run)]) == 0
    assert [f.exists() for f in stale] == [False, False] and live.exists()
    assert "run folder:" in capfd.readouterr().out


@pytest.fixture
def tiny_disk(tmp_path):
    yield from _tmpfs(tmp_path, "1m")


@pytest.fixture
def small_disk(tmp_path):
    yield from _tmpfs(tmp_path, "8m")


def _tmpfs(tmp_path, size: str):
    """A real filesystem of ``size`` (tmpfs), to fill up; skipped where this process may not mount one."""
    mount = tmp_path / "disk"
    mount.mkdir()
    made = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(mount)], capture_output=True)
    if made.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {made.stderr.decode().strip()}")
    try:
        yield mount
    finally:
        # a run's DataLoader worker inherits the fds its parent had open in the run folder and may still be
        # exiting after the run did ("target is busy"): wait for the last holder, and name any that stays
        deadline = time.monotonic() + 10
        while (holders := _holders(mount)) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert not holders, f"processes still hold files on {mount}: {holders}"
        subprocess.run(["umount", str(mount)], check=True)


def _holders(mount: Path) -> list[str]:
    """'pid name' of each process with a file open under ``mount`` or its working folder there."""
    inside = f"{mount}{os.sep}"
    out = []
    for p in psutil.process_iter(["name"]):
        try:
            paths = [f.path for f in p.open_files()] + [p.cwd()]
        except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess):
            continue
        if any(f == str(mount) or f.startswith(inside) for f in paths):
            out.append(f"{p.pid} {p.info['name']}")
    return out


def test_a_write_that_fills_the_disk_keeps_the_old_file_and_leaves_no_tmp(tiny_disk):
    run = Run(tiny_disk)
    small = [{"trial_id": f"t{i}", "samples_per_s": float(i)} for i in range(3)]
    run.save_trials(small)
    run.meta = {"status": "running", "trials_planned": 3}
    run.save_meta()
    rng = np.random.default_rng(0)
    huge = [{"trial_id": f"t{i}", "noise": rng.bytes(4096)} for i in range(400)]  # ~1.6 MB: cannot fit
    with pytest.raises(DiskFull, match="disk full writing trials.parquet .*free at least"):
        run.save_trials(huge)  # ENOSPC: the disk really filled
    with pytest.raises(DiskFull):
        run.meta["padding"] = "x" * 2_000_000
        run.save_meta()
    assert sorted(p.name for p in tiny_disk.iterdir()) == ["run.json", "trials.parquet"]  # no .tmp left behind
    assert pd.read_parquet(tiny_disk / "trials.parquet")["trial_id"].tolist() == ["t0", "t1", "t2"]
    assert json.loads((tiny_disk / "run.json").read_text()) == {"status": "running", "trials_planned": 3}


def _rows(folder: Path) -> int:
    try:
        return len(pd.read_parquet(folder / "trials.parquet"))
    except (OSError, ValueError):  # not written yet
        return 0


def test_after_kill_9_mid_sweep_every_completed_trial_reads_and_report_says_unfinished(tmp_path, capfd):
    out = tmp_path / "out"
    sets = [
        f"out_dir={out}",
        f"data.cache_dir={tmp_path}/ds",
        "data.images=16",
        "data.classes=2",
        "name=k",
        "trials=[cpu_pipeline]",
        "loader.num_workers=[0,1,2]",
        "augment.preset=[light,standard,heavy]",
        "loader.batch_size=4",
        "stage_timing=false",
        "measure.warmup_s=0.1",
        "measure.warmup_max_s=0.5",
        "measure.redraws=10",
        "measure.window_s=0.1",
        "measure.windows=3",
        "measure.max_windows=3",
        "measure.cpu_reference_s=0",
    ]
    proc = subprocess.Popen(
        [sys.executable, "-m", "pipeprof", "run", *[a for s in sets for a in ("--set", s)]],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
    )
    try:
        deadline = time.monotonic() + 240
        while not (folders := list(out.glob("k-*"))) or _rows(folders[0]) < 1:
            assert proc.poll() is None and time.monotonic() < deadline, "the run ended before a trial was saved"
            time.sleep(0.05)
    finally:
        os.killpg(proc.pid, signal.SIGKILL)  # the run and every process it started, at once
        proc.wait(timeout=30)
    deadline = time.monotonic() + 5  # SIGKILL is delivered at once; the kernel reaps in its own time
    while session_alive(proc.pid) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert session_alive(proc.pid) == []
    run = load_run(folders[0])  # everything completed before the kill is there and readable
    done = len(run.trials)
    assert 1 <= done < 9 and (run.trials["status"] == "ok").all() and run.meta["status"] == "running"
    assert main(["report", str(folders[0])]) == 0
    report = capfd.readouterr().out
    assert "the run did not finish (status 'running': its process stopped without finishing" in report
    assert f"{done} trials done of 9 planned" in report and "Trials as measured (no analysis saved)" in report


@pytest.mark.slow
def test_a_disk_that_fills_mid_run_keeps_the_trials_says_how_much_and_exits_2(small_disk, tmp_path, capsys):
    sets = [
        "data.images=16",
        "data.classes=2",
        f"data.cache_dir={tmp_path}/datasets",
        f"out_dir={small_disk}",
        "loader.num_workers=[0,1,2]",
        "loader.batch_size=4",
        "augment.preset=light",
        "name=full",
        "trials=[cpu_pipeline,end_to_end]",
        "model.name=pipeprof.checks.calibrate:fixed_step_model_5ms",
        "model.threads=1",
        "measure.window_s=0.1",
        "measure.max_windows=3",
        "measure.warmup_max_s=0.5",
        "measure.redraws=10",
        "measure.cpu_reference_s=0",
    ]
    seen: dict = {}

    def fill() -> None:
        """Once a trial is saved, every free byte, as another program filling the disk would."""
        deadline, folder = time.time() + 120, None
        while time.time() < deadline and not (folder and _rows(folder)):
            folder = next(small_disk.glob("full-*"), None)
            time.sleep(0.2)
        seen.update(folder=folder, children=psutil.Process().children(recursive=True))
        if folder and _rows(folder):
            with open(small_disk / "filler", "wb") as f, contextlib.suppress(OSError):
                while True:
                    f.write(b"\0" * 65536)
                    f.flush()

    # the command in this process, the disk filled from a thread beside it: its exit status and what it printed
    # are the CLI's (a `pipeprof run` interpreter of its own added 6 s of CPU to its start)
    filler = threading.Thread(target=fill, name="test-filler", daemon=True)
    filler.start()
    code = main(["run", *sum([["--set", x] for x in sets], [])])
    filler.join(timeout=130)
    err = capsys.readouterr().err
    folder, children = seen["folder"], seen["children"]
    assert folder and _rows(folder) >= 1, "no trial was saved in time"
    assert code == 2, err
    assert "disk full writing" in err and "free at least" in err and "--resume" in err
    meta = json.loads((folder / "run.json").read_text())
    assert meta["status"] == "failed: disk full"
    assert _rows(folder) >= 1 and not list(folder.glob("*.tmp"))  # whole files, no temporary left
    psutil.wait_procs(children, timeout=10)
    assert not [c for c in children if c.is_running() and c.status() != psutil.STATUS_ZOMBIE]
