"""``pipeprof bench action-trials``: action trials against each side run on its own, on workloads of known cost.

Samples that each wait a known wall time and use no CPU (``calibrate.WaitDataset``: a read of known
latency) on ``workers`` workers, and a step of known duration (``calibrate.FixedStepModel``): a side makes
about ``min(workers / wait, batch / step)`` samples/s (``calibrate.expected_rate``) on any machine, however busy
its cores; the main process's own handling of a batch comes on top of the step. Each case is a real action
trial (``trials.action_trial.action_trial``: two running loaders, the side not timed stopped, ABBA windows, a drain
after each switch), and beside it each side alone: the sweep's own ``end_to_end`` trial of it (one loader,
the same step, its warm-up and windows, no switch and no stop: ``continuous``), just before the trial and
just after it, averaged; then both cases' variants in one trial (``action_trials``: A1 B A2 | A2 B A1, the
baseline's windows shared), each against its own side and the baseline alone. Per variant it prints each
side's rate in the action trial against its continuous one (the error), the gain against the continuous rates' ratio
with the trial's 95% interval, the pairs, the trial's time, the spread of the per-pair gains, and the
model's known rates for scale.

What it checks: a drain too short for what a stopped side had under way would show as action-trial rates
above the continuous ones (a window starting with work done before it); a side whose stop leaves its queue
other than it runs, as a gain off the continuous one. The case ``to the step`` is that one: its variant is
capped by the step, so its queue is full when it is stopped, while the baseline's is empty.
"""

from __future__ import annotations

import statistics
import time
from dataclasses import replace
from typing import Callable

import pandas as pd
import torch

from pipeprof import config as C
from pipeprof.measure.confounders import torch_threads
from pipeprof.measure.monitors import Monitor
from pipeprof.trials import TrialContext, TrialSpec
from pipeprof.trials.action_trial import Variant, action_trial, action_trials
from pipeprof.trials.kinds import run_trial
from pipeprof.trials.skeleton import collate_user

from .calibrate import FixedStepModel, WaitDataset, expected_rate

BATCH, STEP_S = 8, 0.010  # the step caps a side at 800 samples/s
BASE_WAIT_S = 0.012
PF = 2  # prefetch_factor of the action trials' loaders, the sweep's default (the sides alone use ctx's)
CASES = {"faster input": 0.008, "to the step": 0.004}  # the variant's wait a sample
# windows of several worker rounds (a round of 4 workers is 96 ms on the baseline), pairs fixed so that the
# spread is read over the same count in every trial; the sides alone get 6-12 windows of the same length
MEASURE = {
    "warmup_batches": 2,
    "warmup_s": 0.2,
    "window_s": 0.5,
    "window_batches": 2,
    "windows": 6,
    "max_windows": 12,
    "ci_target": 0.05,
    "cpu_reference_s": 0,
    "max_trial_s": 60,
    "action_window_s": 0.5,
}


def bench_action_trials(
    workers: int = 4, pairs: int = 6, repeats: int = 2, log: Callable[[str], None] = print
) -> pd.DataFrame:
    """One row per variant: each case of :data:`CASES` in a trial of its own, then both in one rotation,
    ``repeats`` times; each side's rate on its own the mean of one run just before the trial and one just after
    (the machine's drift falls on both, as in A B B A)."""
    measure = C.MeasureConfig(**MEASURE, action_pairs=pairs, action_max_pairs=pairs)
    rows = []
    with Monitor(hz=10, gpu=False) as monitor, torch_threads(1):
        ctx = TrialContext(
            torch.device("cpu"),
            None,
            measure,
            monitor,
            num_classes=10,
            step_threads=1,
            models={"fixed": lambda: FixedStepModel(STEP_S, 10)},
        )
        for i in range(repeats):
            for case, wait_s in CASES.items():
                log(f"repeat {i + 1}/{repeats}: {case}")
                spec = TrialSpec(
                    "action",
                    num_workers=workers,
                    batch_size=BATCH,
                    model="fixed",
                    precision="fp32",
                    mode="train",
                    action=case,
                )
                sides = (WaitDataset(BASE_WAIT_S), WaitDataset(wait_s))
                before = {w: continuous(ctx, spec, d) for w, d in zip("ba", sides)}
                t0 = time.perf_counter()
                row = action_trial(ctx, spec, *(Variant(d, collate_user, False, PF) for d in sides))
                trial_s = time.perf_counter() - t0
                alone = {w: (before[w] + continuous(ctx, spec, d)) / 2 for w, d in zip("ab", reversed(sides))}
                rows.append(_row(case, i, workers, wait_s, row, trial_s, alone))
            rows += _rotation(ctx, spec, workers, i, log)
    return pd.DataFrame(rows)


