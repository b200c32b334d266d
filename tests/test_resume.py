"""`pipeprof run --resume`: after a SIGTERM (or a kill -9) the same run folder is finished with only the
trials that were missing or did not end ok; the kept rows are not measured again; a different config or
machine is refused with exit 2, saying what differs."""

import json
import os
import shutil
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pandas as pd
import pytest

from pipeprof.cli import main

FLAKY = textwrap.dedent('''
    import pathlib

    from torch.utils.data import get_worker_info

    from pipeprof.checks.calibrate import BurnDataset

    DOWN = pathlib.Path(__file__).with_name("storage-down")


    class Flaky(BurnDataset):
        """2 ms of CPU a sample; in the training process (0 workers) reads fail while the file storage-down
        exists, as from a share that went away (the first reads work: pipeprof's check of the first sample
        and first batch of 4, and its probe of the sample's shape)."""
        calls = 0

        def __getitem__(self, index):
            Flaky.calls += 1
            if get_worker_info() is None and Flaky.calls > 5 and DOWN.exists():
                raise OSError("storage went away")
            return super().__getitem__(index)


    def make():
        return Flaky(256, 0.002)
''')
# the tests check which rows are kept and which run again, not a rate: two short windows a trial
QUICK = [
    "measure.warmup_s=0.2",
    "measure.warmup_max_s=1",
    "measure.redraws=10",
    "measure.window_s=0.3",
    "measure.windows=2",
    "measure.max_windows=2",
    "measure.window_batches=2",
    "measure.cpu_reference_s=0",
    "device=cpu",
    "stage_timing=false",
    "loader.batch_size=4",
    "model.threads=1",
]


def _args(sets: list[str]) -> list[str]:
    return [a for s in sets for a in ("--set", s)]


def _rows(folder: Path) -> int:
    try:
        return len(pd.read_parquet(folder / "trials.parquet"))
    except (OSError, ValueError):  # not written yet
        return 0


def _run(sets: list[str], env: dict, wait_rows: int, out: Path, sig: int) -> tuple[Path, subprocess.Popen]:
    """`pipeprof run` until ``wait_rows`` trials are saved (and, for SIGTERM, workers of the next one run),
    then ``sig`` to it (SIGKILL: to its whole session)."""
    import psutil

    proc = subprocess.Popen(
        [sys.executable, "-m", "pipeprof", "run", *_args(sets)],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,
    )
    deadline = time.monotonic() + 240
    try:
        while not (
            (folders := list(out.glob("r-*")))
            and _rows(folders[0]) >= wait_rows
            and (sig == signal.SIGKILL or len(psutil.Process(proc.pid).children()) >= 2)
        ):
            assert proc.poll() is None and time.monotonic() < deadline, proc.communicate()[0]
            time.sleep(0.05)
        if sig == signal.SIGKILL:
            os.killpg(proc.pid, signal.SIGKILL)
        else:
            proc.send_signal(sig)
        proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    return folders[0], proc


def _resume(sets: list[str], folder: Path, capsys) -> tuple[int, str]:
    """`pipeprof run --resume` in this process (no signal reaches it: an interpreter's start would add nothing):
    its exit status and what it printed."""
    code = main(["run", *_args(sets), "--resume", str(folder)])
    out, err = capsys.readouterr()
    return code, out + err


