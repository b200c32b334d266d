"""``pipeprof watch``: real training loops, written as users write them, run as real processes.

The loops use workloads of known cost (``checks.calibrate``): a dataset that burns a known CPU time per
sample and a model whose step sleeps a known time, so the side, the wait share and the worker count
are known in advance. One watched run is shared by several tests (module-scoped fixtures): the suite
runs on 2 cores.
"""

from __future__ import annotations

import os
import re
import statistics
import subprocess
import sys
import time
from pathlib import Path

import pandas as pd
import pytest

import pipeprof
from conftest import MEASURED, measured_once
from conftest import watch_job as _watch
from conftest import watch_run_folder as _run_folder
from pipeprof.checks.calibrate import BurnDataset, FixedStepModel
from pipeprof.cli import main
from pipeprof.watch.records import Batch, loader_row, windows

# the tests that read rates, wait shares, verdicts or intervals of watched runs are alone; the runs several tests
# read are measured once, under the exclusive lock (conftest)

# a sample waits READ_S for its bytes, then burns COST_S of CPU: one worker makes 125 samples/s with a
# eighth of a core, so 2 workers double it even when other processes hold one of this machine's 2 cores
READ_S, COST_S, STEP_S, BATCH = 0.007, 0.001, 0.04, 8
TRAIN_BATCHES = 192 // BATCH  # an epoch of TRAIN's training loader
KNOWN_WAIT = 1 - (1 / (READ_S + COST_S)) / (BATCH / STEP_S)  # 37.5%: with 1 worker the step waits that share

TRAIN = f"""
import sys
import time

import torch
from torch import nn
from torch.utils.data import DataLoader

from pipeprof.checks.calibrate import BurnDataset, FixedStepModel


class SlowStorage(BurnDataset):  # images that take {READ_S} s to read, then {COST_S} s of CPU to decode
    def __getitem__(self, index):
        time.sleep({READ_S})
        return super().__getitem__(index)


torch.set_num_threads(1)
train_set = SlowStorage(n=192, cost_s={COST_S})
val_set = BurnDataset(n=96, cost_s=0.0005)
train_loader = DataLoader(train_set, batch_size={BATCH}, shuffle=True, num_workers=1, persistent_workers=True)
val_loader = DataLoader(val_set, batch_size={BATCH}, num_workers=0)
model = FixedStepModel(step_s={STEP_S}, num_classes=10)
optimizer = torch.optim.SGD(model.parameters(), lr=0.01)

for epoch in range(int(sys.argv[1])):
    model.train()
    for images, labels in train_loader:
        loss = nn.functional.cross_entropy(model(images.float()), labels)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    model.eval()
    correct = 0
    with torch.no_grad():
        for images, labels in val_loader:
            correct += (model(images.float()).argmax(1) == labels).sum().item()
    print(f"epoch {{epoch}} val accuracy {{correct / len(val_set):.3f}}", flush=True)
"""

RAISES = """
import os

import torch
from torch import nn
from torch.utils.data import DataLoader

from pipeprof.checks.calibrate import BurnDataset, FixedStepModel

torch.set_num_threads(1)
print("site:", os.environ.get("USER_SITE_MARK"), flush=True)
loader = DataLoader(BurnDataset(n=4096, cost_s=0.0002), batch_size=8, num_workers=1)
model = FixedStepModel(step_s=0.2, num_classes=10)  # the hand-off of a batch (1-5 ms) is well below 5% of it
for step, (images, labels) in enumerate(loader):
    loss = nn.functional.cross_entropy(model(images.float()), labels)
    loss.backward()
    if step % 10 == 0:
        print(f"step {step} loss {loss.item():.4f}", flush=True)
    if step == 20:
        raise RuntimeError("loss diverged at step 20")
"""

DDP = """
import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel
from torch.utils.data import DataLoader, DistributedSampler

from pipeprof.checks.calibrate import BurnDataset, FixedStepModel

torch.set_num_threads(1)
dist.init_process_group("gloo")
rank = dist.get_rank()
dataset = BurnDataset(n=512, cost_s=0.004 if rank == 0 else 0.0002)  # rank 0 reads a slower shard
loader = DataLoader(dataset, batch_size=8, sampler=DistributedSampler(dataset), num_workers=0)
model = DistributedDataParallel(FixedStepModel(step_s=0.02, num_classes=10))
for step, (images, labels) in enumerate(loader):
    nn.functional.cross_entropy(model(images.float()), labels).backward()
    if step == 60:
        break
dist.barrier()  # no rank closes its connections while another still finishes its last all-reduce
dist.destroy_process_group()
"""


