"""Adaptive worker search (``sweep: adaptive``): num_workers and the bound from a fraction of the grid.

The cheap trials already say where to look: the step ceiling S (one trial) and the loader's
rate with one worker r1 predict that about S / r1 workers feed the step. The search measures
there, then doubles while the end-to-end curve still rises by more than its noise (and has
neither reached the ceiling nor the usable cores), then bisects down to the smallest count
within 5% of the best. Every worker count of the exhaustive grid that it did not measure is
listed with the reason (run.json ``search``).

Planning is the pure function :func:`next_workers`, tested with workloads of known cost;
:func:`run_adaptive` runs the trials it asks for through the sweep's ``run_one``.
Status: opt-in this version; the default stays the exhaustive grid until the benchmark
against it has run on a GPU box (the issue on the adaptive sweep).
"""
from __future__ import annotations

import math
from dataclasses import replace
from typing import Callable, NamedTuple, Optional

from .analysis.advice import NEAR_BEST
from .config import default_workers
from .schema import TrialKind
from .sweep import expand, run_one
from .trials import TrialSpec

MAX_POINTS = 8  # worker counts one group may measure: the grid up to 128 cores has 9
STORAGE_FAST = 20.0  # raw reads this many times the pipeline's rate cannot bind: later storage trials skipped


class Point(NamedTuple):
    """One measured end-to-end worker count: rate and its 95% interval (samples/s)."""

    workers: int
    rate: float
    low: float
    high: float


def first_guess(step_rate: float, per_worker: float, cores: int) -> int:
    """Workers that feed the step at the one-worker rate, within [1, cores]."""
    if not (per_worker > 0 and step_rate > 0):
        return max(1, cores)
    return int(min(max(math.ceil(step_rate / per_worker), 1), max(cores, 1)))


def _flat(points: dict[int, Point]) -> bool:
    """The largest count measured is not shown to beat the one before it (intervals overlap or < 5% up)."""
    ws = sorted(points)
    if len(ws) < 2:
        return False
    top, prev = points[ws[-1]], points[ws[-2]]
    return top.low <= prev.high or top.rate < (2 - NEAR_BEST) * prev.rate


def next_workers(points: dict[int, Point], step_rate: float, per_worker: float, cores: int) -> Optional[int]:
    """The next worker count to measure, or None when the answer is found."""
    if not points:
        return first_guess(step_rate, per_worker, cores)
    best = max(points.values(), key=lambda p: p.rate)
    top = max(points)
    reached = best.rate >= NEAR_BEST * step_rate
    if not reached and top < cores and not _flat(points) and len(points) < MAX_POINTS:
        return min(2 * top, cores)
    good = [w for w, p in points.items() if p.rate >= NEAR_BEST * best.rate]
    upper = min(good)
    lower = max((w for w in points if w < upper), default=0)
    if upper - lower <= 1 or len(points) >= MAX_POINTS:
        return None
    return (lower + upper) // 2


def _at(spec: TrialSpec, workers: int) -> TrialSpec:
    return replace(spec, num_workers=workers)


def _point(row: dict) -> Optional[Point]:
    rate = row.get("samples_per_s")
    if row.get("status") != "ok" or rate is None:
        return None
    return Point(int(row["num_workers"]), rate, row.get("samples_per_s_ci95_low") or rate,
                 row.get("samples_per_s_ci95_high") or rate)


def _search_group(run: Callable[[TrialSpec], dict], specs: dict, step_rate: float, cores: int,
                  skipped: list) -> dict[int, Point]:
    """One group's search; ``specs`` maps kind -> its spec at 1 worker."""
    one = run(specs[TrialKind.CPU_PIPELINE.value]) if TrialKind.CPU_PIPELINE.value in specs else {}
    per_worker = one.get("samples_per_s") or 0.0
    points: dict[int, Point] = {}
    storage_done = False
    w = next_workers(points, step_rate, per_worker, cores)
    while w is not None:
        row = _measure_at(run, specs, w, per_worker, storage_done, skipped)
        storage_done = True
        p = _point(row)
        if p is None:  # a failed trial ends the search: its row says why
            break
        points[w] = p
        w = next_workers(points, step_rate, per_worker, cores)
    return points


