"""Recommendations from the measured curves: workers, cores per GPU, what-if, and the measured overheads (a paired
cost's or gain's interval by the rule of ratios: ``stats.gain_bounds``, ``stats.cost_bounds``).

The actions and their predicted gains are ``pipeprof.actions`` and ``analysis.gains``."""

from __future__ import annotations

import math
from itertools import product
from typing import NamedTuple

import numpy as np
import pandas as pd

from pipeprof.stats import cost_bounds

from .bounds import BALANCED, NEAR_BEST

TIE_FLOOR = 0.90  # a count below 90% of the best is never called tied with it, whatever its interval

# ---- recommendations ---------------------------------------------------------------


def recommend_workers(curve: pd.DataFrame, near: float = NEAR_BEST) -> dict:
    """Smallest ``num_workers`` not shown to be slower than the best: within ``near`` of the best
    rate, or within ``TIE_FLOOR`` of it with a 95% interval that overlaps the best's (one count
    beats another only when their intervals separate).

    ``curve`` has columns num_workers and samples_per_s (one row per count), and the
    ``samples_per_s_ci95_low/high`` of each trial when they were measured.
    """
    curve = curve.sort_values("num_workers")
    rate = curve["samples_per_s"]
    top = curve.loc[rate.idxmax()]
    high = curve["samples_per_s_ci95_high"].fillna(rate) if "samples_per_s_ci95_high" in curve else rate
    top_low = top.get("samples_per_s_ci95_low", top["samples_per_s"])
    top_low = top["samples_per_s"] if top_low != top_low else top_low
    # overlapping intervals tie only nearby counts: a wide interval far below is not evidence of a tie
    tied = curve[
        (rate >= near * top["samples_per_s"]) | ((high >= top_low) & (rate >= TIE_FLOOR * top["samples_per_s"]))
    ]
    pick = tied.iloc[0]
    return {
        "recommended_workers": int(pick["num_workers"]),
        "recommended_samples_per_s": float(pick["samples_per_s"]),
        "best_workers": int(top["num_workers"]),
        "best_samples_per_s": float(top["samples_per_s"]),
        "tied_with_best": [int(w) for w in tied["num_workers"]],
        "criterion": f"smallest num_workers within {1 - near:.0%} of the best end-to-end rate, or within "
        f"{1 - TIE_FLOOR:.0%} and not separable from it (95% intervals overlap)",
    }


class CurveRead(NamedTuple):
    """A value read off the measured CPU curve, and whether it lies past the measured points."""

    value: float
    extrapolated: bool


def _envelope(ws: np.ndarray, rates: np.ndarray, cores: float) -> tuple[np.ndarray, np.ndarray]:
    """Worker counts from 0 with the best rate reached at or below each: with C cores a user can
    pick any count up to C, and 0 workers (loading in the main process) is not on this line.
    Counts past the machine's cores measured oversubscription, not more cores: left out."""
    pos = (ws > 0) & (ws <= max(cores, 1))
    if not pos.any():
        pos = ws > 0
    return np.concatenate([[0.0], ws[pos]]), np.concatenate([[0.0], np.maximum.accumulate(rates[pos])])


def _per_worker_at_top(x: np.ndarray, y: np.ndarray) -> tuple[float, float]:
    """(workers, samples/s per worker) at the curve's largest count: the base for extrapolating to a
    bigger machine of the same CPUs."""
    return float(x[-1]), float(y[-1]) / float(x[-1])


def rate_at_workers(
    workers: float, ws: np.ndarray, rates: np.ndarray, cores: float, cap: float = math.inf
) -> CurveRead:
    """Pipeline samples/s with ``workers``: interpolated on the curve, extrapolated past its end at
    the per-worker rate of its largest point, and never above the hand-off limit ``cap``."""
    x, y = _envelope(ws, rates, cores)
    if len(x) < 2:
        return CurveRead(float("nan"), True)
    if workers <= x[-1]:
        return CurveRead(min(float(np.interp(max(workers, 0.0), x, y)), cap), False)
    return CurveRead(min(workers * _per_worker_at_top(x, y)[1], cap), True)


