"""Every trial is bounded in time at 0 workers too: a dataset that blocks in the training process ends its
trial as `timeout` with the hung code's stack, and the sweep goes on; one that ends the process cannot be
contained, and the run folder then says the run did not finish."""

import json
import os
import subprocess
import sys
import textwrap
import threading
import time

import pandas as pd
import pytest
import torch
from torch.utils.data import Dataset, get_worker_info

import pipeprof
from conftest import session_alive
from pipeprof.cli import main
from pipeprof.orchestrate import sweep
from pipeprof.trials.watchdog import Abandoned, Leash

# short windows: these tests check what a hung or dying trial leaves, not a rate
QUICK = {
    "warmup_batches": 2,
    "warmup_s": 0.1,
    "warmup_max_s": 0.5,
    "redraws": 10,
    "window_s": 0.1,
    "window_batches": 2,
    "windows": 3,
    "max_windows": 3,
    "cpu_reference_s": 0,
}


class BlocksInMain(Dataset):
    """Samples that load in DataLoader workers, but block in the training process after the first batch (the
    check pipeprof makes of a user's dataset: its first batch of 4) until ``release`` is set: a 0-worker loader
    that hangs."""

    def __init__(self, release: threading.Event):
        self.release, self.calls = release, 0

    def __len__(self) -> int:
        return 64

    def __getitem__(self, index: int):
        self.calls += 1
        if get_worker_info() is None and self.calls > 4:
            self.release.wait()  # the hung call: its line must appear in the row's stack
        return torch.full((3, 8, 8), index % 256, dtype=torch.uint8), index % 4


@pytest.mark.one_core  # a time cap of 3 s on a dataset that blocks
def test_a_dataset_that_blocks_at_0_workers_is_a_timeout_row_with_its_stack_and_the_sweep_goes_on(
    tmp_path, monkeypatch
):
    monkeypatch.setattr(sweep, "SETUP_MARGIN_S", 1.0)  # the cap: max_trial_s 2 s + 1 s
    release = threading.Event()
    t0 = time.perf_counter()
    try:
        run = pipeprof.profile(
            BlocksInMain(release),
            trials=["cpu_pipeline"],
            num_workers=[0, 1],
            batch_size=4,
            device="cpu",
            out_dir=str(tmp_path),
            log=lambda *a: None,
            measure=QUICK | {"max_trial_s": 2.0},
        )
    finally:
        release.set()
    rows = run.trials.set_index("num_workers")
    hung, fine = rows.loc[0], rows.loc[1]
    assert hung["status"] == "timeout" and fine["status"] == "ok" and fine["samples_per_s"] > 0
    assert hung["error"].startswith("TrialTimeout: the trial ran past its time cap (3 s) and was abandoned")
    assert "in __getitem__" in hung["error"] and "self.release.wait()" in hung["error"]
    assert 3.0 <= hung["trial_s"] < 5.0 and time.perf_counter() - t0 < 60
    assert run.meta["status"] == "complete" and run.meta["analysis"]["failed_trials"] == 1
    saved = json.loads((run.path / "run.json").read_text())
    assert saved["status"] == "complete"
    # once cut off, the hung trial tagged no more monitor samples: its last comes before the next trial's first
    tl = run.timeline
    assert tl[tl["trial_id"] == hung["trial_id"]]["t_s"].max() < tl[tl["trial_id"] == fine["trial_id"]]["t_s"].min()
    # released, the abandoned thread stops at its next clock read instead of measuring on
    name, deadline = f"trial {hung['trial_id']}", time.monotonic() + 10
    while any(t.name == name for t in threading.enumerate()) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not any(t.name == name for t in threading.enumerate())


class _Monitor:
    def __init__(self):
        self.calls = []

    def set_trial(self, trial_id, phase=None):
        self.calls.append(("set_trial", trial_id, phase))

    def track_workers(self, pids):
        self.calls.append(("track_workers", list(pids)))

    def pause(self, paused):
        self.calls.append(("pause", paused))


def test_a_cut_leash_stops_the_clock_and_drops_the_monitor_calls_of_the_abandoned_thread():
    monitor = _Monitor()
    leash = Leash(monitor, lambda: 42.0)
    leash.set_trial("t", "measure")
    leash.track_workers([7])
    assert leash.clock() == 42.0
    leash.cut()  # the monitor is left as no trial holds it
    assert monitor.calls == [
        ("set_trial", "t", "measure"),
        ("track_workers", [7]),
        ("pause", False),
        ("set_trial", None, None),
        ("track_workers", []),
    ]
    with pytest.raises(Abandoned):
        leash.clock()
    with pytest.raises(Abandoned):
        leash.set_trial("t", "measure")
    leash.track_workers([8])  # from the thread's finally blocks: dropped, never raised
    leash.pause(True)
    assert len(monitor.calls) == 5


EXITS = textwrap.dedent('''
    import os

    import torch
    from torch.utils.data import Dataset, get_worker_info


    class ExitsInMain(Dataset):
        """Loads in DataLoader workers; in the training process, the first sample after the check of the
        first batch (4 samples) ends it."""
        calls = 0

        def __len__(self):
            return 64

        def __getitem__(self, index):
            ExitsInMain.calls += 1
            if get_worker_info() is None and ExitsInMain.calls > 4:
                os._exit(3)
            return torch.full((3, 8, 8), index % 256, dtype=torch.uint8), index % 4


    def make():
        return ExitsInMain()
''')


def test_a_dataset_that_ends_the_process_at_0_workers_leaves_a_folder_that_says_the_run_did_not_finish(tmp_path, capfd):
    (tmp_path / "exits.py").write_text(EXITS)
    out = tmp_path / "out"
    sets = [
        f"out_dir={out}",
        "name=x",
        "data.kind=factory",
        "data.factory=exits:make",
        "trials=[cpu_pipeline]",
        "loader.num_workers=[1,0]",
        "loader.batch_size=4",
        "device=cpu",
    ] + [f"measure.{k}={v}" for k, v in QUICK.items()]
    proc = subprocess.Popen(
        [sys.executable, "-m", "pipeprof", "run", *[a for s in sets for a in ("--set", s)]],
        env=os.environ | {"PYTHONPATH": str(tmp_path)},
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,
    )
    log = proc.communicate(timeout=300)[0]
    assert proc.returncode == 3, log  # the dataset's own exit status: nothing of pipeprof ran after it
    assert session_alive(proc.pid) == []  # the 1-worker trial's worker had stopped with its trial
    (folder,) = out.glob("x-*")
    meta = json.loads((folder / "run.json").read_text())
    trials = pd.read_parquet(folder / "trials.parquet")
    assert meta["status"] == "running" and trials["num_workers"].tolist() == [1] and trials["status"].tolist() == ["ok"]
    assert main(["report", str(folder)]) == 0
    report = capfd.readouterr().out
    assert "the run did not finish (status 'running': its process stopped without finishing" in report
    assert "1 trials done of 2 planned" in report