def _rotation(ctx: TrialContext, spec: TrialSpec, workers: int, repeat: int, log) -> list[dict]:
    """Both cases' variants in one trial (``action_trials``: A1 B A2 | A2 B A1, the baseline's windows shared), each
    against its side and the baseline run on their own just before and just after: a row per variant."""
    log(f"repeat {repeat + 1}: both in one rotation")
    sides = [WaitDataset(BASE_WAIT_S), *(WaitDataset(w) for w in CASES.values())]
    before = [continuous(ctx, spec, d) for d in sides]
    t0 = time.perf_counter()
    got = action_trials(
        ctx, spec, Variant(sides[0], collate_user, False, PF), [Variant(d, collate_user, False, PF) for d in sides[1:]]
    )
    trial_s = time.perf_counter() - t0
    alone = [(b + continuous(ctx, spec, d)) / 2 for b, d in zip(before, sides)]
    return [
        _row(f"{case} (rotated)", repeat, workers, wait_s, row, trial_s, {"a": alone[k], "b": alone[0]})
        for k, ((case, wait_s), row) in enumerate(zip(CASES.items(), got), 1)
    ]


def continuous(ctx: TrialContext, spec: TrialSpec, dataset) -> float:
    """Samples/s of one side on its own: the sweep's own ``end_to_end`` trial of ``dataset`` at ``spec``'s
    settings (one loader feeding the same step, its warm-up, its windows; no switch, no stop)."""
    return run_trial(replace(ctx, user_dataset=dataset), replace(spec, kind="end_to_end", action=None))["samples_per_s"]


def _row(case: str, repeat: int, workers: int, wait_s: float, row: dict, trial_s: float, alone: dict) -> dict:
    gains = [a / b - 1 for a, b in zip(row["window_rates"], row["baseline_window_rates"])]
    lo, hi = row["action_gain_ci95_low"], row["action_gain_ci95_high"]
    gain = alone["a"] / alone["b"] - 1
    return {
        "case": case,
        "repeat": repeat + 1,
        "drain": row["drain_batches"],
        "pairs": row["pairs"],
        "trial_s": trial_s,
        "base_alone": alone["b"],
        "base": row["baseline_samples_per_s"],
        "base_err": row["baseline_samples_per_s"] / alone["b"] - 1,
        "alt_alone": alone["a"],
        "alt": row["samples_per_s"],
        "alt_err": row["samples_per_s"] / alone["a"] - 1,
        "gain_alone": gain,
        "gain": row["action_gain_frac"],
        "gain_lo": lo,
        "gain_hi": hi,
        "half_width": (hi - lo) / 2 if lo is not None else None,
        "pair_gain_sd": statistics.stdev(gains) if len(gains) > 1 else None,
        "inside": lo is not None and lo <= gain <= hi,
        "known_base": expected_rate(BASE_WAIT_S, workers, BATCH, STEP_S)[0],
        "known_alt": expected_rate(wait_s, workers, BATCH, STEP_S)[0],
    }


def render_action_trials(df: pd.DataFrame) -> str:
    def pct(v) -> str:
        return "-" if v is None or v != v else f"{v:+.1%}"

    out = df.assign(
        **{c: df[c].map(pct) for c in ("base_err", "alt_err", "gain_alone", "gain", "gain_lo", "gain_hi")},
        **{
            c: df[c].map(lambda v: f"{v:,.0f}")
            for c in ("base_alone", "base", "alt_alone", "alt", "known_base", "known_alt")
        },
        **{c: df[c].map(lambda v: "-" if v is None or v != v else f"{v:.1%}") for c in ("half_width", "pair_gain_sd")},
        trial_s=df["trial_s"].map(lambda v: f"{v:.1f}"),
    )
    summary = (
        f"\nside rates in the action trials against the same sides run on their own: "
        f"{df[['base_err', 'alt_err']].min().min():+.1%} to {df[['base_err', 'alt_err']].max().max():+.1%}; "
        f"the gain from the sides on their own inside the trial's interval in {int(df['inside'].sum())} of "
        f"{len(df)} trials; the interval's half-width {df['half_width'].min():.1%} to "
        f"{df['half_width'].max():.1%} after {int(df['pairs'].min())}-{int(df['pairs'].max())} pairs\n"
    )
    return out.to_string(index=False) + "\n" + summary