def workers_for_rate(
    target: float, ws: np.ndarray, rates: np.ndarray, cores: float, cap: float = math.inf
) -> CurveRead:
    """Fewest (fractional) workers whose pipeline rate reaches ``target``: the inverse of
    :func:`rate_at_workers`; inf when ``target`` is above the hand-off limit ``cap``."""
    x, y = _envelope(ws, rates, cores)
    if len(x) < 2:
        return CurveRead(float("nan"), True)
    if target > cap:
        return CurveRead(math.inf, True)
    if target > y[-1]:
        return CurveRead(target / _per_worker_at_top(x, y)[1], True)
    i = int(np.argmax(y >= target))
    frac = (target - y[i - 1]) / (y[i] - y[i - 1]) if i and y[i] > y[i - 1] else 1.0
    return CurveRead(float(x[i - 1] + frac * (x[i] - x[i - 1])) if i else 0.0, False)


def rate_for_cores(
    cores_avail: float, ws: np.ndarray, rates: np.ndarray, main_s: float, cores: float, cap: float = math.inf
) -> CurveRead:
    """Pipeline samples/s with ``cores_avail`` cores, the training process taking ``main_s`` CPU
    seconds per sample: the workers get what it leaves, and it takes more the faster they feed it,
    so the rate is the fixed point r = curve(cores_avail - main_s * r), found by bisection."""

    def at(r: float) -> CurveRead:
        return rate_at_workers(max(cores_avail - main_s * r, 0.0), ws, rates, cores, cap)

    top = at(0.0)
    if not top.value == top.value:
        return top
    lo, hi = 0.0, top.value
    for _ in range(60):
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if at(mid).value >= mid else (lo, mid)
    return CurveRead(lo, at(lo).extrapolated)


def cores_needed(
    step_rate: float,
    ws: np.ndarray,
    rates: np.ndarray,
    main_s: float,
    cores: float,
    cap: float = math.inf,
    cap_low: float | None = None,
) -> dict:
    """Cores one GPU needs to be fed at its ceiling: workers read off the measured CPU curve
    (interpolated, or extrapolated past its end) plus the training process's CPU at that rate.

    ``cap`` (``cap_low``): the upper (lower) end of the hand-off limit's measured interval. All of it
    clearly below the ceiling (by more than 2 x BALANCED): no core count reaches it (None, and the cores
    that reach 95% of the limit). Straddling the ceiling, or just below it: the count is given and the basis
    says that the hand-off may stop short of it (``handoff_straddles``), so the answer does not flip between
    the two as the limit's windows move."""
    # a hand-off limit within 2 x BALANCED below the step is not shown to stop it (the bare hand-off
    # and the real loader differ by about that): the count is given, with the caveat
    straddles = (1 - 2 * BALANCED) * step_rate <= cap and min(cap_low or cap, cap) < step_rate
    need = workers_for_rate(step_rate, ws, rates, cores, math.inf if straddles else cap)
    measured = "" if cap_low is None else f" (measured by the handoff trial: {cap_low:,.0f}-{cap:,.0f})"
    if need.value == math.inf:
        near = workers_for_rate(NEAR_BEST * cap, ws, rates, cores)
        at = math.ceil(near.value + main_s * cap)
        return {
            "cores_needed": None,
            "workers_needed": None,
            "extrapolated": True,
            "handoff_limit": cap,
            "cores_to_handoff_limit": at,
            "basis": f"not reachable by adding cores: the loader's hand-off passes at most {cap:,.0f} "
            f"samples/s{measured}, below the step's {step_rate:,.0f}; about {at} cores reach "
            f"{NEAR_BEST:.0%} of that limit and more add nothing; smaller batches in bytes (uint8, "
            "normalise on the GPU) raise it",
        }
    x, y = _envelope(ws, rates, cores)
    base, per = _per_worker_at_top(x, y)
    main = main_s * step_rate
    how = (
        f"past the curve's end at {per:,.0f} samples/s per core (the rate per core at its {base:.3g})"
        if need.extrapolated
        else "interpolated on the measured cpu_pipeline curve"
    )
    where = (
        "straddles the step's rate"
        if cap_low is not None and cap_low < step_rate <= cap
        else f"is within {2 * BALANCED:.0%} below the step's rate"
    )
    caveat = f"; the hand-off's limit{measured} {where}: it may stop the rate short of it" if straddles else ""
    return {
        "cores_needed": math.ceil(need.value + main),
        "workers_needed": need.value,
        "extrapolated": need.extrapolated,
        "handoff_limit": cap if cap < math.inf else None,
        "handoff_straddles": straddles,
        "basis": f"{need.value:.1f} workers' cores reach the step's {step_rate:,.0f} samples/s, {how}; "
        f"+ {main:.1f} core(s) for the training process ({main_s * 1e3:.2f} ms CPU per sample){caveat}",
    }


