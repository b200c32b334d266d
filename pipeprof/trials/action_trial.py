"""Action trials: an end-to-end variant (or two) against its baseline, windows alternated in one trial.

An action (another decoder, uint8 batches normalised on the GPU, decode and augment on the GPU, the
data in RAM or in shards, the DataLoader's pinning, prefetch depth or persistent workers) is tried the
way the overhead checks are measured: both sides run in the same trial, on one step (one model, one
optimizer, one cuDNN cache), in ABBA windows (``measure.windows.rotating``), so the machine's slow
drift falls on both and the gain is read pair by pair with its 95% interval. Two variants share one
rotation, A1 B A2 | A2 B A1: each cycle's baseline window is paired with both, so two gains take three
windows a cycle instead of four, and one trial's start instead of two (the orchestrator tries a group's two
largest predicted gains so: a trial's start costs as much as several pairs of windows, docs/measured.md).

Each side is a :class:`Variant`: a loader of its own, opened at the start and kept running, and what
the training process does to its batches before the step. While one side is timed the other's workers
are stopped (``measure.loader.Pause``: SIGSTOP, then SIGCONT at its turn), so they take no core from the
side being timed. Each side is first run untimed on its own (the baseline while the variant is stopped,
a second variant likewise, then the first variant as the windows' warm-up), so a fresh worker's first batches
fall in no window. A stopped
side goes on where it was: its ready batches, and the half-made ones its workers had under way, were begun
in its own turn, as the end of any window leaves them in steady running, so they are no surplus to drain.
After each switch one worker round runs untimed (``drain``) for what the switch itself adds (the moments
between a window's end and the stop, caches the other side used), not the whole prefetch depth
(``pipeprof bench action-trials`` sets the sides' rates beside each side run on its own). Where workers
cannot be stopped (no SIGSTOP), the other side's last fills run on after a switch and the drain outlasts
them instead.

Which variants run, and how each is built from an action's entry, is ``trials.variants``; this module only
measures the sides it is given.
"""

from __future__ import annotations

import math
import time
from dataclasses import replace
from typing import Any, Callable, NamedTuple, Optional

import torch

from pipeprof.measure.loader import PAUSABLE, Pause, prefetch_depth, shutdown, worker_pids
from pipeprof.measure.windows import rotating, summarize_rates

from .columns import stage_columns
from .device_side import Plain
from .skeleton import make_step, open_loader
from .spec import TrialContext, TrialSpec

ACTION_KIND = "action"
TIMED_REGION = (
    "one or two end-to-end variants and their baseline on one step, each with its own running loader, "
    "in ABBA windows (two variants: A1 B A2 | A2 B A1 cycles, rotation_variants 2, rotated_with the other "
    "action, the cycle's baseline window paired with both; the monitor's samples under "
    "timeline_trial_id) (next(loader) + the training process's decode/augment if any + copy + step; "
    "windows closed by device sync); the side not timed has its workers stopped (SIGSTOP; paused_workers true); "
    "each side first runs untimed alone (its prefetch depth and one worker round; the variant's, the "
    "windows' warm-up, warmup_batches more); "
    "after each switch drain_batches run untimed (one worker round, for what the switch adds: a stopped "
    "side goes on where it was; without SIGSTOP, its prefetch depth and enough more rounds to outlast the "
    "other side's last fills, sized from one round of each side timed before the windows, a pace and "
    "not a figure); windows of at least measure.action_window_s, "
    "pairs (cycles) added until every variant's gain's 95% CI is within ± measure.ci_target, up to "
    "measure.action_max_pairs, and none started that would end past max_trial_s from the trial's start "
    "(the sides' loaders opened and started included; the orchestrator gives it what is left of "
    "measure.actions_max_s and measure.run_max_s); "
    "gain = variant / baseline - 1 per pair of windows, mean and 95% CI; "
    "samples_per_s is the variant's windows' median, baseline_samples_per_s the baseline's; "
    "[baseline_]stage_us_per_sample.* and worker_us_per_sample: each side's worker stage clocks (collate "
    "included) over its batches after warm-up, per sample"
)


