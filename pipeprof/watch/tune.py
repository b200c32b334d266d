"""``--tune`` in the parent: which worker counts the paused process measures, and what they say.

The counts follow the sweep's adaptive search (``orchestrate.search.next_workers``), with the step rate
watched in the user's loop as the ceiling: the user's own count first (its rate per worker gives the
first guess, about step / per-worker rate), then doubling while the loader alone still falls short
of the step and rises beyond its noise, then a probe or bisection down to the smallest count that
keeps up. Each point is the loader alone (``pause.measure``), entered as ``min(loader, step)`` as
an end-to-end point would be.

:func:`recommend` reads the points with the sweep's curve model: each count's end-to-end rate is
``analysis.predict`` on the watched row moved to that count (the step, the loader alone there, the
workers the training process leaves cores for), the pick is ``analysis.recommend_workers`` over those
predictions with their intervals, and the cores it needs ``analysis.cores_needed`` on the measured
curve. Nothing is re-implemented here. Its result is a dict in run.json's stored names (run.json's ``tune``);
:func:`picked` reads its pick as an ``answer.Recommendation``.
"""

from __future__ import annotations

from typing import Callable, Optional

import numpy as np
import pandas as pd

from pipeprof.analysis import cores_needed, predict, recommend_workers
from pipeprof.answer import Recommendation
from pipeprof.config import MeasureConfig
from pipeprof.orchestrate.search import Point, next_workers

TUNE_POLICY = {"warmup_max_s": 3.0, "max_trial_s": 20.0}  # the pause is the user's time: short trials


def policy(window_s: float) -> dict:
    """The pause's steady-state policy: the sweep's, with shorter warm-up and trial caps."""
    return MeasureConfig(window_s=window_s, **TUNE_POLICY).model_dump()


def _point(stats: dict, step_rate: float) -> Optional[Point]:
    rate = stats.get("samples_per_s")
    if not rate:
        return None
    low, high = stats.get("samples_per_s_ci95_low") or rate, stats.get("samples_per_s_ci95_high") or rate
    return Point(0, min(rate, step_rate), min(low, step_rate), min(high, step_rate))


def search(measure: Callable[[int], dict], step_rate: float, start: int, cores: int) -> dict[int, dict]:
    """Worker count -> the loader's stats there, measured in the order the adaptive search asks."""
    seen: dict[int, dict] = {}
    first = max(start, 1)
    seen[first] = measure(first)
    p = _point(seen[first], step_rate)
    if p is None:
        return seen
    points = {first: p._replace(workers=first)}
    per_worker = seen[first]["samples_per_s"] / first  # the loader alone, not capped at the step
    w = next_workers({}, step_rate, per_worker, cores)
    if w in seen:  # the first guess is the count already measured: go on from the points
        w = next_workers(points, step_rate, per_worker, cores)
    while w is not None and w not in seen:
        seen[w] = measure(w)
        p = _point(seen[w], step_rate)
        if p is None:
            break
        points[w] = p._replace(workers=w)
        w = next_workers(points, step_rate, per_worker, cores)
    return seen


def curve(points: list[dict]) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """(workers, rate, low, high) of the pause's points that ran, sorted by workers."""
    ok = sorted((p for p in points if p.get("samples_per_s")), key=lambda p: p["num_workers"])
    ws = np.array([p["num_workers"] for p in ok], float)
    rate = np.array([p["samples_per_s"] for p in ok], float)
    low = np.array([p.get("samples_per_s_ci95_low") or p["samples_per_s"] for p in ok], float)
    high = np.array([p.get("samples_per_s_ci95_high") or p["samples_per_s"] for p in ok], float)
    return ws, rate, low, high


def recommend(points: list[dict], watched: dict, step: dict, cores: float) -> dict:
    """num_workers for the watched loop from the pause's curve and the watched step (see the docstring)."""
    ws, rate, low, high = curve(points)
    if not len(ws):
        return {"recommended_workers": None, "why": "no worker count of the pause gave a rate"}
    base = pd.Series(
        {
            **watched,
            "io_bound_samples_per_s": float("nan"),
            "main_cores_step": (step.get("main_cpu_pct_mean") or 100.0) / 100,
        }
    )
    predicted = []
    for i, w in enumerate(ws):
        at = []
        for s, rates in (
            (step["samples_per_s"], rate),
            (step.get("samples_per_s_ci95_low") or step["samples_per_s"], low),
            (step.get("samples_per_s_ci95_high") or step["samples_per_s"], high),
        ):
            row = base.copy()
            row["num_workers"], row["cpu_bound_samples_per_s"], row["step_bound_samples_per_s"] = w, rates[i], s
            at.append(predict(row, ws, rates, cores)[0])
        predicted.append(
            {
                "num_workers": int(w),
                "samples_per_s": at[0],
                "samples_per_s_ci95_low": at[1],
                "samples_per_s_ci95_high": at[2],
                "loader_alone_samples_per_s": float(rate[i]),
            }
        )
    table = pd.DataFrame(predicted)
    pick = recommend_workers(table)
    main_s = (watched.get("main_cpu_pct_mean") or 0.0) / 100 / watched["samples_per_s"]
    need = cores_needed(step["samples_per_s"], ws, rate, main_s, cores)
    return pick | {
        "predicted": predicted,
        "cores_needed": need,
        "main_cpu_s_per_sample": main_s,
        "step_samples_per_s": step["samples_per_s"],
        "model": "analysis.predict (min of the step, the loader alone at the workers the training "
        "process leaves cores for, and the cores' budget), analysis.recommend_workers",
    }


def picked(found: dict) -> Optional[Recommendation]:
    """The pause's pick in :func:`recommend`'s result (stored as run.json's ``tune``), typed; None where the
    pause gave none (no count gave a rate, or it did not run)."""
    return Recommendation.from_dict(found) if found.get("recommended_workers") is not None else None


def change_line(loader: dict, current: int, pick: Optional[int]) -> Optional[str]:
    """The line of the user's code to change, in words."""
    if pick is None or loader.get("path") is None:
        return None
    if pick == current:
        return f"keep num_workers={current} in the DataLoader built at {loader['path']}:{loader['line']}"
    return f"{loader['path']}:{loader['line']}: num_workers={current} -> num_workers={pick}"