def _ranks_own_lines(stderr: bytes) -> str:
    """A failed job's stderr without torchrun's log lines (``E1202 11:27:05.707000 ...``), which fill the tail and
    leave out why a rank ended (once only "Signal 6 (SIGABRT) received by PID ..." reached CI's report)."""
    lines = stderr.decode(errors="replace").splitlines()
    return "\n".join(line for line in lines if not re.match(r"[EWI]\d{4} \d", line))[-3000:]


def _line_of(script: str, text: str) -> int:
    return next(i for i, line in enumerate(script.splitlines(), 1) if text in line)


# ---- an input-bound training loop with a validation loader, tuned, then stopped --------------------


class SlowStorage(BurnDataset):
    """The script's dataset, for the sweep: READ_S waiting for the bytes, then COST_S of CPU."""

    def __getitem__(self, index):
        time.sleep(READ_S)
        return super().__getitem__(index)


@pytest.fixture(scope="module")
def tuned(tmp_path_factory):
    def make(tmp):
        (tmp / "train.py").write_text(TRAIN)
        # the window is training batches, not seconds: the first epoch (24 batches) and 2 of the second take in
        # the whole validation pass between them at any speed (a 3 s window once ended 6 of its 12 batches in,
        # on a day the first epoch ran slow: no steady-state window for the validation loader)
        done = _watch(
            tmp,
            # a pause for the curve and the hand-off (the actions of this loader are test_watch_actions.py's)
            ["--steps", str(TRAIN_BATCHES + 2), "--tune", "--tune-max-s", "20", "--stop"],
            [sys.executable, "train.py", "1000"],
        )
        return done, _run_folder(tmp), (tmp / "watch.log").read_text()

    return measured_once("tuned", make, tmp_path_factory)


@pytest.fixture(scope="module")
def sweep_answer(tmp_path_factory):
    """num_workers as a pipeprof sweep of the same dataset and step finds it (end-to-end at 1 and 2)."""

    def make(tmp):
        # 125 vs 200 samples/s: short windows tell them apart
        run = pipeprof.profile(
            SlowStorage(192, COST_S),
            model=FixedStepModel(STEP_S, 10),
            batch_size=BATCH,
            num_workers=[1, 2],
            threads=1,
            trials=["end_to_end"],
            device="cpu",
            out_dir=str(tmp),
            log=lambda *a: None,
            measure={
                "window_s": 0.3,
                "windows": 2,
                "max_windows": 3,
                "warmup_max_s": 1.0,
                "redraws": 10,
                "cpu_reference_s": 0,
            },
        )
        return run.meta["analysis"]["groups"][0].workers

    return measured_once("sweep_answer", make, tmp_path_factory)


def _row(run, site: str, kind: str = "end_to_end") -> pd.Series:
    rows = run.trials[(run.trials["kind"] == kind) & (run.trials["loader"] == site)]
    assert len(rows) == 1, run.trials[["kind", "loader", "status"]]
    return rows.iloc[0]


def _verdict(run, trial_id: str) -> dict:
    return next(v for v in run.meta["analysis"]["verdicts"] if v["trial_id"] == trial_id)


@pytest.mark.alone
def test_input_bound_loop_waits_its_known_share(tuned):
    done, run, log = tuned
    train = _row(run, f"train.py:{_line_of(TRAIN, 'train_loader = DataLoader')}")
    assert train["status"] == "ok" and train["num_workers"] == 1 and train["mode"] == "train"
    assert _verdict(run, train["trial_id"])["side"] == "input", _verdict(run, train["trial_id"])
    # the step the hook timed is the model's known 40 ms (plus the loss and optimiser: about a millisecond)
    assert STEP_S * 1e3 <= train["compute_ms_p50"] <= STEP_S * 1e3 + 6
    # the wait share against the one the known step leaves at the measured rate: 1 - step x rate / batch
    rate = train["samples_measured"] / train["measured_s"]
    assert abs(train["data_wait_frac"] - (1 - STEP_S * rate / BATCH)) <= 0.05
    if train["foreign_cores_mean"] < 0.5:  # a worker delayed by other processes waits longer than designed
        assert abs(train["data_wait_frac"] - KNOWN_WAIT) <= 0.05, (train["data_wait_frac"], KNOWN_WAIT)


