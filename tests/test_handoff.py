"""The hand-off limit is measured: the ``handoff`` trial against a hand-written loop over the same batches.

Samples are large float images built once (3 x 224 x 224 float32, 602 KB each) with no work per sample,
so what is left of loading is the loader's hand-off: collate in the workers, then receive and unpickle
in the main process. A plain DataLoader loop over the same samples, batch and workers passes batches
at a rate the trial must reproduce (not shown to be more than 10% off); the two are run alternately to share
the machine's drift.
"""

import statistics

import pytest
import torch
from torch.utils.data import DataLoader, Dataset

import pipeprof
from pipeprof.checks.calibrate import FixedStepModel
from pipeprof.config import MeasureConfig
from pipeprof.measure.loader import shutdown
from pipeprof.measure.windows import steady_state
from pipeprof.stats import mean_ci95

# a trial's rate against a hand-timed loop's (conftest), both on one worker: on one core they share it alike
pytestmark = pytest.mark.one_core

BATCH, WORKERS = 32, 1
MEASURE = {"warmup_batches": 6, "warmup_s": 0.3, "warmup_max_s": 2, "window_batches": 3}  # both sides' warm-up


class BigFloats(Dataset):
    """The same 602 KB float image for every index: no per-sample work."""

    def __init__(self, n: int = 200_000):
        self.n, self.image = n, torch.rand(3, 224, 224)

    def __len__(self):
        return self.n

    def __getitem__(self, i):
        return self.image, 0


def hand_loop(windows: int = 5, seconds: float = 0.5) -> float:
    """Samples/s a plain DataLoader loop passes, timed as the trial times its own loader
    (``measure.windows.steady_state`` with the trial's policy: 6 batches, then until two half-windows agree
    within 15%, at least 0.3 s; the median of its windows). Not the trial's loader, dataset or counting: those
    are what is checked. Timed after 6 batches and no settling, as it was, the trial read 10.5% and 11.9% above
    it in the two failures seen (full suite runs, one a fresh clone's), where the trial's windows follow a
    settled warm-up: the same warm-up on both sides takes that difference out of the comparison."""
    policy = MeasureConfig(**MEASURE, windows=windows, max_windows=windows, window_s=seconds)
    it = iter(DataLoader(BigFloats(), batch_size=BATCH, num_workers=WORKERS))
    try:
        return steady_state(lambda: len(next(it)[0]), policy).stats()["samples_per_s"]
    finally:
        shutdown(it)  # its worker ends now, not at the next collection


def handoff_trial(tmp_path) -> dict:
    run = pipeprof.profile(
        BigFloats(),
        model=FixedStepModel(0.001),
        batch_size=BATCH,
        num_workers=[WORKERS],
        trials=["handoff"],
        measure=MEASURE | {"window_s": 0.5, "windows": 5, "max_windows": 5, "cpu_reference_s": 0},
        out_dir=str(tmp_path),
        threads=1,
        device="cpu",
        log=lambda *a: None,
        config={"loader": {"pin_memory": False}},
    )
    (row,) = run.trials.to_dict("records")
    return row


# 14-30 s (two to three rounds): slow, so it starts early in the lanes, not as their tail
@pytest.mark.slow
def test_the_handoff_trial_measures_what_a_hand_written_loop_passes(tmp_path):
    hand, trial = [], []
    # untimed first: the first loader of a fresh process (this test once ran early in a test worker's life)
    # pays for its first worker start and shared-memory pages; it once read 1,988 against the trial's 2,850
    hand_loop(windows=2, seconds=0.1)
    # A B B A: the machine's drift falls on both; each trial is read against the hand loop beside it (two ratios a
    # round). On this 2-core machine each side's 5 windows of 0.5 s move about 10% from one measurement to the
    # next (a round's ratios ranged 0.90-1.12 in a quiet minute; on a busy day a hand loop read 1,484 where the
    # one a trial before it read 2,158), so a 10% bound on 2-3 rounds failed on noise alone in fresh clones'
    # suites, once 12% below and once 10% above. Rounds follow while the ratios so far average more than 7% off,
    # up to three; then the trial must not be shown off by more than 10% (the ratios' 95% interval reaches
    # 0.90-1.10, as the analysis calls two rates the same) and its mean must be within 15%: a trial off by more
    # than 15% fails, one off by 10-15% only where its ratios are steady enough to show it
    ratios = []
    for i in range(6):
        if i % 2 == 0:
            hand.append(hand_loop())
        row = handoff_trial(tmp_path / str(i))
        assert row["status"] == "ok" and row["kind"] == "handoff"
        trial.append(row["samples_per_s"])
        if i % 2 == 1:
            hand.append(hand_loop())
            ratios += [trial[-2] / hand[-2], trial[-1] / hand[-1]]
            if abs(statistics.mean(ratios) - 1) <= 0.07:
                break
    low, high = mean_ci95(ratios)
    assert abs(statistics.mean(ratios) - 1) <= 0.15 and low <= 1.10 and high >= 0.90, (hand, trial)
    assert row["sample_kb"] == pytest.approx(3 * 224 * 224 * 4 / 1e3)
    assert len(row["window_rates"]) == row["windows"] == 5
