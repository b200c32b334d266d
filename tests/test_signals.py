"""SIGINT and SIGTERM sent to a real `pipeprof run` mid-sweep: the window in progress is abandoned, every
completed trial is saved with a summary and an analysis, status 'interrupted', exit 130 / 143; a second
Ctrl-C exits at once with whole files; no DataLoader worker (nor an N-GPU job's rank) outlives the run."""

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pandas as pd
import psutil
import pytest

from pipeprof.results import load_run

MEASURE = [
    "measure.warmup_s=0.2",
    "measure.warmup_max_s=1",
    "measure.redraws=10",
    "measure.window_s=0.3",
    "measure.windows=3",
    "measure.max_windows=3",
    "measure.window_batches=2",
    "measure.cpu_reference_s=0",
]
# 10 ms of CPU a sample, batch 4: each trial runs its workers for 1.1 s and more (the signal lands in one, or
# between two: the checks hold either way; _mid_sweep polls every 50 ms)
BURN = [
    "data.kind=factory",
    "data.factory=pipeprof.checks.calibrate:BurnDataset",
    "loader.batch_size=4",
    "device=cpu",
    "stage_timing=false",
    "model.threads=1",
]


def _rows(folder: Path) -> int:
    try:
        return len(pd.read_parquet(folder / "trials.parquet"))
    except (OSError, ValueError):  # not written yet
        return 0


def _descendants(pid: int) -> list[psutil.Process]:
    try:
        return psutil.Process(pid).children(recursive=True)
    except psutil.NoSuchProcess:
        return []


def _alive(procs: list[psutil.Process]) -> list[int]:
    out = []
    for p in procs:
        try:
            if p.is_running() and p.status() != psutil.STATUS_ZOMBIE:
                out.append(p.pid)
        except psutil.NoSuchProcess:
            pass
    return out


def _start(out: Path, sets: list[str]) -> subprocess.Popen:
    args = [a for s in [f"out_dir={out}", "name=s", *sets] for a in ("--set", s)]
    return subprocess.Popen(
        [sys.executable, "-m", "pipeprof", "run", *args],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,
    )


def _mid_sweep(proc: subprocess.Popen, out: Path, ready) -> tuple[Path, list[psutil.Process]]:
    """Wait until a trial is saved and ``ready(descendants)`` holds (a trial's processes are running);
    returns the run folder and the descendants then."""
    deadline = time.monotonic() + 240
    while True:
        assert proc.poll() is None and time.monotonic() < deadline, "the run ended before the signal"
        folders = list(out.glob("s-*"))
        kids = _descendants(proc.pid)
        if folders and _rows(folders[0]) >= 1 and ready(kids):
            return folders[0], _descendants(proc.pid)  # again: ready() may have waited on some to start
        time.sleep(0.05)


def _workers(kids: list[psutil.Process]) -> bool:
    return len(kids) >= 1  # the trial in progress has its DataLoader workers running


def _gone_soon(procs: list[psutil.Process], within_s: float = 5.0) -> list[int]:
    deadline = time.monotonic() + within_s
    while _alive(procs) and time.monotonic() < deadline:
        time.sleep(0.05)
    return _alive(procs)


@pytest.mark.parametrize("sig, code", [(signal.SIGTERM, 143), (signal.SIGINT, 130)])
def test_a_signal_mid_sweep_saves_the_trials_and_summary_and_exits_128_plus_its_number(tmp_path, sig, code):
    out = tmp_path / "out"
    proc = _start(out, BURN + MEASURE + ["trials=[cpu_pipeline]", "loader.num_workers=[1,2]"])
    try:
        folder, kids = _mid_sweep(proc, out, _workers)
        done_before = _rows(folder)
        proc.send_signal(sig)
        log = proc.communicate(timeout=60)[0]
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    assert proc.returncode == code, log
    assert _gone_soon(kids) == []  # the workers of the abandoned trial stopped with it
    meta = json.loads((folder / "run.json").read_text())
    trials = pd.read_parquet(folder / "trials.parquet")
    assert meta["status"] == "interrupted" and meta["interrupted_by"] == signal.Signals(sig).name
    # every trial that completed is kept and the abandoned one left no row; the analysis is of those
    assert 1 <= done_before <= len(trials) < 2 and (trials["status"] == "ok").all()
    assert meta["analysis"]["trials"] == len(trials) and meta["trials_planned"] == 2
    assert (folder / "summary.md").read_text().strip() and (folder / "timeline.parquet").is_file()
    assert "interrupted: the trials measured so far are saved" in log and "--resume" in log


def test_a_second_ctrl_c_exits_at_once_and_leaves_whole_files(tmp_path):
    out = tmp_path / "out"
    proc = _start(out, BURN + MEASURE + ["trials=[cpu_pipeline]", "loader.num_workers=[1,2]"])
    try:
        folder, kids = _mid_sweep(proc, out, _workers)
        proc.send_signal(signal.SIGINT)
        time.sleep(0.05)
        proc.send_signal(signal.SIGINT)
        t0 = time.monotonic()
        proc.communicate(timeout=30)
        took = time.monotonic() - t0
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    assert proc.returncode == 130 and took < 5
    assert _gone_soon(kids) == []
    meta = json.loads((folder / "run.json").read_text())  # whole: it parses, whichever write it holds
    assert meta["status"] in ("running", "interrupted")
    trials = pd.read_parquet(folder / "trials.parquet")
    assert len(trials) >= 1 and (trials["status"] == "ok").all()
    # a write cut short leaves only its temporary file, removed when the folder is next opened
    assert len(load_run(folder).trials) == len(trials) and list(folder.glob("*.tmp")) == []


def _ranks_with_workers(kids: list[psutil.Process]) -> bool:
    """Both ranks of the torchrun job (``python -m pipeprof.orchestrate.distributed``, not torchrun, whose arguments
    name it too; a forked worker shares its rank's command line but has no children) run their loader worker."""
    ranks = 0
    for p in kids:
        try:
            cmd = " ".join(p.cmdline())
            ranks += (
                "pipeprof.orchestrate.distributed" in cmd and "torch.distributed.run" not in cmd and bool(p.children())
            )
        except psutil.NoSuchProcess:
            pass
    return ranks == 2


@pytest.mark.slow
def test_sigterm_during_an_n_gpu_trial_kills_the_torchrun_job_and_its_ranks(tmp_path):
    out = tmp_path / "out"
    # two CPU processes under torchrun (gloo), each with a worker; the first trial is a one-process one
    proc = _start(
        out,
        BURN
        + MEASURE
        + [
            "trials=[cpu_pipeline]",
            "loader.num_workers=[1]",
            "distributed.gpus=[1,2]",
            "measure.windows=6",
            "measure.max_windows=6",
        ],
    )
    try:
        folder, kids = _mid_sweep(proc, out, _ranks_with_workers)
        proc.send_signal(signal.SIGTERM)
        log = proc.communicate(timeout=60)[0]
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    assert proc.returncode == 143, log
    assert len(kids) >= 5 and _gone_soon(kids) == []  # torchrun, 2 ranks, their workers: all gone
    meta = json.loads((folder / "run.json").read_text())
    trials = pd.read_parquet(folder / "trials.parquet")
    assert meta["status"] == "interrupted" and trials["gpus"].tolist() == [1]
