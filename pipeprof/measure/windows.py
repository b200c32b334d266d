"""Steady-state measurement: warm-up excluded, timed windows, median with spread.

Why windows: a DataLoader's workers prefetch ``num_workers × prefetch_factor``
batches before the first ``next()``; a short run that starts the clock early
drains that queue and reports rates above the physical limit. So the loop first
runs a warm-up: never fewer batches than the prefetch depth plus a margin, then
short synchronised chunks until two in a row agree within ``settle_tol`` (cuDNN
autotuning, worker start-up and page-cache filling are over) or ``warmup_max_s``
passes. Then it times consecutive windows of a minimum duration (whole rounds of
the workers), each closed by a synchronisation: windows are set by time, not batch
counts, so a slow trial (one batch per second) is not made to run five per window. The figure is the
median window rate; the 95% confidence interval of the mean window rate says how
much to trust it. Windows adapt: after the planned number, a trial adds windows
(up to ``max_windows`` and its time cap) until the interval is within ``ci_target``
of the median, because on shared machines a fixed count is too few for some trials
and wasted on others.

The clock and the synchronisation are parameters, so tests drive this with
workloads of known cost and a fake clock.
"""

from __future__ import annotations

import statistics
import time
from dataclasses import dataclass, field
from typing import Callable, Optional

from pipeprof.stats import mean_ci95, rate_bounds, t95


@dataclass
class Window:
    t_start: float
    t_end: float
    samples: int
    batches: int

    @property
    def rate(self) -> float:
        return self.samples / (self.t_end - self.t_start)


@dataclass
class Measurement:
    windows: list[Window] = field(default_factory=list)
    warmup_batches: int = 0
    warmup_s: float = 0.0
    warmup_settled: Optional[bool] = None  # two warm-up chunks agreed (None: no chunk ran)
    t_measure_start: float = 0.0
    t_measure_end: float = 0.0
    unstable: bool = False
    reason: Optional[str] = None

    def rates(self) -> list[float]:
        return [w.rate for w in self.windows]

    def stats(self) -> dict:
        """Per-trial figures (samples/s median, mean, CV, 95% CI of the mean, min, max)."""
        return summarize_rates(self.rates()) | {
            # the rates themselves: the analysis re-draws them (bootstrap) for the answer's confidence
            "window_rates": self.rates(),
            "windows": len(self.windows),
            "batches_measured": sum(w.batches for w in self.windows),
            "samples_measured": sum(w.samples for w in self.windows),
            "measured_s": self.t_measure_end - self.t_measure_start,
            "t_measure_start_s": self.t_measure_start,
            "t_measure_end_s": self.t_measure_end,
            "warmup_batches": self.warmup_batches,
            "warmup_s": self.warmup_s,
            "warmup_settled": self.warmup_settled,
            "unstable": self.unstable,
            "unstable_reason": self.reason,
        }


def summarize_rates(rates: list[float]) -> dict:
    """Median, mean, CV (sample std / mean), 95% CI of the mean, min and max of window rates."""
    if not rates:
        return {
            k: None
            for k in (
                "samples_per_s",
                "samples_per_s_mean",
                "samples_per_s_cv",
                "samples_per_s_ci95_low",
                "samples_per_s_ci95_high",
                "samples_per_s_min",
                "samples_per_s_max",
            )
        }
    mean = statistics.fmean(rates)
    sd = statistics.stdev(rates) if len(rates) > 1 else 0.0
    t = t95(len(rates)) if len(rates) > 1 else 1.96
    half = t * sd / len(rates) ** 0.5
    low, high = rate_bounds(mean, half)  # a rate: multiplicative, never below 0 (stats' rule)
    return {
        "samples_per_s": statistics.median(rates),
        "samples_per_s_mean": mean,
        "samples_per_s_cv": sd / mean if mean else None,
        "samples_per_s_ci95_low": low,
        "samples_per_s_ci95_high": high,
        "samples_per_s_min": min(rates),
        "samples_per_s_max": max(rates),
    }