@pytest.mark.alone
def test_tune_pauses_once_and_recommends_what_a_sweep_finds(tuned, sweep_answer):
    done, run, log = tuned
    tune = run.meta["tune"]
    assert log.count("paused train.py") == 1 and f"after a pause of {tune['paused_s']:.1f} s" in log
    assert 1.0 < tune["paused_s"] < 40
    points = run.trials[run.trials["kind"] == "cpu_pipeline"].set_index("num_workers")["samples_per_s"]
    assert list(points.index) == [1, 2]  # the user's count, then the search's guess: step / rate per worker
    assert abs(points[1] - 125) / 125 < 0.15 and points[2] > 1.6 * points[1]  # the loader alone, as designed
    assert tune["recommended_workers"] == sweep_answer == 2, tune
    line = _line_of(TRAIN, "train_loader = DataLoader")
    assert tune["change"].endswith(f"train.py:{line}: num_workers=1 -> num_workers=2")
    check = tune["own_count_check"]  # the model beside the loop at its own count: 1 worker, measured both ways
    assert check["num_workers"] == 1 and check["watched_samples_per_s"] == _row(run, tune["loader"])["samples_per_s"]


def test_report_prints_a_watchs_own_answer_again(tuned, capsys, tmp_path):
    done, run, log = tuned
    capsys.readouterr()
    assert main(["report", str(run.path)]) == 0
    out = capsys.readouterr().out
    assert out.startswith("pipeprof watch: complete") and "  tune (train.py:" in out and "→ num_workers=2" in out
    assert main(["report", str(run.path), "--html", str(tmp_path / "again.html")]) == 0
    assert "pipeprof watch --" in (tmp_path / "again.html").read_text()  # the watch's section on the page again


@pytest.mark.alone
def test_train_and_validation_loaders_are_told_apart(tuned):
    done, run, log = tuned
    train_site = f"train.py:{_line_of(TRAIN, 'train_loader = DataLoader')}"
    val_site = f"train.py:{_line_of(TRAIN, 'val_loader = DataLoader')}"
    assert set(run.meta["loaders"]) == {train_site, val_site}
    assert run.meta["loaders"][val_site]["settings"]["num_workers"] == 0
    assert run.meta["loaders"][train_site]["settings"]["persistent_workers"] is True
    val = _row(run, val_site)
    assert val["status"] == "ok" and val["mode"] == "inference"
    # each loader its own verdict: the validation loop loads 0.5 ms a sample in the training process beside a
    # 40 ms step, so its step binds, while the training loader waits on its one worker (input side, above)
    assert _verdict(run, val["trial_id"])["side"] == "step", _verdict(run, val["trial_id"])


@pytest.mark.alone
def test_stop_ends_the_job_after_the_window_and_writes_the_run(tuned):
    done, run, log = tuned
    assert done.returncode == 130  # the job's own status: SIGINT, as a shell reports it
    assert run.meta["status"] == "complete" and run.meta["ended_by"] == "window"
    # the timed windows lie inside the watched window (after the first pass's warm-up), not past it: the first
    # epoch's 20 batches after its 4 of warm-up, at 64 ms a batch from the one worker (the second epoch's 2 are a
    # tail shorter than half a window, dropped)
    train = run.trials[(run.trials["kind"] == "end_to_end") & (run.trials["num_workers"] == 1)].iloc[0]
    assert 1.0 <= train["measured_s"] <= run.meta["window"]["watched_s"]
    assert run.meta["window"]["steps"] == TRAIN_BATCHES + 2
    assert "samples/s, data wait" in log  # the live line
    assert b"epoch 0 val accuracy" in done.stdout and b"pipeprof watch" not in done.stdout + done.stderr
    assert "pipeprof watch --" in (run.path / "report.html").read_text()


# ---- a step-bound loop that raises, with its own sitecustomize -----------------------------------