def _measure_at(run, specs: dict, w: int, per_worker: float, storage_done: bool, skipped: list) -> dict:
    """The loader kinds at ``w`` workers; storage_fetch once, or again only where it might bind."""
    fetch = specs.get(TrialKind.STORAGE_FETCH.value)
    if fetch is not None and not storage_done:
        got = run(_at(fetch, w))
        if (got.get("samples_per_s") or 0) >= STORAGE_FAST * per_worker * max(w, 1):
            specs.pop(TrialKind.STORAGE_FETCH.value)
            skipped.append({"trial": f"storage_fetch at other worker counts ({fetch.source})",
                            "reason": f"raw reads ran {got['samples_per_s']:,.0f} samples/s at {w} workers, over "
                                      f"{STORAGE_FAST:g}x the pipeline's one-worker rate x workers: storage cannot bind"})
    if TrialKind.CPU_PIPELINE.value in specs:  # for the curve that sizing reads (run() measures a spec once)
        run(_at(specs[TrialKind.CPU_PIPELINE.value], w))
    return run(_at(specs[TrialKind.END_TO_END.value], w))


def _groups(cfg, probe, user: bool) -> tuple[list[TrialSpec], list[dict]]:
    """The ceilings, and per end-to-end setting its specs at 1 worker by kind (the loader kinds that
    share its pipeline and storage)."""
    at_one = expand(cfg.model_copy(update={"loader": cfg.loader.model_copy(update={"num_workers": [1]})}),
                    probe, user_dataset=user)

    def of(kind: TrialKind) -> list[TrialSpec]:
        return [s for s in at_one if s.kind == kind.value and s.stage_timing is None]

    def pipe(s):
        return s.preset, s.source, s.cache_state, s.batch_size, s.image_size

    groups = []
    for e2e in of(TrialKind.END_TO_END):
        specs = {TrialKind.END_TO_END.value: e2e}
        specs |= {TrialKind.CPU_PIPELINE.value: s for s in of(TrialKind.CPU_PIPELINE) if pipe(s) == pipe(e2e)}
        specs |= {TrialKind.STORAGE_FETCH.value: s for s in of(TrialKind.STORAGE_FETCH)
                  if (s.source, s.cache_state, s.batch_size) == (e2e.source, e2e.cache_state, e2e.batch_size)}
        groups.append(specs)
    return of(TrialKind.GPU_CEILING), groups


def run_adaptive(ctx, cfg, probe, user: bool, summarize_monitor: Callable,
                 on_row: Callable = lambda rows: None) -> tuple[list[dict], bool, dict]:
    """Search every end-to-end setting; returns (rows, interrupted, the search record for run.json)."""
    rows: list[dict] = []
    done: dict = {}  # a spec measured once serves every group that shares it (a pipeline, a ceiling)
    record: dict = {"policy": "adaptive", "measured_workers": {}, "skipped": []}

    def run(spec: TrialSpec) -> dict:
        if spec not in done:
            rows.append(run_one(ctx, spec, summarize_monitor))
            on_row(rows)
            done[spec] = rows[-1]
        return done[spec]

    try:
        ceilings, groups = _groups(cfg, probe, user)
        steps = {(c.model, c.precision, c.batch_size): run(c).get("samples_per_s") or math.inf for c in ceilings}
        for specs in groups:
            e2e = specs[TrialKind.END_TO_END.value]
            step = steps.get((e2e.model, e2e.precision, e2e.batch_size), math.inf)
            points = _search_group(run, dict(specs), step, ctx.cores, record["skipped"])
            record["measured_workers"][_label(e2e)] = sorted(points)
            record["skipped"] += [{"trial": f"end_to_end at {w} workers ({_label(e2e)})", "reason": _why_not(w)}
                                  for w in default_workers(ctx.cores) if w not in points]
    except KeyboardInterrupt:
        return rows, True, record
    return rows, False, record


def _why_not(workers: int) -> str:
    if workers == 0:
        return ("0 workers: loading and the step take turns in one process, so its rate follows from the "
                "one-worker loader rate and the step ceiling (1 / (1/r1 + 1/step)); not measured")
    return "not needed: the counts measured located the answer"


def _label(spec: TrialSpec) -> str:
    return " ".join(str(p) for p in (spec.model, spec.precision, spec.preset, f"bs{spec.batch_size}", spec.source)
                    if p is not None)