def ci_half_frac(rates: list[float]) -> Optional[float]:
    """Half-width of the 95% CI of the mean window rate, relative to the median (None below 2 windows)."""
    if len(rates) < 2:
        return None
    # the symmetric half-width (t sd / sqrt n), as the stability limits were set on it, not the log interval's
    return t95(len(rates)) * statistics.stdev(rates) / len(rates) ** 0.5 / statistics.median(rates)


def instability(rates: list[float], wanted: int, ci_limit: float, half: Optional[float] = None) -> Optional[str]:
    """Why these window rates should not be trusted, or None.

    Unstable: fewer windows than wanted, a 95% interval wider than ±``ci_limit`` of the median (``half``: the
    interval's relative half-width where the figure reported is not the windows' median, a watched loop's
    pooled rate), or a steady drift (every window one way by more than ``ci_limit`` overall).
    """
    if len(rates) < wanted:
        return f"only {len(rates)} of {wanted} windows fitted in the time limit"
    of = "of the median" if half is None else "of the rate"
    half = (ci_half_frac(rates) or 0.0) if half is None else half
    if half > ci_limit:
        cv = summarize_rates(rates)["samples_per_s_cv"] or 0.0
        return f"95% interval ±{half:.1%} {of} > ±{ci_limit:.0%} after {len(rates)} windows (CV {cv:.1%})"
    # a drift is a steady trend (heat, a filling cache), not noise: every step goes one way
    steps = [b - a for a, b in zip(rates, rates[1:])]
    change = (rates[-1] - rates[0]) / statistics.fmean(rates)
    if len(rates) >= 3 and abs(change) > ci_limit and (all(d > 0 for d in steps) or all(d < 0 for d in steps)):
        return f"rate drifts: {rates[0]:.4g} → {rates[-1]:.4g} samples/s from first to last window"
    return None


def steady_state(
    step: Callable[[], int],
    policy,
    *,
    min_warmup_batches: int = 0,
    batch_multiple: int = 1,
    clock: Callable[[], float] = time.perf_counter,
    sync: Callable[[], None] = lambda: None,
    on_phase: Callable[[str], None] = lambda phase: None,
) -> Measurement:
    """Run ``step`` (returns the samples it processed) through warm-up and timed windows.

    ``policy`` has warmup_batches, warmup_s, warmup_max_s, settle_tol, window_s, window_batches,
    windows, max_windows, max_trial_s and ci_target (see ``config.MeasureConfig``). The timed
    region of a window is from the sync that closed the previous window (or the warm-up) to the
    sync that closes this one: every step inside it, including data waits, counts.

    ``batch_multiple``: windows hold a whole number of this many batches. A
    DataLoader hands out batches round-robin over its ``w`` workers and returns
    them in order, so they arrive in bursts of up to ``w``; a window of k·w
    batches spans whole rounds and its rate does not depend on where a burst fell.
    """
    m = Measurement()
    on_phase("warmup")
    t0 = clock()
    warm = max(policy.warmup_batches, min_warmup_batches)
    _warm_up(step, policy, m, warm, clock, sync, batch_multiple)
    sync()
    m.t_measure_start = start = clock()
    m.warmup_s = start - t0
    on_phase("measure")
    while _more_windows(m, policy) and clock() - t0 < policy.max_trial_s:
        m.windows.append(window(step, clock, sync, start, policy.window_s, policy.window_batches, batch_multiple))
        start = m.windows[-1].t_end
    m.t_measure_end = start
    on_phase("done")
    m.reason = instability(m.rates(), policy.windows, policy.ci_target)
    if m.warmup_batches < warm:
        m.reason = f"warm-up cut short at {m.warmup_batches} of {warm} batches" + (f"; {m.reason}" if m.reason else "")
    m.unstable = m.reason is not None
    return m