def _site_env(tmp: Path) -> dict:
    """The environment that runs train.py in ``tmp`` with the job's own sitecustomize."""
    return dict(os.environ, PYTHONPATH=str(tmp / "usersite"))


@pytest.fixture(scope="module")
def raised(tmp_path_factory):
    """The loop, watched (measured once: its step-bound verdict and rates are read), and its folder."""

    def make(tmp):
        (tmp / "train.py").write_text(RAISES)
        site = tmp / "usersite"
        site.mkdir()
        (site / "sitecustomize.py").write_text("import os\nos.environ['USER_SITE_MARK'] = 'chained'\n")
        watched = _watch(tmp, [], [sys.executable, "train.py"], _site_env(tmp))
        return watched, _run_folder(tmp), tmp

    return measured_once("raised", make, tmp_path_factory, MEASURED["raised"])


@pytest.fixture
def plain(raised):
    """The same loop, in the same folder, run plainly without pipeprof: its exit status and output, no timing."""
    tmp = raised[2]
    return subprocess.run([sys.executable, "train.py"], cwd=tmp, capture_output=True, timeout=120, env=_site_env(tmp))


# a 200 ms sleeping step, 0.2 ms of CPU a sample on one worker: the batch's hand-off (the step waits for it in
# next(loader)) is 3% of a 100 ms step on a slow day here, and its interval reached the 5% that makes it "balanced"
@pytest.mark.one_core
@pytest.mark.slow
def test_step_bound_loop(raised):
    watched, run, _ = raised
    row = run.trials[run.trials["kind"] == "end_to_end"].iloc[0]
    assert row["status"] == "ok" and _verdict(run, row["trial_id"])["side"] == "step"
    assert row["data_wait_frac"] < 0.05
    step = run.trials[run.trials["kind"] == "gpu_ceiling"].iloc[0]
    assert abs(step["samples_per_s"] - 8 / 0.2) / (8 / 0.2) < 0.1  # the step alone, from the loop


def test_a_job_that_raises_keeps_its_exit_status_and_what_was_seen(raised):
    watched, run, _ = raised
    assert watched.returncode == 1  # the job's own (its plain run's too: the next test)
    assert run.meta["status"] == "ended_early" and run.meta["ended_by"] == "command exited"
    exc = run.meta["exceptions"][0]
    line = _line_of(RAISES, "raise RuntimeError")
    assert exc["type"] == "RuntimeError" and "step 20" in exc["message"] and exc["where"].endswith(f"train.py:{line}")
    assert run.trials.loc[run.trials["kind"] == "end_to_end", "watched_batches"].iloc[0] == 21


# the one reader of ``plain`` (a second, while this one ran it, waited the 6-7 s with its core idle)
def test_output_and_exit_status_are_the_plain_runs_and_the_jobs_sitecustomize_still_runs(raised, plain):
    watched, run, _ = raised
    assert plain.returncode == watched.returncode == 1
    assert plain.stdout.startswith(b"site: chained\n")
    assert watched.stdout == plain.stdout and watched.stderr == plain.stderr


# ---- torchrun, two ranks -----------------------------------------------------------------------


# shared, not alone: its bounds hold at any speed. Rank 0 loads 32 ms of CPU a batch beside a 20 ms step (a wait
# share near 60%), rank 1 1.6 ms; load from a neighbour only lengthens rank 0's loading, and would have to make
# rank 1's 1.6 ms take 20 ms to close the 0.2 asked; a slower job only leaves the 1.5-s window more room.
@pytest.mark.slow
def test_torchrun_ranks_report_their_own_and_the_slowest_is_named(tmp_path):
    """Also: after the window the job runs on untouched (no --stop): the hooks are off, it ends as it would."""
    (tmp_path / "ddp.py").write_text(DDP)
    done = _watch(
        tmp_path,
        ["--seconds", "1.5"],
        [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "2", "--standalone", "ddp.py"],
    )
    assert done.returncode == 0, _ranks_own_lines(done.stderr)
    run = _run_folder(tmp_path)
    assert run.meta["ended_by"] == "window" and run.meta["exit_status"] == 0
    sent = pd.read_parquet(run.path / "batches.parquet").groupby("rank").size()
    assert sorted(sent.index) == [0, 1] and sent.max() < 61  # nothing recorded after the hooks went off
    rows = run.trials[run.trials["kind"] == "end_to_end"].set_index("rank")
    assert sorted(rows.index) == [0, 1] and (rows["world_size"] == 2).all()
    assert rows.loc[0, "data_wait_frac"] > rows.loc[1, "data_wait_frac"] + 0.2  # rank 0 loads 20x slower
    slowest = run.meta["analysis"]["loaders"][rows.loc[0, "loader"]]["slowest_rank"]
    assert slowest["rank"] == 0 and "rank 0 waits for data" in slowest["why"]