def what_if(
    step_rate: float,
    ws: np.ndarray,
    rates: np.ndarray,
    main_s: float,
    cores: float,
    io_mb_s: float | None,
    sample_mb: float | None,
    core_counts=(4, 8, 16, 32, 64, 128),
    gpus=(1, 2, 4, 8),
    storage_mb_s=(None, 125.0, 500.0, 3000.0),
    cap: float = math.inf,
) -> list[dict]:
    """Predicted samples/s for other machines: min(GPUs × ceiling, CPU curve at the workers the
    cores allow, storage / sample size).

    With C cores the training processes take ``main_s`` CPU seconds per sample they train on
    and the workers get the rest (:func:`rate_for_cores`); the CPU figure is read off the
    measured curve (``extrapolated`` past its end) and capped at N loaders' hand-off limit
    ``cap`` (one loader per GPU process). ``storage_mb_s`` None means "as measured".
    Linear GPU scaling is an upper bound (no all-reduce cost); every row is labelled a prediction.
    """
    rows = []
    for n_gpu, c, mb_s in product(gpus, core_counts, storage_mb_s):
        cpu = rate_for_cores(c, ws, rates, main_s, cores, n_gpu * cap)  # one loader per GPU process
        bw = io_mb_s if mb_s is None else mb_s
        bounds = {
            "gpu": n_gpu * step_rate,
            "cpu": cpu.value,
            "io": bw / sample_mb if bw and sample_mb else float("inf"),
        }
        binding = min(bounds, key=bounds.get)
        rows.append(
            {
                "gpus": n_gpu,
                "cores": c,
                "storage_mb_s": bw,
                "storage": "as measured" if mb_s is None else "assumed",
                "predicted_samples_per_s": bounds[binding],
                "binding": binding,
                "extrapolated": cpu.extrapolated,
                "label": "prediction",
            }
        )
    return rows


def stage_overhead(trials: pd.DataFrame) -> list[dict]:
    """The stage clocks' cost, measured by alternating clocked and unclocked windows on one loader
    (the ``stage_timing=False`` cpu_pipeline trial): overhead with its 95% interval."""
    return _paired_overheads(trials, "cpu_pipeline", "stage_clock_overhead", "clocked")


def monitor_overhead(trials: pd.DataFrame) -> list[dict]:
    """The monitor's cost, measured by pausing and resuming its sampling between windows on one loader
    (the ``monitor_overhead`` trial): overhead with its 95% interval."""
    return _paired_overheads(trials, "monitor_overhead", "monitor_overhead", "monitored")


def _paired_overheads(trials: pd.DataFrame, kind: str, cost: str, on: str) -> list[dict]:
    """Rows of an ABBA trial (``trials.kinds._paired_trial``): rate with the thing on and off, its cost
    and interval (``stats.cost_bounds``; none when one pair of windows fitted), and whether the interval excludes
    zero."""
    if f"{cost}_frac" not in trials:
        return []
    rows = trials[(trials["kind"] == kind) & (trials["status"] == "ok") & trials[f"{cost}_frac"].notna()]
    out = []
    for _, r in rows.iterrows():
        lo, hi = cost_bounds(r[f"{cost}_frac"], r.get(f"{cost}_ci95_low"), r.get(f"{cost}_ci95_high"))
        known = lo is not None
        out.append(
            {
                "preset": r.get("preset"),
                "num_workers": int(r["num_workers"]),
                "on_samples_per_s": float(r[f"{on}_samples_per_s"]),
                "off_samples_per_s": float(r["samples_per_s"]),
                "overhead_frac": float(r[f"{cost}_frac"]),
                "overhead_ci95_low": float(lo) if known else None,
                "overhead_ci95_high": float(hi) if known else None,
                "resolved": known and (lo > 0 or hi < 0),
            }
        )
    return out