def _warm_up(step, policy, m: Measurement, warm: int, clock, sync, multiple: int) -> None:
    """Untimed batches: first ``warm`` (the prefetched queue and a margin: those batches were made
    before the clock could see them), then synchronised chunks of half a window until two in a row
    agree within ``settle_tol`` and ``warmup_s`` has passed, or the cap (``warmup_max_s``, at most
    half of ``max_trial_s``) is reached. ``m.warmup_settled`` records which ended it."""
    t0 = clock()
    while m.warmup_batches < warm:
        step()
        m.warmup_batches += 1
        if clock() - t0 > policy.max_trial_s / 2:  # a step so slow that warm-up alone eats the budget
            return
    cap = min(policy.warmup_max_s, policy.max_trial_s / 2)  # 0: no settling (a planned one-pass trial)
    previous, agreed = None, False
    sync()
    while clock() - t0 < cap:
        chunk = window(step, clock, sync, clock(), policy.window_s / 2, 1, multiple)
        m.warmup_batches += chunk.batches
        agreed = previous is not None and abs(chunk.rate - previous) <= policy.settle_tol * max(chunk.rate, previous)
        if agreed and clock() - t0 >= policy.warmup_s:
            break
        previous = chunk.rate
    m.warmup_settled = agreed if cap > 0 else None


def _more_windows(m: Measurement, policy) -> bool:
    """The planned windows first; then more, up to ``max_windows``, while the interval is too wide."""
    n = len(m.windows)
    if n < policy.windows:
        return True
    return n < max(policy.max_windows, policy.windows) and (ci_half_frac(m.rates()) or 0.0) > policy.ci_target


def window(step, clock, sync, start: float, min_s: float, min_batches: int = 1, multiple: int = 1) -> Window:
    """Steps from ``start`` until ``min_s`` and ``min_batches`` are passed at a whole round of
    ``multiple`` batches, closed by ``sync``."""
    samples = batches = 0
    while batches < min_batches or clock() - start < min_s or batches % multiple:
        samples += step()
        batches += 1
    sync()
    return Window(start, clock(), samples, batches)