# ---- windows of known timing ---------------------------------------------------------------------


def test_windows_of_a_known_loop():
    """Batches every 100 ms of which 40 ms waiting; 2 workers, prefetch 2: the first 6 are warm-up."""
    batches = [Batch(1, 0.1 * i + 0.06, 0.1 * i + 0.1, 8, True, None) for i in range(40)]
    batches += [Batch(2, 10 + 0.1 * i + 0.06, 10 + 0.1 * i + 0.1, 8, True, None) for i in range(10)]
    wins = windows(batches, 0.5, 2, 6, 8)
    first, later = wins[:-1], wins[-1]
    assert [len(w.items) for w in first] == [6, 6, 6, 6, 10]  # whole rounds of 2, >= 0.5 s; the tail joins
    assert all(
        w.rate == pytest.approx(80) and w.wait_s / (w.t_end - w.t_start) == pytest.approx(0.4) for w in first
    )  # 8 samples per 100 ms, 40 ms of them waiting
    # the later pass starts at the call for its first batch: 10 batches in 0.94 s, 0.4 s of it waiting
    assert later.t_start == pytest.approx(10.06) and later.rate == pytest.approx(80 / 0.94)
    assert later.wait_s == pytest.approx(0.4)


def test_passes_shorter_than_half_a_window_are_joined_whole_without_the_time_between():
    """A small dataset: passes of 4 batches (each 100 ms, 40 of them waiting; a pass from its first call
    0.34 s), 2 s apart (a validation loop); window 1 s. Before, none of them made a window."""
    batches = [
        Batch(p, 2 * p + 0.1 * i + 0.06, 2 * p + 0.1 * i + 0.1, 8, True, None) for p in range(1, 9) for i in range(4)
    ]
    wins = windows(batches, 1.0, 1, 0, 8)
    assert [len(w.items) for w in wins] == [12, 12, 8]  # 3 passes reach 1.02 s; the last 2 (0.68 s) >= half
    for w in wins:
        passes = len(w.items) // 4
        assert w.span_s == pytest.approx(0.34 * passes) and w.gap_s == pytest.approx((2 - 0.34) * (passes - 1))
        assert w.rate == pytest.approx(32 * passes / (0.34 * passes)) and w.wait_s / w.span_s == pytest.approx(
            0.16 / 0.34
        )
        assert len(w.segments) == passes and sum(b - a for a, b in w.segments) == pytest.approx(w.span_s)
    assert [b.pass_no for b, _ in wins[0].items] == [1] * 4 + [2] * 4 + [3] * 4  # whole passes, in order


def test_the_watched_rate_is_the_loops_samples_over_its_time_with_an_interval_around_it():
    """Passes of 12 batches (a 50 ms wait, a 50 ms step) whose first batch waits 0.5 s more (workers that
    restart): a pass's first window is slow. The rate is what the loop's clock reads, not the windows' median,
    and inside its interval."""
    batches = []
    for p in range(1, 7):
        t = 10.0 * p
        for i in range(12):
            wait = 0.55 if i == 0 else 0.05  # then a 50 ms step
            batches.append(Batch(p, t, t + wait, 8, True, None))
            t += wait + 0.05
    wins = windows(batches, 0.25, 1, 0, 8)  # a pass: its first batch alone (14.5/s), then 3 of 80/s
    assert [len(w.items) for w in wins[:4]] == [1, 3, 3, 5]
    row = loader_row({"loader": "x", "rank": 0}, wins, len(batches), 0, 0.05)
    pooled = sum(w.samples for w in wins) / sum(w.span_s for w in wins)
    assert row["samples_per_s"] == pytest.approx(pooled) == pytest.approx(96 / 1.65)  # 1.1 s waiting, 11 steps
    assert row["samples_per_s_ci95_low"] < row["samples_per_s"] < row["samples_per_s_ci95_high"]
    assert statistics.median(row["window_rates"]) > row["samples_per_s_ci95_high"]  # what the median read before
    half = (row["samples_per_s_ci95_high"] - row["samples_per_s_ci95_low"]) / 2 / row["samples_per_s"]
    assert row["unstable_reason"].startswith(f"95% interval ±{half:.1%} of the rate")  # judged on what is reported