class Variant(NamedTuple):
    """One side of an action trial: its loader's dataset, collate and knobs, and the training process's
    work on a batch before the step (a DeviceSide, or None)."""

    dataset: Any  # None: the user's own DataLoader (``loader``)
    collate: Optional[Callable]
    pin_memory: bool
    prefetch_factor: int
    feed: Any = None  # how its batches reach the step (trials.device_side: Plain, Serial, Overlapped); None: Plain
    loader: Optional[Callable[[int], Any]] = None  # fn(num_workers) -> the user's DataLoader, knobs applied
    knobs: dict = {}  # pipeprof's own DataLoader's other settings (persistent_workers, in_order ...)
    num_workers: Optional[int] = None  # None: the trial spec's; set: this side's own count (the answer's pair trial)
    threads: Optional[int] = None  # the step's intra-op threads in this side's turns (None: as the trial set them)


def _workers(spec: TrialSpec, v: Variant) -> int:
    return (v.num_workers if v.num_workers is not None else spec.num_workers) or 0


def _open(ctx: TrialContext, spec: TrialSpec, v: Variant):
    return open_loader(
        replace(ctx, prefetch_factor=v.prefetch_factor, user_loader=v.loader),
        replace(spec, pin_memory=v.pin_memory, num_workers=_workers(spec, v)),
        v.dataset,
        v.collate,
        v.knobs,
    )


def action_trial(ctx: TrialContext, spec: TrialSpec, base: Variant, alt: Variant) -> dict:
    """Variant (A) against baseline (B) at ``spec``'s settings: :func:`action_trials` of one variant (ABBA)."""
    return action_trials(ctx, spec, base, [alt])[0]


def action_trials(ctx: TrialContext, spec: TrialSpec, base: Variant, alts: list[Variant]) -> list[dict]:
    """One or two variants against the baseline at ``spec``'s settings (its model, batch and workers; the monitor
    tags its samples with ``spec``'s trial id), on one step, in one rotation of windows
    (``measure.windows.rotating``: A B B A for one variant; A1 B A2 | A2 B A1 for two, each cycle's baseline
    window shared, a third fewer windows than two trials and one start instead of two); the columns of each
    variant, in ``alts``' order (see the module). ``measure.max_trial_s`` bounds the whole trial, the sides'
    starts included (the orchestrator gives it what is left of the action budget)."""
    started = ctx.clock()
    step = make_step(ctx, spec)
    sides = [base, *alts]
    pf = max(v.prefetch_factor for v in sides)
    # sides of their own worker counts (the answer's pair trial): the drain and the rounds are the largest side's
    spec = replace(spec, num_workers=max(_workers(spec, v) for v in sides))
    depth = prefetch_depth(spec.num_workers or 0, pf)  # batches a side has dispatched when it is stopped
    its: dict = {}
    turns = None
    try:
        for k, v in enumerate(sides):
            its[k] = _open(ctx, spec, v)
        ctx.monitor.track_workers([pid for it in its.values() for pid in worker_pids(it)])
        turns = _Turns(sides, its, step, depth)
        drain = start_sides(turns.one, turns.switch, turns.pauses, spec, depth, pf, step.clock.sync, len(alts))
        rotated = rotating(
            turns.one,
            turns.switch,
            len(alts),
            action_policy(ctx.measure, depth),
            clock=ctx.clock,
            drain_batches=drain,
            batch_multiple=max(spec.num_workers or 1, 1),
            sync=step.clock.sync,
            on_phase=lambda p: _phase(ctx, spec, turns, p),
            half_width=ctx.measure.ci_target,
            started=started,
        )
    finally:
        _close(ctx, its, turns.pauses if turns is not None else {}, sides)
    clocks = turns.clocks
    shared = {"drain_batches": drain, "paused_workers": PAUSABLE, "rotation_variants": len(alts)} | clocks[0].columns(
        "baseline_"
    )
    return [
        paired_columns(rotated.paired(k), ctx.measure.max_trial_s, ctx.measure.ci_target)
        | _side_columns(v.feed.side if v.feed is not None else None)
        | shared
        | clocks[k].columns()
        for k, v in enumerate(alts, 1)
    ]