@dataclass
class Paired:
    """Windows of two settings measured in alternation (A B B A A B ...) on one running loader.

    ``a`` and ``b`` always hold the same number of windows (whole pairs). ``planned_pairs``: the
    pairs the policy asked for; ``time_capped``: ``max_trial_s`` stopped the pairs; warm-up ran
    ``warmup_batches`` of the ``warmup_wanted`` untimed batches (fewer: cut short by the cap).
    """

    a: list[Window] = field(default_factory=list)
    b: list[Window] = field(default_factory=list)
    planned_pairs: int = 0
    time_capped: bool = False
    warmup_batches: int = 0
    warmup_wanted: int = 0

    @staticmethod
    def plan(policy) -> tuple[int, int]:
        """Planned and most pairs: ``max(2, windows // 2)`` and ``max(planned, max_windows // 2)``."""
        planned = max(2, policy.windows // 2)
        return planned, max(planned, policy.max_windows // 2)

    def cost(self) -> dict:
        """Relative cost of A against B (1 - rate A / rate B) per pair of windows: mean and 95% CI.

        With fewer than 2 pairs the spread is unknown: the mean alone, the interval None.
        """
        costs = [1 - wa.rate / wb.rate for wa, wb in zip(self.a, self.b)]
        lo, hi = mean_ci95(costs)
        return {
            "cost_frac": statistics.fmean(costs) if costs else None,
            "cost_ci95_low": lo,
            "cost_ci95_high": hi,
            "pairs": len(costs),
        }

    def reasons(self, max_trial_s: float, what: str = "") -> list[str]:
        """Why the pairs cannot be trusted as planned: fewer than 2 (no spread), fewer than planned, or a
        warm-up the time cap cut short."""
        pairs, what = len(self.a), f"{what} " if what else ""
        if pairs < 2:
            return [
                f"only {pairs} pair{'' if pairs == 1 else 's'} of {what}windows fitted in max_trial_s "
                f"({round(max_trial_s, 1):g} s)"
            ] + self._warmup()
        short = (
            [
                f"only {pairs} of {self.planned_pairs} planned pairs of {what}windows fitted in max_trial_s "
                f"({round(max_trial_s, 1):g} s)"
            ]
            if pairs < self.planned_pairs
            else []
        )
        return short + self._warmup()

    def _warmup(self) -> list[str]:
        return (
            [f"warm-up cut short at {self.warmup_batches} of {self.warmup_wanted} batches"]
            if self.warmup_batches < self.warmup_wanted
            else []
        )


@dataclass
class Rotated:
    """Windows of a baseline (side 0) and one or two variants (sides 1 and 2) measured in rotation, one cycle
    after another: one variant A B | B A | A B ... (ABBA); two A1 B A2 | A2 B A1 | A1 B A2 ... Each variant's
    window is next to its cycle's baseline window, before it in one cycle and after it in the next, so a steady
    drift cancels over two cycles as in ABBA; with two variants the baseline window is shared (three windows for
    two pairs, not four), and a cycle begins on the side the last one ended on (no switch, no drain there).

    ``cycles``: whole cycles, each a dict side -> its window. ``planned_pairs``: the cycles the policy asked
    for; ``time_capped``: ``max_trial_s`` stopped them; warm-up ran ``warmup_batches`` of the ``warmup_wanted``
    untimed batches (fewer: cut short by the cap). ``side``: the side the last window ran on (warm-up: the first
    cycle's first)."""

    variants: int
    cycles: list[dict[int, Window]] = field(default_factory=list)
    planned_pairs: int = 0
    time_capped: bool = False
    side: Optional[int] = None
    warmup_batches: int = 0
    warmup_wanted: int = 0

    def __post_init__(self):
        if self.variants not in (1, 2):
            raise ValueError(f"a rotation has one or two variants beside its baseline, not {self.variants}")

    def order(self, cycle: int) -> list[int]:
        """The sides of cycle ``cycle`` (from 0) in the order they run."""
        first = [1, 0] if self.variants == 1 else [1, 0, 2]
        return first if cycle % 2 == 0 else first[::-1]

    def paired(self, variant: int = 1) -> Paired:
        """``variant``'s windows against the baseline's, pair by pair (the baseline window of its cycle)."""
        return Paired(
            a=[c[variant] for c in self.cycles],
            b=[c[0] for c in self.cycles],
            planned_pairs=self.planned_pairs,
            time_capped=self.time_capped,
            warmup_batches=self.warmup_batches,
            warmup_wanted=self.warmup_wanted,
        )


def alternating(step: Callable[[], int], set_mode: Callable[[bool], None], policy, **kw) -> Paired:
    """Warm up, then time windows with ``set_mode(True)`` (A) and ``set_mode(False)`` (B) in ABBA order: a
    :func:`rotating` of one variant (A) against its baseline (B); ``kw`` as there."""
    return rotating(step, lambda side: set_mode(side == 1), 1, policy, **kw).paired(1)


def rotating(
    step: Callable[[], int],
    set_side: Callable[[int], None],
    variants: int,
    policy,
    *,
    drain_batches: int,
    batch_multiple: int = 1,
    clock: Callable[[], float] = time.perf_counter,
    on_phase: Callable[[str], None] = lambda phase: None,
    sync: Callable[[], None] = lambda: None,
    half_width: Optional[float] = None,
    started: Optional[float] = None,
    rate_half: Optional[float] = None,
) -> Rotated:
    """Warm up, then time the windows of a baseline (``set_side(0)``) and ``variants`` variants (``set_side(1)``,
    ``set_side(2)``) in cycles (:class:`Rotated`: ABBA with one variant).

    After each switch ``drain_batches`` batches are run untimed: a loader's workers have that
    many batches in flight, made under the previous side. A window on the side of the one before it
    (the middle of A B B A) follows no switch and needs no drain: half the drains of draining before
    every window, so more pairs fit the same time. Alternating on one step at one
    setting cancels the machine's slow drift, which separate trials would mix into the
    difference. ``sync`` closes each window (a device step's queued work counts in its window).
    ``max(2, windows // 2)`` cycles are planned; more are added, up to
    ``max_windows // 2``, while any variant's 95% half-width of its cost is wider than ``half_width`` (default
    ``ci_target / 2``: an overhead is read against a rate that itself has ± ``ci_target``), and where
    ``rate_half`` is given, while the baseline's own rate has a 95% half-width wider than that fraction of it, up
    to ``max_windows`` cycles (a trial whose baseline rate is itself a bound, read against rates measured apart
    from it: the costs' pairs cancel the drift between its sides, its rate's windows do not).

    ``max_trial_s`` bounds it all: warm-up stops at half of it; a new cycle starts only while the
    time left is at least what the previous cycle took, and a cycle's next window only before the
    cap (an unfinished cycle is dropped), so the cap is passed by at most one window (and its drain).
    ``started``: the trial's start on ``clock`` (default: now), from which ``max_trial_s`` counts, so that a
    caller's own untimed start before the windows falls inside the cap (an action trial opens and starts a
    loader per side, long enough that a cap counted from the first window was overrun by it: docs/measured.md).
    """
    on_phase("warmup")
    t_warm = clock()
    t0 = t_warm if started is None else started
    r = Rotated(variants, planned_pairs=Paired.plan(policy)[0], warmup_wanted=policy.warmup_batches + drain_batches)
    r.side = r.order(0)[0]
    set_side(r.side)
    _paired_warmup(step, policy, r, clock, t_warm, t0)
    on_phase("measure")
    half = policy.ci_target / 2 if half_width is None else half_width
    _cycles(
        lambda: _one_cycle(step, set_side, policy, r, clock, t0, drain_batches, batch_multiple, sync),
        policy,
        r,
        clock,
        t0,
        half,
        rate_half,
    )
    on_phase("done")
    return r


def _cycles(
    one_cycle: Callable[[], Optional[dict[int, Window]]],
    policy,
    r: Rotated,
    clock,
    t0: float,
    half: float,
    rate_half: Optional[float] = None,
) -> None:
    """Append cycles to ``r`` while more are wanted and the time left is at least what the previous one took."""
    last_cycle_s = 0.0
    while _more_cycles(r, policy, half, rate_half):
        t_cycle = clock()
        left = policy.max_trial_s - (t_cycle - t0)
        done = one_cycle() if left > 0 and left >= last_cycle_s else None
        if done is None:
            r.time_capped = True
            return
        r.cycles.append(done)
        last_cycle_s = clock() - t_cycle


def _paired_warmup(step, policy, p: Rotated, clock, t_warm: float, t0: float) -> None:
    """``warmup_s`` from the warm-up's own start ``t_warm``; stopped past half of ``max_trial_s`` from ``t0``."""
    while p.warmup_batches < p.warmup_wanted or clock() - t_warm < policy.warmup_s:
        step()
        p.warmup_batches += 1
        if clock() - t0 > policy.max_trial_s / 2:  # a step so slow that warm-up alone eats the budget
            break


def _one_cycle(
    step, set_side, policy, r: Rotated, clock, t0: float, drain_batches: int, batch_multiple: int, sync=lambda: None
) -> Optional[dict[int, Window]]:
    """The next cycle's windows by side; None when the cap came before its last window."""
    done: dict[int, Window] = {}
    for side in r.order(len(r.cycles)):
        if done and clock() - t0 >= policy.max_trial_s:
            return None  # no time for this cycle's next window
        set_side(side)
        for _ in range(drain_batches if side != r.side else 0):
            step()
        r.side = side
        sync()  # the drained batches' device work is not the window's
        done[side] = window(step, clock, sync, clock(), policy.window_s, policy.window_batches, batch_multiple)
    return done


def _more_cycles(r: Rotated, policy, half_width: float, rate_half: Optional[float] = None) -> bool:
    """The planned cycles first; then more, up to the most, while a variant's cost half-width > ``half_width``
    or (``rate_half`` given) the baseline rate's relative half-width > ``rate_half``: for that rate, up to
    ``max_windows`` cycles, its windows as many as a trial's (one a cycle; a variant's pairs are two windows)."""
    planned, most = Paired.plan(policy)
    n = len(r.cycles)
    if n < planned:
        return True
    wide = rate_half is not None and (ci_half_frac([c[0].rate for c in r.cycles]) or 0.0) > rate_half
    if wide and n < max(most, policy.max_windows):
        return True
    if n >= most:
        return False
    for v in range(1, r.variants + 1):
        c = r.paired(v).cost()
        if c["cost_ci95_low"] is None or (c["cost_ci95_high"] - c["cost_ci95_low"]) / 2 > half_width:
            return True
    return False