def test_the_pause_tunes_rank_0_of_the_loop_with_the_most_batches():
    """Rank 1 took a batch more than rank 0 of the training loop; a validation loader took fewer."""
    from pipeprof.watch.records import Store

    store = Store()
    for cid, rank in ((7, 1), (9, 0)):
        store.add(cid, {"k": "hello", "rank": rank, "pid": cid})
    one = [1, 0.0, 0.1, 8, True, None]
    store.add(7, {"k": "b", "d": [["train", *one]] * 11 + [["val", *one]] * 3})
    store.add(9, {"k": "b", "d": [["train", *one]] * 10})
    assert store.main_loader() == (9, "train")


def test_the_live_line_counts_the_loaders_own_workers_not_every_pid_seen():
    """A 1-worker loader whose worker restarts each pass (3 PIDs seen), on 2 ranks: 2 workers, not 6."""
    from types import SimpleNamespace

    from pipeprof.watch.live import line
    from pipeprof.watch.records import Store

    store = Store()
    for cid, rank in ((1, 0), (2, 1)):
        store.add(cid, {"k": "hello", "rank": rank, "pid": 100 + cid})
        store.add(cid, {"k": "loader", "label": "train", "settings": {"num_workers": 1}})
        store.add(cid, {"k": "b", "d": [["train", 1, 0.1 * i, 0.1 * i + 0.02, 8, True, None] for i in range(10)]})
        store.add(cid, {"k": "workers", "label": "train", "pids": [10 * cid + p for p in range(3)]})
    procs = SimpleNamespace(mean_pct=lambda pids, spans: 50.0)
    session = SimpleNamespace(store=store, monitor=None, procs=procs, t_start=0.0)
    (text,) = line(session, 0.0, 1.0)
    assert text.endswith("(2 workers)") and "160 samples/s" in text  # 2 ranks x 10 batches of 8 in 1 s


def test_the_pauses_own_workers_curve_and_action_sides_alike_are_the_jobs_processes():
    """Workers the pause starts for its curve and for an action's side belong to the training process that runs
    the pause (the monitor counts them as the job's, not as other processes); a loader's own are kept apart."""
    from pipeprof.watch.records import Store

    store = Store()
    store.add(1, {"k": "hello", "rank": 0, "pid": 100})
    store.add(1, {"k": "tune_workers", "workers": 2, "pids": [201, 202]})
    store.add(1, {"k": "tune_side_workers", "action": "uint8", "pids": [301, 302]})
    assert store.pids() == {100, 201, 202, 301, 302}
    assert store.parents() == dict.fromkeys([201, 202, 301, 302], 100)
    assert not store.workers  # no loader of the user's named them


def test_the_summary_says_a_figure_it_has_not_as_a_dash_without_a_unit():
    """A loader whose workers lived only inside each pass (a validation loader) has no workers' CPU: '–', not '–%'."""
    import pandas as pd

    from pipeprof.watch.live import _row_lines

    row = {"loader": "val.py:31", "rank": 0, "num_workers": 1, "batch_size": 128, "mode": "inference", "status": "ok"}
    row |= {"samples_per_s": 2755.0, "data_wait_frac": 0.26, "gpu_util_pct_mean": None}
    for cpu, words in ((float("nan"), "workers' CPU –"), (52.9, "workers' CPU 53%"), (5.02, "workers' CPU 5%")):
        head = _row_lines(pd.Series(row | {"workers_cpu_pct_mean": cpu}), {})[0]
        assert head.endswith(words) and "GPU –," in head
    # a loop without workers has no workers' CPU to show (the monitor's sum over none reads 0)
    assert _row_lines(pd.Series(row | {"num_workers": 0, "workers_cpu_pct_mean": 0.0}), {})[0].endswith("CPU –")