@pytest.mark.slow
def test_resume_after_sigterm_runs_the_missing_and_failed_trials_only_and_refuses_another_config(
    tmp_path, monkeypatch, capsys
):
    (tmp_path / "flaky.py").write_text(FLAKY)
    (tmp_path / "storage-down").touch()
    env, out = os.environ | {"PYTHONPATH": str(tmp_path)}, tmp_path / "out"
    sets = [
        f"out_dir={out}",
        "name=r",
        "data.kind=factory",
        "data.factory=flaky:make",
        "trials=[cpu_pipeline]",
        "loader.num_workers=[0,1,2]",
        *QUICK,
    ]
    folder, first = _run(sets, env, 2, out, signal.SIGTERM)  # w0 failed, w1 ok, w2 interrupted
    assert first.returncode == 143
    before = pd.read_parquet(folder / "trials.parquet").set_index("num_workers")
    assert before["status"].to_dict() == {0: "error", 1: "ok"} and "storage went away" in before.loc[0, "error"]
    (tmp_path / "storage-down").unlink()  # the share is back
    monkeypatch.syspath_prepend(str(tmp_path))  # flaky.py, as the run's PYTHONPATH had it
    code, printed = _resume(sets, folder, capsys)
    assert code == 0, printed
    after = pd.read_parquet(folder / "trials.parquet").set_index("num_workers")
    assert sorted(after.index) == [0, 1, 2] and (after["status"] == "ok").all()
    for col in ("samples_per_s", "t_measure_start_s", "trial_s"):  # the ok row was kept, not measured again
        assert after.loc[1, col] == before.loc[1, col]
    meta = json.loads((folder / "run.json").read_text())
    assert meta["status"] == "complete" and meta["analysis"]["trials"] == 3 and meta["analysis"]["failed_trials"] == 0
    (session,) = meta["resumed"]
    assert {k: session[k] for k in ("previous_status", "trials_kept", "trials_to_run_again")} == {
        "previous_status": "interrupted",
        "trials_kept": 1,
        "trials_to_run_again": 1,
    }
    # another config, or another machine: refused before anything runs, saying what differs
    assert main(["run", *_args([*sets, "loader.batch_size=8"]), "--resume", str(folder)]) == 2
    err = capsys.readouterr().err
    assert "cannot resume" in err and "loader.batch_size: [4] in the run, [8] now" in err
    moved = tmp_path / "moved"
    shutil.copytree(folder, moved)
    meta["machine"]["hostname"] = "elsewhere"
    (moved / "run.json").write_text(json.dumps(meta))
    assert main(["run", *_args(sets), "--resume", str(moved)]) == 2
    assert "the machine differs: hostname 'elsewhere' in the run" in capsys.readouterr().err
    assert len(pd.read_parquet(moved / "trials.parquet")) == 3  # nothing was run or written


@pytest.mark.slow
def test_resume_of_an_adaptive_run_after_kill_9_reuses_its_rows_in_the_search(tmp_path, capsys):
    out = tmp_path / "out"
    sets = [
        f"out_dir={out}",
        "name=r",
        "data.kind=factory",
        "data.factory=pipeprof.checks.calibrate:BurnDataset",
        "model.name=pipeprof.checks.calibrate:fixed_step_model_5ms",
        *QUICK,
    ]
    folder, _ = _run(sets, dict(os.environ), 2, out, signal.SIGKILL)
    before = pd.read_parquet(folder / "trials.parquet")
    assert json.loads((folder / "run.json").read_text())["status"] == "running" and len(before) >= 2
    code, printed = _resume(sets, folder, capsys)
    assert code == 0, printed
    after = pd.read_parquet(folder / "trials.parquet")
    meta = json.loads((folder / "run.json").read_text())
    assert meta["status"] == "complete" and meta["search"]["policy"] == "adaptive"
    assert meta["resumed"][0]["previous_status"] == "running" and meta["resumed"][0]["trials_kept"] == len(before)
    # the earlier rows, as they were, and no trial measured twice
    kept = after.set_index("trial_id").loc[before["trial_id"]]
    assert kept["t_measure_start_s"].tolist() == before["t_measure_start_s"].tolist()
    assert after["trial_id"].is_unique and len(after) > len(before) and (after["status"] == "ok").all()
    assert {"gpu_ceiling", "cpu_pipeline", "end_to_end"} <= set(after["kind"])
    assert meta["analysis"]["trials"] == len(after)


def test_resume_of_a_folder_that_is_not_a_run_exits_2(tmp_path, capsys):
    assert main(["run", "--set", "device=cpu", "--resume", str(tmp_path)]) == 2
    assert f"{tmp_path} is not a pipeprof run folder (no run.json)" in capsys.readouterr().err
