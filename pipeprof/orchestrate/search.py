"""Adaptive worker search (``sweep: adaptive``): num_workers and the bound from a fraction of the grid.

The cheap trials already say where to look: the step ceiling S (one trial) and the loader's
rate with one worker r1 predict that about S / r1 workers feed the step. The search measures
there, then doubles while the end-to-end curve still rises by more than its noise (and has
neither reached the ceiling nor the usable cores), then bisects down to the smallest count
within 5% of the best, to within an eighth of that count (:data:`RESOLUTION`). It stops where a step
cannot separate two counts (the bracket's ends have overlapping 95% intervals, or the probe below
the top ties with it yet cannot be told from a curve still rising in proportion to the workers):
bisecting further would follow the noise, and the answer's confidence (re-drawn windows) gives
the range of counts the measurements allow. Every worker count of the exhaustive grid that it did not measure is
listed with the reason (run.json ``search``).

Points the search infers instead of measuring (0 workers: loading and the step take turns, so
its rate is 1 / (1/r1 + 1/S); measured instead when that is within 5% of the best measured rate,
as where a CPU step gets every core back without workers) are stored with their basis
(``search.inferred``), so a plot can
tell them from measured ones. The once-per-pipeline overhead checks (monitor, stage clocks) run
at the most workers the search measured, as the grid runs them at its most.

Planning is the pure function :func:`next_workers`, tested with workloads of known cost;
:func:`run_adaptive` runs the trials it asks for through the sweep's ``run_one``. This is the
default (``sweep: adaptive``); ``sweep: exhaustive`` / ``--exhaustive`` runs the whole grid.
"""

from __future__ import annotations

import math
import time
from dataclasses import replace
from typing import Callable, NamedTuple, Optional

from pipeprof.analysis.advice import NEAR_BEST, TIE_FLOOR
from pipeprof.config import default_workers
from pipeprof.schema import TrialKind
from pipeprof.stats import workers_text
from pipeprof.trials import KINDS, TrialSpec, spec_key

from .sweep import expand, run_one

MAX_POINTS = 8  # worker counts one group may measure: the grid up to 128 cores has 9
# bisection stops when the bracket is within an eighth of the count: at 16 workers, 14 vs 15 moves
# the rate by ~6%, about what the windows of one trial resolve on a shared machine, for two more trials
RESOLUTION = 8
# a worker among many may run a little faster than the one-worker trial measured (its noise, a warmer cache):
# the floor below which no count can reach the answer allows it this much more
PER_WORKER_SLACK = 1.15
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


class Step(NamedTuple):
    """The next count to measure and why: ``guess`` (S / r1), ``double``, ``probe`` (just below the most
    workers that reach the best) or ``bisect`` (toward the smallest count within 5% of the best)."""

    workers: int
    why: str


def next_workers(points: dict[int, Point], step_rate: float, per_worker: float, cores: int) -> Optional[int]:
    """The next worker count to measure, or None when the answer is found."""
    step = plan_next(points, step_rate, per_worker, cores)
    return step.workers if step is not None else None