class _Turns:
    """The sides of an action trial taking turns on one step: ``switch(k)`` stops the workers of the side
    whose turn it was and continues side ``k``'s (each side's workers run only in its turn); ``one()`` runs a
    batch of the side whose turn it is (its training-process work, then the step), and adds it to that side's
    stage clocks once the windows are timed, leaving out the batches dispatched before its last stop."""

    def __init__(self, sides: list, its: dict, step, depth: int):
        self.sides, self.its, self.step, self.depth = sides, its, step, depth
        self.feeds = [v.feed or Plain() for v in sides]
        for k, f in enumerate(self.feeds):
            f.turn(k == 0)  # an overlapped GPU pipeline prepares batches only in its side's turn
        self.pauses = {k: Pause(it) for k, it in its.items()}
        self.clocks = [_StageSums(v.dataset) for v in sides]
        self.side, self.phase, self.unclocked = 0, "warmup", 0
        if sides[0].threads is not None:
            torch.set_num_threads(sides[0].threads)

    def switch(self, k: int) -> None:
        if k != self.side:
            self.pauses[self.side].stop()
            self.pauses[k].resume()
            # the batches dispatched before the stop (half-made ones among them): their clocks hold it
            # (and a producer thread's batches taken ahead: theirs too were under way at the stop)
            self.unclocked = self.depth + self.feeds[k].held if PAUSABLE else 0
            self.feeds[self.side].turn(False)
            self.feeds[k].turn(True)
        if self.sides[k].threads is not None:  # a side of its own worker count has the step threads the sweep gave it
            torch.set_num_threads(self.sides[k].threads)
        self.side = k

    def one(self) -> int:
        batch, _ = self.feeds[self.side].take(self.its[self.side], self.phase == "measure")
        if self.phase == "measure" and self.unclocked <= 0:
            self.clocks[self.side].add(batch)  # a GPU pipeline's batch keeps its workers' clocks beside the images
        self.unclocked -= 1
        self.step.run(batch["image"], batch["label"])
        return len(batch["label"])


def _close(ctx: TrialContext, its: dict, pauses: dict, sides: list) -> None:
    ctx.monitor.track_workers([])
    failed = None
    for side, it in its.items():  # every side closed, even after one failed to: the first failure is raised
        try:
            if side in pauses:  # a stopped worker cannot exit (nor hand a waiting producer thread its batch)
                pauses[side].resume()
            if sides[side].feed is not None:  # a producer thread stops before its loader
                sides[side].feed.close()
        except Exception as exc:  # noqa: BLE001 - raised after the other sides are closed
            failed = failed or exc
        finally:
            shutdown(it)
    if failed is not None:
        raise failed


class _StageSums:
    """One side's worker stage clocks (read, decode, each transform, collate) over the batches it ran after
    warm-up: what a sample cost its workers on each side, to set beside the prediction (which removed a share
    of the baseline's worker time). A stopped worker's wall clocks hold the stop, so the batches a side had
    dispatched when it was stopped (its prefetch depth: the ones under way among them) are left out. Nothing
    for a user's loader or a dataset without clocks."""

    def __init__(self, dataset):
        self.names = list(dataset.stage_names) if getattr(dataset, "stage_timing", False) else None
        self.sums, self.samples = None, 0

    def add(self, batch) -> None:
        stage = batch.get("stage_s") if self.names is not None and isinstance(batch, dict) else None
        if stage is None:
            return
        self.sums = stage.numpy() if self.sums is None else self.sums + stage.numpy()
        self.samples += len(batch["label"])

    def columns(self, prefix: str = "") -> dict:
        if self.sums is None or not self.samples:
            return {}
        cols = stage_columns(self.names, self.sums, self.samples)
        return {f"{prefix}{k}": v for k, v in cols.items() if k.startswith("stage_us_per_sample.")} | {
            f"{prefix}worker_us_per_sample": float(self.sums.sum()) / self.samples * 1e6
        }


def action_policy(measure, depth: int = 0):
    """The sweep's policy with the action trial's windows and pairs (``measure.action_*``): windows of at
    least ``action_window_s`` (4 sweep windows when unset), ``action_pairs`` pairs planned and up to
    ``action_max_pairs`` (and ``max_trial_s``) while the gain's 95% interval is wider than ± ``ci_target``;
    the variant's warm-up ``depth`` batches longer, as long as the baseline's start (``start_sides``)."""
    window_s = measure.action_window_s if measure.action_window_s is not None else 4 * measure.window_s
    return measure.model_copy(
        update={
            "warmup_batches": measure.warmup_batches + depth,
            "window_s": max(measure.window_s, window_s),
            "windows": 2 * measure.action_pairs,
            "max_windows": 2 * max(measure.action_max_pairs, measure.action_pairs),
        }
    )