def plan_next(points: dict[int, Point], step_rate: float, per_worker: float, cores: int) -> Optional[Step]:
    """The next step (:func:`next_workers` with its reason), or None when the answer is found."""
    if not points:
        return Step(first_guess(step_rate, per_worker, cores), "guess")
    best = max(points.values(), key=lambda p: p.rate)
    top = max(points)
    reached = best.rate >= NEAR_BEST * step_rate
    if not reached and top < cores and not _flat(points) and len(points) < MAX_POINTS:
        return Step(min(2 * top, cores), "double")
    upper = smallest_good(points)
    below = below_of(upper)
    if not reached and below > 0 and below not in points and len(points) < MAX_POINTS and _probe_below(points, upper):
        # the loader binds at the most workers measured, or at the first guess below a top that only doubling
        # reached: one probe just below says whether all are needed. The knee is usually there (S / r1 is where
        # a linear curve meets the step), so a curve that bends there is answered without bisecting the whole
        # range below it (a bisection has measured three counts where this one probe settled it)
        return Step(below, "probe")
    if upper == below_of(top) and _still_rising(points[upper], points[top]):
        return None  # the probe just below the top ties with it, yet cannot be told from a curve still rising
        # in proportion to the workers: whether the knee lies lower is beyond what the windows resolve
    lower = max([w for w in points if w < upper] + [min(floor_of(points, per_worker), upper - 1)])
    if upper - lower <= max(1, upper // RESOLUTION) or len(points) >= MAX_POINTS:
        return None
    if lower in points and points[lower].high >= points[upper].low:
        return None  # the bracket's ends cannot be told apart: bisecting between them would chase noise
    return Step((lower + upper) // 2, "bisect")


def smallest_good(points: dict[int, Point]) -> int:
    """The fewest workers measured within 5% of the best rate (the top of the bisection's bracket)."""
    best = max(p.rate for p in points.values())
    return min(w for w, p in points.items() if p.rate >= NEAR_BEST * best)


def floor_of(points: dict[int, Point], per_worker: float) -> int:
    """The most workers that cannot be the answer: even at the one-worker rate (with :data:`PER_WORKER_SLACK`)
    each, they stay below :data:`TIE_FLOOR` of the best measured rate, which the answer must reach. Bisection
    starts above it, not at 0: from 0 it measured counts that could not reach the best (docs/measured.md).
    0 when the one-worker rate is unknown."""
    if not points or not per_worker > 0:
        return 0
    best = max(p.rate for p in points.values())
    return max(0, math.ceil(TIE_FLOOR * best / (PER_WORKER_SLACK * per_worker)) - 1)


def _probe_below(points: dict[int, Point], upper: int) -> bool:
    """Probe just below ``upper``: it is the top, or the count just below a top it doubled to (not itself a
    probe below the top) with nothing measured under it. Once: a probe that ties leads to bisection."""
    top = max(points)
    return upper == top or (len(points) == 2 and upper == min(points) and below_of(top) != upper)


def _still_rising(probe: Point, top: Point) -> bool:
    """The probe's interval reaches the rate the top would give it if the rate grew in proportion to the
    workers: the curve is not shown to have flattened between them."""
    return probe.low <= top.rate * probe.workers / top.workers


def below_of(top: int) -> int:
    """The probe just below the most workers measured: an eighth of the count (at least one) less."""
    return top - max(1, top // RESOLUTION)


def _at(spec: TrialSpec, workers: int) -> TrialSpec:
    return replace(spec, num_workers=workers)


def _point(row: dict) -> Optional[Point]:
    """The row's rate per GPU (an N-GPU job's total over N): the search compares it with one GPU's step."""
    rate, n = row.get("samples_per_s"), row.get("gpus") or 1
    if row.get("status") != "ok" or rate is None:
        return None
    return Point(
        int(row["num_workers"]),
        rate / n,
        (row.get("samples_per_s_ci95_low") or rate) / n,
        (row.get("samples_per_s_ci95_high") or rate) / n,
    )


def _search_group(
    run: Callable[[TrialSpec], dict],
    specs: dict,
    step_rate: float,
    cores: int,
    skipped: list,
    ends_at: Optional[float] = None,
    clock: Callable[[], float] = time.time,
) -> tuple[dict[int, Point], Optional[dict]]:
    """One group's search; ``specs`` maps kind -> its spec at 1 worker (per rank). Rates are per GPU
    and ``cores`` a rank's share, so N GPUs search the workers of one rank like one GPU does.

    ``ends_at`` (``clock`` time): no bisection step starts that would end after it, judged by the step before
    (not the longest: the first one also reads the storage). Returns the points and the step so left out
    (None: the search ran to its end)."""
    one = run(specs[TrialKind.CPU_PIPELINE.value]) if TrialKind.CPU_PIPELINE.value in specs else {}
    per_worker = (one.get("samples_per_s") or 0.0) / specs[TrialKind.END_TO_END.value].gpus
    points: dict[int, Point] = {}
    storage_done, last, cut = False, 0.0, None
    step = plan_next(points, step_rate, per_worker, cores)
    while step is not None:
        left = ends_at - clock() if ends_at is not None else math.inf
        if step.why == "bisect" and left < last:  # the fine end of the curve, never its bound or knee
            cut = {"workers": step.workers, "step_s": last, "left_s": max(left, 0.0)}
            break
        t0 = clock()
        row = _measure_at(run, specs, step.workers, per_worker, storage_done, skipped)
        last = clock() - t0
        storage_done = True
        p = _point(row)
        if p is None:  # a failed trial ends the search: its row says why
            break
        points[step.workers] = p
        step = plan_next(points, step_rate, per_worker, cores)
    zero = zero_workers_rate(per_worker, step_rate)
    if (
        points
        and specs[TrialKind.END_TO_END.value].gpus == 1
        and zero >= NEAR_BEST * max(p.rate for p in points.values())
    ):
        # 0 workers is implied only when clearly slower: where loading is cheap beside the step (a CPU
        # step that gets every core back without workers) it may be the answer, so it is measured
        p = _point(run(_at(specs[TrialKind.END_TO_END.value], 0)))  # the loader alone at 0 adds nothing here
        if p is not None:
            points[0] = p
    return points, cut


def zero_workers_rate(per_worker: float, step_rate: float) -> float:
    """0 workers: loading (at the one-worker rate) and the step take turns in one process."""
    if per_worker <= 0:
        return 0.0
    return 1 / (1 / per_worker + (1 / step_rate if math.isfinite(step_rate) and step_rate > 0 else 0))


def _measure_at(run, specs: dict, w: int, per_worker: float, storage_done: bool, skipped: list) -> dict:
    """The loader kinds at ``w`` workers; storage_fetch once, or again only where it might bind."""
    fetch = specs.get(TrialKind.STORAGE_FETCH.value)
    if fetch is not None and not storage_done:
        got = run(_at(fetch, w))
        if (got.get("samples_per_s") or 0) >= STORAGE_FAST * per_worker * max(w, 1):
            specs.pop(TrialKind.STORAGE_FETCH.value)
            skipped.append(
                {
                    "trial": f"storage_fetch at other worker counts ({fetch.source})",
                    "reason": f"raw reads ran {got['samples_per_s']:,.0f} samples/s at {workers_text(w)}, over "
                    f"{STORAGE_FAST:g}x the pipeline's one-worker rate x workers: storage cannot bind",
                }
            )
    if TrialKind.CPU_PIPELINE.value in specs:  # for the curve that sizing reads (run() measures a spec once)
        run(_at(specs[TrialKind.CPU_PIPELINE.value], w))
    return run(_at(specs[TrialKind.END_TO_END.value], w))


def _groups(cfg, probe, user: bool, user_loader: bool) -> tuple[list[TrialSpec], list[dict], list[TrialSpec]]:
    """The ceilings; per end-to-end setting its specs at 1 worker by kind (the loader kinds that
    share its pipeline and storage); and the once-per-pipeline checks (overheads)."""
    at_one = expand(
        cfg.model_copy(update={"loader": cfg.loader.model_copy(update={"num_workers": [1]})}),
        probe,
        user_dataset=user,
        user_loader=user_loader,
    )

    def of(kind: TrialKind) -> list[TrialSpec]:
        return [s for s in at_one if s.kind == kind.value and s.stage_timing is None]

    groups = []
    for e2e in of(TrialKind.END_TO_END):
        specs = {TrialKind.END_TO_END.value: e2e}
        # one bound trial of each kind per group: the last that matches is the one kept
        specs |= {TrialKind.CPU_PIPELINE.value: s for s in of(TrialKind.CPU_PIPELINE) if _pipe(s) == _pipe(e2e)}  # noqa: B035
        specs |= {
            TrialKind.STORAGE_FETCH.value: s  # noqa: B035 (as above)
            for s in of(TrialKind.STORAGE_FETCH)
            if e2e.gpus == 1
            and (s.source, s.cache_state, s.batch_size) == (e2e.source, e2e.cache_state, e2e.batch_size)
        }
        groups.append(specs)
    once = [s for s in at_one if KINDS[TrialKind(s.kind)].once or s.stage_timing is not None]
    return of(TrialKind.GPU_CEILING) + of(TrialKind.GPU_SHARED), groups, once


def _pipe(s: TrialSpec) -> tuple:
    return (
        s.preset,
        s.augment_device,
        s.augment_overlap,
        s.step_first,
        s.staged,
        s.gpu_decoder,
        s.source,
        s.cache_state,
        s.batch_size,
        s.image_size,
        s.gpus,
    )


def _step_key(s: TrialSpec) -> tuple:
    """The step's settings, and for the GPU pipeline's, the pipeline's that share its device (``gpu_shared``: the
    step with the pipeline beside it is that side's ceiling, which the search reads as the step's)."""
    gpu = (
        (s.preset, s.augment_device, s.augment_overlap, s.step_first, s.staged, s.gpu_decoder)
        if s.augment_device == "cuda"
        else ()
    )
    return (s.model, s.precision, s.mode, s.batch_size, s.gpus, s.p2p, *gpu)


def run_adaptive(
    ctx,
    cfg,
    probe,
    user: bool,
    summarize_monitor: Callable,
    on_row: Callable = lambda rows: None,
    user_loader: bool = False,
    kept: Optional[dict] = None,
    started: Optional[float] = None,
) -> tuple[list[dict], bool, dict]:
    """Search every end-to-end setting; returns (rows, interrupted, the search record for run.json).

    ``started`` (this session's ``time.time()``): the k-th group's bisection ends by ``k × answer_max_s``.

    ``kept``: rows of an earlier session of this run by ``spec_key`` (``--resume``): the search runs
    again from the start and takes a kept row for a trial it asks for instead of measuring it; every
    kept row stays in the run."""
    kept = kept or {}
    rows: list[dict] = list(kept.values())
    done: dict = {}  # a spec measured once serves every group that shares it (a pipeline, a ceiling)
    record: dict = {"policy": "adaptive", "measured_workers": {}, "skipped": [], "inferred": []}

    def run(spec: TrialSpec) -> dict:
        if spec not in done:
            row = kept.get(spec_key(spec.columns()))
            if row is None:
                row = run_one(ctx, spec, summarize_monitor)
                rows.append(row)
                on_row(rows)
            done[spec] = row
        return done[spec]

    try:
        ceilings, groups, once = _groups(cfg, probe, user, user_loader)
        # per GPU: an N-GPU ceiling is the job's total
        steps = {_step_key(c): (run(c).get("samples_per_s") or math.inf) / c.gpus for c in ceilings}
        steps = {k: min(v, steps.get(k[:6], math.inf)) for k, v in steps.items()}  # with a pipeline: its lower
        most: dict = {}  # pipeline -> the most workers its search measured
        budget = cfg.measure.answer_max_s
        for k, specs in enumerate(groups, start=1):
            e2e = specs[TrialKind.END_TO_END.value]
            key = _step_key(e2e)
            step, cores = steps.get(key, steps.get(key[:6], math.inf)), max(ctx.cores // e2e.gpus, 1)
            ends_at = started + k * budget if started is not None and budget else None
            points, cut = _search_group(run, dict(specs), step, cores, record["skipped"], ends_at)
            _record_group(
                record,
                e2e,
                points,
                done.get(specs.get(TrialKind.CPU_PIPELINE.value), {}),
                step,
                cores,
                cut and cut | {"budget_s": k * budget},
            )
            most[_pipe(e2e)] = max([most.get(_pipe(e2e), 1), *points])
        for spec in once:  # the overhead checks, at the most workers measured for their pipeline
            run(_at(spec, most.get(_pipe(spec), 1)))
    except KeyboardInterrupt:
        return rows, True, record
    return rows, False, record


def _record_group(
    record: dict, e2e: TrialSpec, points: dict, one_worker: dict, step: float, cores: int, cut: Optional[dict] = None
) -> None:
    """What the search measured for one group, what it skipped (and why), and what it inferred; ``cut``:
    the bisection step the answer's time budget left out (:func:`_search_group`)."""
    label = _label(e2e)
    record["measured_workers"][label] = sorted(points)
    r1 = one_worker.get("samples_per_s")
    per = (r1 or 0.0) / e2e.gpus  # the search's per-GPU units
    floor = floor_of(points, per)
    stopped = None
    if cut:
        stopped = (
            f"not measured: the bisection toward the smallest count within 5% of the best stopped before "
            f"{cut['workers']} workers, which would have ended past the answer's time budget "
            f"(measure.answer_max_s: {cut['budget_s']:g} s into the run; {cut['left_s']:.0f} s were left, "
            f"the step before took {cut['step_s']:.0f} s); the answer's re-draws give the counts the "
            "measurements allow"
        )
        record.setdefault("stopped", []).append({"group": label, "next_workers": cut["workers"], "reason": stopped})
    upper = smallest_good(points) if points else 0
    record["skipped"] += [
        {
            "trial": f"end_to_end at {workers_text(w)} ({label})",
            "reason": stopped if stopped and floor < w < upper else _why_not(w, floor, per, points),
        }
        for w in sorted({*default_workers(cores), *([cut["workers"]] if cut else [])})
        if w not in points
    ]
    if 0 not in points and r1 and e2e.gpus == 1:
        rate = zero_workers_rate(r1, step)
        record["inferred"].append(
            {
                "group": label,
                "trial_kind": TrialKind.END_TO_END.value,
                "model": e2e.model,
                "precision": e2e.precision,
                "preset": e2e.preset,
                "batch_size": e2e.batch_size,
                "source": e2e.source,
                "cache_state": e2e.cache_state,
                "num_workers": 0,
                "samples_per_s": rate,
                "basis": f"1 / (1/{r1:,.1f} + 1/{step:,.1f}): the one-worker loader rate and "
                "the step ceiling, taking turns in one process",
            }
        )


def _why_not(workers: int, floor: int, r1: float, points: dict) -> str:
    if workers == 0:
        return (
            "0 workers: loading and the step take turns in one process, so its rate follows from the "
            "one-worker loader rate and the step ceiling (1 / (1/r1 + 1/step)), more than 5% below the "
            "best measured; not measured"
        )
    if workers <= floor:
        best = max(p.rate for p in points.values())
        return (
            f"cannot be the answer: {workers} worker{'s' if workers != 1 else ''} at {PER_WORKER_SLACK:g}x the "
            f"one-worker rate ({r1:,.1f}/s) each "
            f"reach at most {workers * PER_WORKER_SLACK * r1:,.0f} samples/s, below {TIE_FLOOR:.0%} of the best "
            f"measured ({best:,.0f})"
        )
    return "not needed: the counts measured located the answer"


def _label(spec: TrialSpec) -> str:
    return " ".join(
        str(p)
        for p in (
            spec.model,
            spec.precision,
            spec.mode,
            spec.preset,
            "gpu-augment" if spec.augment_device else None,
            f"bs{spec.batch_size}",
            spec.source,
            f"{spec.gpus} GPUs" if spec.gpus > 1 else None,
            "p2p off" if spec.p2p is False else None,
        )
        if p is not None
    )