def start_sides(one, switch, pauses: dict, spec: TrialSpec, depth: int, pf: int, sync, variants: int = 1) -> int:
    """Each side's start, untimed, and the batches to run untimed after each switch (returned).

    With SIGSTOP: the variants are stopped and the baseline runs its prefetch depth and one round (a fresh
    worker's first batches, made once), then a second variant the same; the first variant's own start is the
    windows' warm-up. After a switch,
    one round: a side stopped and continued goes on where it was (its ready and half-made batches begun in
    its own turn; the half-made ones' clocks hold the stop, which the stage sums leave out). Where workers
    cannot be stopped, every side starts here, each with one round timed after, and the drain is the prefetch depth
    and enough rounds to outlast another side's last fills (prefetch_factor batches per worker at its
    pace: the slowest side's time per batch over the fastest's)."""
    rounds = max(spec.num_workers or 1, 1)
    if PAUSABLE:
        for k in range(1, variants + 1):
            pauses[k].stop()  # the variants' workers wait (the baseline's turn)
        for k in [0, *range(2, variants + 1)]:
            switch(k)
            for _ in range(depth + rounds):
                one()
        return rounds
    per_batch = []
    for k in range(variants + 1):  # the baseline, then each variant: each started and timed once, untimed after
        switch(k)
        for _ in range(depth + rounds):
            one()
        sync()
        t0 = time.perf_counter()
        for _ in range(rounds):  # one whole round: the pace, not a measurement (the windows are that)
            one()
        sync()
        per_batch.append((time.perf_counter() - t0) / rounds)
    slower = max(per_batch) / max(min(per_batch), 1e-9)
    return depth + rounds * (math.ceil(pf * min(slower, 20.0)) + 1)  # 20x: a side that slow needs no finer drain


def _phase(ctx: TrialContext, spec: TrialSpec, turns: _Turns, p: str) -> None:
    turns.phase = p
    ctx.monitor.set_trial(spec.trial_id if p != "done" else None, p if p != "done" else None)


def _side_columns(side) -> dict:
    cols = side.columns(0.0) if side is not None else {}
    return {k: v for k, v in cols.items() if v is not None}  # no share: the windows alternate two pipelines


def paired_columns(paired, max_trial_s: float, ci_target: Optional[float] = None) -> dict:
    """The variant's and the baseline's rates, the gain per pair (variant / baseline - 1: the negative of
    ``Paired.cost``) with its 95% interval, and why the row is unstable when it is: fewer than 2 pairs, or
    the gain's interval wider than ± ``ci_target`` when the pairs ran out."""
    cost, windows = paired.cost(), paired.a + paired.b
    a, b = summarize_rates([w.rate for w in paired.a]), summarize_rates([w.rate for w in paired.b])
    reasons = paired.reasons(max_trial_s)
    half = (cost["cost_ci95_high"] - cost["cost_ci95_low"]) / 2 if cost["cost_ci95_low"] is not None else None
    if ci_target is not None and half is not None and half > ci_target:
        reasons.append(
            f"the gain's 95% interval is ±{half:.1%}, wider than ±{ci_target:.0%}, after {cost['pairs']} "
            f"pairs (max_trial_s {round(max_trial_s, 1):g} s or measure.action_max_pairs reached)"
        )
    flip = {
        "action_gain_frac": "cost_frac",
        "action_gain_ci95_low": "cost_ci95_high",
        "action_gain_ci95_high": "cost_ci95_low",
    }
    return (
        a
        | {k: (-cost[c] if cost[c] is not None else None) for k, c in flip.items()}
        | {
            "baseline_samples_per_s": b["samples_per_s"],
            "baseline_ci95_low": b["samples_per_s_ci95_low"],
            "baseline_ci95_high": b["samples_per_s_ci95_high"],
            "pairs": cost["pairs"],
            "windows": len(windows),
            "window_rates": [w.rate for w in paired.a],
            "baseline_window_rates": [w.rate for w in paired.b],
            "t_measure_start_s": min((w.t_start for w in windows), default=None),
            "t_measure_end_s": max((w.t_end for w in windows), default=None),
            "unstable": bool(reasons),
            "unstable_reason": "; ".join(reasons) or None,
        }
    )
