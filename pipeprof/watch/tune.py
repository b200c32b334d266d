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

import math
import statistics
from typing import Callable, Optional

import numpy as np
import pandas as pd

from pipeprof.analysis import cores_needed, predict, recommend_workers
from pipeprof.answer import Recommendation
from pipeprof.config import MeasureConfig
from pipeprof.measure.confounders import step_threads as sweep_step_threads
from pipeprof.measure.windows import summarize_rates
from pipeprof.orchestrate.search import Point, next_workers
from pipeprof.stats import mean_ci95, ratio_ci95, simultaneous
from pipeprof.watch import sites

TUNE_POLICY = {"warmup_max_s": 3.0, "max_trial_s": 20.0}  # the pause is the user's time: short trials
ACTION_REGION = (
    "each side alone at the recommended count, in turn (the user's loader, each action's variant, the user's "
    "loader again): next() on a copy of the loader built from the user's arguments + the training process's "
    "work on the batch before its step (the copy to the job's device; uint8: the conversion and normalisation "
    "there; GPU path: decode and augment), steady-state windows of whole worker rounds closed by the device's "
    "sync; device_us_per_sample: that work alone (CUDA events, or the wall clock on a CPU)"
)


def policy(window_s: float, max_trial_s: Optional[float] = None) -> dict:
    """The pause's steady-state policy: the sweep's, with shorter warm-up and trial caps."""
    caps = TUNE_POLICY | ({"max_trial_s": max_trial_s} if max_trial_s is not None else {})
    return MeasureConfig(window_s=window_s, **caps).model_dump()


def _point(stats: dict, step_rate: float) -> Optional[Point]:
    rate = stats.get("samples_per_s")
    if not rate:
        return None
    low, high = stats.get("samples_per_s_ci95_low") or rate, stats.get("samples_per_s_ci95_high") or rate
    return Point(0, min(rate, step_rate), min(low, step_rate), min(high, step_rate))


def search(
    measure: Callable[[int], dict], step_rate: float, start: int, cores: int, batches_per_pass: Optional[int] = None
) -> dict[int, dict]:
    """Worker count -> the loader's stats there, measured in the order the adaptive search asks; a count whose
    rate per worker reads below a larger count's is measured once more, unless the end of each pass explains it
    (:func:`curve_note`)."""
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
    for a, b in _rises(seen):  # once: a point that met the machine's load, not the loader (see _rises)
        if not _pass_explains(batches_per_pass, a, b):
            seen[a] = measure(a)
    return seen


NO_ANSWER = "no answer from the paused process"


#: how PyTorch reports a DataLoader worker that died (the loader's own error, whatever the signal)
WORKER_DIED = "DataLoader worker"


def once_more(ask: Callable[[], dict]) -> dict:
    """``ask()`` (a pause command's answer), asked once more where a worker of the copy being timed died (PyTorch's
    spawned workers abort now and then as a loader shuts down: "terminate called without an active exception"): a
    count lost to one ended the search there, so the answer moved between two runs of one job. Any other failure
    is the copy's own (it cannot be built, memory) and stands, as does a second death."""
    got = ask()
    return ask() if WORKER_DIED in str(got.get("error") or "") else got


def curve(points: list[dict]) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """(workers, rate, low, high) of the pause's points that ran, sorted by workers."""
    ok = sorted((p for p in points if p.get("samples_per_s")), key=lambda p: p["num_workers"])
    ws = np.array([p["num_workers"] for p in ok], float)
    rate = np.array([p["samples_per_s"] for p in ok], float)
    low = np.array([p.get("samples_per_s_ci95_low") or p["samples_per_s"] for p in ok], float)
    high = np.array([p.get("samples_per_s_ci95_high") or p["samples_per_s"] for p in ok], float)
    return ws, rate, low, high


def step_threads(threads: Optional[int], cores: float, workers: int) -> Optional[int]:
    """The intra-op threads a CPU step is predicted with beside ``workers``: its own, or the cores the workers
    leave (``max(1, cores - workers)``) where it has more, as pipeprof's own sweep gives its CPU step
    (``confounders.step_threads``): threads that find their core taken spin (a held-out script's loop, at 2
    workers on 2 cores: docs/measured.md, "three held-out scripts"). None: not a CPU step, or not known."""
    if not threads:
        return None
    return min(int(threads), sweep_step_threads("end_to_end", "cpu", math.floor(cores), int(workers)))


def threads_line(
    threads: Optional[int],
    cores: float,
    pick: Optional[int],
    step: Optional[dict] = None,
    step_at: Optional[dict] = None,
) -> Optional[str]:
    """The line to add where the prediction at ``pick`` gives the CPU step fewer threads than it has, checked
    against the step's own measurements where the watch made them (``step``: the step watched at the job's
    ``threads``; ``step_at``: the loop's steps after the pause at ``step_at["threads"]``, or its ``error``): a
    count that measured slower is not advised (keep the job's threads, both figures said), nor one the watch
    tried and could not measure (a Lightning job measured 64.7 samples/s at 1 thread against 82.2 at its own 2
    and was still told to write ``torch.set_num_threads(1)``)."""
    k = step_threads(threads, cores, pick) if pick is not None else None
    if not k or k >= threads:
        return None
    tried = step_at if step_at and step_at.get("threads") == k else None
    s = "" if k == 1 else "s"
    if tried is not None and not tried.get("samples_per_s"):
        return (
            f"torch.set_num_threads({k}) is not advised: the step at {k} intra-op thread{s} was not measured "
            f"({tried.get('error') or 'no steps timed'}); keep the training process's {threads}"
        )
    own = (step or {}).get("samples_per_s")
    if tried is not None and own and tried["samples_per_s"] < own:
        return (
            f"keep the training process's {threads} intra-op threads: its step measured "
            f"{tried['samples_per_s']:,.1f} samples/s at {k} thread{s} against {own:,.1f} at its own {threads}"
        )
    return (
        f"and in the training process: torch.set_num_threads({k})  # its {threads} intra-op threads share the "
        f"{math.floor(cores)} cores with {pick} busy worker{'' if pick == 1 else 's'} and spin (the prediction "
        f"assumes {k})"
    )


def recommend(
    points: list[dict],
    watched: dict,
    step: dict,
    cores: float,
    handoff: tuple = (math.inf, None),
    cpu_threads: Optional[int] = None,
    step_at: Optional[dict] = None,
) -> dict:
    """num_workers for the watched loop from the pause's curve and the watched step (see the docstring);
    ``handoff``: the upper and lower end of the hand-off limit the pause measured (:func:`handoff_cap`);
    ``cpu_threads``: a CPU step's intra-op threads (None on a GPU), each count predicted with
    :func:`step_threads` of them and the step's rate scaled from the cores the loop's training process kept
    busy to those (linear), or, at the threads ``step_at`` measured (the loop's steps after the pause at
    ``step_at["threads"]``: its rate and interval), that measurement."""
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
    by_workers = {int(p["num_workers"]): p for p in points if p.get("samples_per_s")}
    curves = (ws, rate, low, high)

    def at(i: int, threads: Optional[int]) -> dict:
        measured = step_at if step_at and threads == step_at.get("threads") else None
        return _predicted(by_workers[int(ws[i])], i, base, measured or step, curves, cores, threads, cpu_threads)

    predicted = [at(i, step_threads(cpu_threads, cores, int(w))) for i, w in enumerate(ws)]
    table = pd.DataFrame(predicted)
    pick = recommend_workers(table)
    # the model against the loop as it ran: its own count with the threads it had
    own = [i for i, w in enumerate(ws) if int(w) == int(watched.get("num_workers") or 0)]
    check = own_count_check([at(own[0], cpu_threads)] if own else [], watched)
    main_s = (watched.get("main_cpu_pct_mean") or 0.0) / 100 / watched["samples_per_s"]
    need = cores_needed(step["samples_per_s"], ws, rate, main_s, cores, handoff[0], handoff[1])
    return pick | {
        "predicted": predicted,
        "own_count_check": check,
        "cores_needed": need,
        "main_cpu_s_per_sample": main_s,
        "step_samples_per_s": step["samples_per_s"],
        "model": "analysis.predict (min of the step, the loader alone at the workers the training "
        "process leaves cores for, and the cores' budget), the step's time with the batch's receiving on the loop's "
        "thread added (tune.receive_bound), each pass's start added where the pause saw passes end "
        "(tune.in_passes), a CPU step given the threads the workers leave it (tune.step_threads), "
        "analysis.recommend_workers",
    }


def _predicted(passes: dict, i: int, base: pd.Series, step: dict, curves: tuple, cores: float, threads, cpu_threads):
    """The prediction at the curve's ``i``-th count (``passes``: its point), its interval from the step's and the
    loader's ends, the CPU step given ``threads`` of its ``cpu_threads`` (its rate scaled to them, unless ``step``
    is the step measured at those threads: a ``threads`` key)."""
    ws, rate, low, high = curves
    w, at = ws[i], []
    for s, rates in (
        (step["samples_per_s"], rate),
        (step.get("samples_per_s_ci95_low") or step["samples_per_s"], low),
        (step.get("samples_per_s_ci95_high") or step["samples_per_s"], high),
    ):
        receive = passes.get("receive_us_per_sample")
        row = base.copy()
        row["num_workers"], row["cpu_bound_samples_per_s"] = w, rates[i]
        if threads and step.get("threads") == threads:  # measured at these threads: the cores it holds are them
            row["main_cores_step"] = float(threads)
        elif threads:  # the step's rate and the cores it holds scaled from those it kept busy in the loop to its
            # threads here (a step that sleeps or waits loses nothing); its CPU a sample unchanged
            held = base.get("main_cpu_pct_mean")
            held = held / 100 if held is not None and math.isfinite(held) else cpu_threads
            scale = threads / max(threads, min(cpu_threads, held))
            s, row["main_cores_step"] = s * scale, base["main_cores_step"] * scale
        row["step_bound_samples_per_s"] = s = receive_bound(s, receive)
        at.append(in_passes(predict(row, ws, rates, cores)[0], s, passes))
    return {
        "num_workers": int(w),
        "samples_per_s": at[0],
        "samples_per_s_ci95_low": at[1],
        "samples_per_s_ci95_high": at[2],
        "loader_alone_samples_per_s": float(rate[i]),
        "pass_start_s": passes.get("pass_start_s"),
        "samples_per_pass": passes.get("samples_per_pass"),
        "receive_us_per_sample": passes.get("receive_us_per_sample"),
        "step_threads": threads,
    }


def receive_bound(step_rate: float, receive_us: Optional[float]) -> float:
    """The step's rate with the hand-off's share on the training loop's thread added: ``next()`` receives each
    batch (unpickles it, maps its tensors from shared memory) between two steps, on the thread that runs them,
    so the loop runs at most at 1 / (1/step + receive per sample) (``pause.measure`` reads that thread's CPU
    time inside ``next()``, which waiting takes none of). The watched step is timed from one ``next()``'s return
    to the next call, so it holds none of it. The step as watched where the pause did not read it (0 workers:
    ``next()`` makes the batch itself, which the loader alone already counts; a CUDA job, whose watched step is
    the device's time, which the receiving may overlap)."""
    if not receive_us or not step_rate:
        return step_rate
    return 1.0 / (1.0 / step_rate + receive_us / 1e6)


def in_passes(rate: float, step_rate: float, passes: dict) -> float:
    """``rate`` (the steady-state model: the step and the loader overlap) for a loop whose passes each begin with
    ``passes["pass_start_s"]`` in which no batch is ready: ``iter()`` starts the workers (unless persistent) and
    they make the first batch, while the step has nothing to train on. A pass of N samples then takes at least
    that start plus N / step, and at least N / ``rate`` (the loader alone already holds its own starts), so
    the loop runs at N / max(N / rate, start + N / step) (what the steady-state model alone missed:
    docs/measured.md, "watch --tune on four more scripts"). ``rate`` as it is where the pause saw no pass end (a
    pass longer than a trial: its start is a small share)."""
    start, n = passes.get("pass_start_s"), passes.get("samples_per_pass")
    if not start or not n or not rate or not step_rate or not math.isfinite(rate):
        return rate
    return n / max(n / rate, start + n / step_rate)


OWN_COUNT_TOLERANCE = 0.10  # the bound on a prediction against the script's own rate


def own_count_check(predicted: list[dict], watched: dict) -> Optional[dict]:
    """The model against the loop at the loop's own worker count: its prediction there beside the watched rate,
    and whether they disagree beyond :data:`OWN_COUNT_TOLERANCE` and both intervals (``disagrees``). A model that
    misses the loop where both were measured carries that error to the counts it predicts; None where the pause
    did not measure the loop's own count."""
    own = int(watched.get("num_workers") or 0)
    at = next((p for p in predicted if p["num_workers"] == own), None)
    rate = watched.get("samples_per_s")
    ends = [at.get(k) for k in ("samples_per_s", "samples_per_s_ci95_low", "samples_per_s_ci95_high")] if at else []
    if at is None or not rate or not all(v is not None and math.isfinite(v) for v in ends):
        return None
    error = at["samples_per_s"] / rate - 1
    low, high = watched.get("samples_per_s_ci95_low") or rate, watched.get("samples_per_s_ci95_high") or rate
    apart = at["samples_per_s_ci95_low"] > high or at["samples_per_s_ci95_high"] < low
    return {
        "num_workers": own,
        "predicted_samples_per_s": at["samples_per_s"],
        "watched_samples_per_s": rate,
        "error_frac": error,
        "disagrees": bool(apart and abs(error) > OWN_COUNT_TOLERANCE),
    }


def picked(found: dict) -> Optional[Recommendation]:
    """The pause's pick in :func:`recommend`'s result (stored as run.json's ``tune``), typed; None where the
    pause gave none (no count gave a rate, or it did not run)."""
    return Recommendation.from_dict(found) if found.get("recommended_workers") is not None else None


def change_line(loader: dict, current: int, pick: Optional[int]) -> Optional[str]:
    """The line of the user's code to change, in words: their own knob (``sites.knob_words``: the command-line
    option, their call's argument, or the framework's field, ``dataloader_num_workers`` in ``TrainingArguments``),
    at the line of their file that writes it (``sites.knob_line``), never a line inside the framework."""
    if pick is None or loader.get("path") is None:
        return None
    words = sites.knob_words(loader, current, pick) if pick != current else None
    at = f"{loader['path']}:{sites.knob_line(loader)}"
    if words is not None:  # the user's own knob: the command-line option, or their call's argument
        return f"{at}: {words}"
    name, holder = sites.knob_name(loader)
    if pick == current:
        built = f"the DataLoader built at {loader['path']}:{loader['line']}"
        if holder == "DataLoader":
            return f"keep num_workers={current} in {built}"
        option = loader.get("option")
        keep = f"{option['flag']} {current}" if option else f"{name}={current} in {holder}"
        return f"keep {keep} ({name} of {holder}: {built})"
    return f"{at}: {name}={current} -> {name}={pick}" + ("" if holder == "DataLoader" else f" in {holder}(...)")


# ---- the curve's check, and the actions tried in the pause -----------------------------------------


def _rises(seen: dict[int, dict]) -> list[tuple[int, int]]:
    """(a, b): the smallest larger count b whose rate per worker reads above a's, beyond both intervals. A loader's
    rate per worker can only fall as workers are added (they share the cores and one hand-off), so such an ``a``
    met something else on the machine, or the end of a pass (:func:`curve_note`): the search measures it again."""
    ok = sorted(w for w, s in seen.items() if s.get("samples_per_s") and w > 0)

    def per_worker(w: int, end: str) -> float:
        return (seen[w].get(f"samples_per_s_ci95_{end}") or seen[w]["samples_per_s"]) / w

    found = [
        (a, next((b for b in ok[i + 1 :] if per_worker(b, "low") > per_worker(a, "high")), None))
        for i, a in enumerate(ok)
    ]
    return [(a, b) for a, b in found if b is not None]


def pass_efficiency(batches: int, workers: int) -> float:
    """The share of a pass's worker slots that carry a batch: a pass of ``batches`` hands them out round-robin,
    so its last round keeps only ``batches mod workers`` workers busy and the next pass starts only when the
    loop asks for it (16 batches on 14 workers: 16 of 28 slots, 0.57; on 16 workers: 1.0)."""
    return batches / (workers * math.ceil(batches / workers)) if batches and workers else 1.0


def _pass_explains(batches: Optional[int], a: int, b: int) -> bool:
    """The end of each pass leaves ``a`` workers idle for a tenth or more of their slots more than ``b``."""
    return bool(batches) and pass_efficiency(batches, a) < 0.9 * pass_efficiency(batches, b)


def curve_note(seen: dict[int, dict], batches_per_pass: Optional[int] = None) -> Optional[str]:
    """Why the curve is not monotone in its rate per worker after the second look, or None: the end of each
    pass where it explains the drop (:func:`pass_efficiency` lower at the suspect count), else the machine."""
    reasons = []
    for a, b in _rises(seen):
        ea, eb = pass_efficiency(batches_per_pass, a), pass_efficiency(batches_per_pass, b)
        if _pass_explains(batches_per_pass, a, b):
            reasons.append(
                f"a pass of {batches_per_pass} batches keeps {a} workers busy in {ea:.0%} of their rounds' slots "
                f"against {eb:.0%} at {b} (its last round leaves workers idle until the next pass starts), which "
                f"may explain the lower rate per worker at {a} than at {b}; a count that divides {batches_per_pass} "
                "loses none"
            )
        else:
            reasons.append(
                f"the rate per worker at {a} workers reads below {b}'s in two measurements: the machine's load moved "
                "during the pause (the counts' intervals are the figures to read)"
            )
    return "; ".join(reasons) or None


def point_cap(tune_max_s: float) -> float:
    """A curve point's (and an action side's) time cap: a tenth of the pause's budget, 8-20 s (at the default
    120 s: 12 s, about 4 points, the hand-off and 4 action sides)."""
    return max(8.0, min(20.0, tune_max_s / 10))


def handoff_cap(rows: list[dict]) -> tuple[float, Optional[float]]:
    """(upper, lower) end of the pause's measured hand-off limit (``analysis.bounds.handoff_interval`` over the
    pause's rows: they are all of the watched loader); (inf, None) where it did not run."""
    from pipeprof.analysis.bounds import handoff_interval

    low, high = handoff_interval(pd.DataFrame(rows), pd.Series(dtype=object)) if rows else (math.inf, math.inf)
    return high, (low if math.isfinite(low) else None)


def _mean(values: list) -> Optional[float]:
    known = [v for v in values if v is not None]
    return statistics.fmean(known) if known else None


def bracketed(before: dict, side: dict, after: Optional[dict], comparisons: int = 1) -> dict:
    """A variant's reading against the baseline read before and after it: the baseline's windows of both
    readings pooled (the machine's drift between them widens its spread), the gain the ratio of the means with
    its interval (:func:`ratio_ci95`); an action is verified where that interval is above zero. ``comparisons``:
    the variants read in the pause, whose best is named: the interval is at the level that holds for all of them
    together (:func:`simultaneous`)."""
    bases = [b for b in (before, after) if b and len(b.get("window_rates") or []) >= 2]
    mine = side.get("window_rates") or []
    if not bases or len(mine) < 2:
        return {"error": side.get("error") or "fewer than 2 windows on a side: no interval"}
    pooled = [r for b in bases for r in b["window_rates"]]
    base = summarize_rates(pooled)
    level = simultaneous(comparisons)
    gain, lo, hi = ratio_ci95(mine, pooled, level=level)
    base_lo, base_hi = mean_ci95(pooled, level)  # at the gains' level: an end-to-end interval reads both
    base_us = [b.get("device_us_per_sample") for b in bases if b.get("device_us_per_sample") is not None]
    drift = bases[-1]["samples_per_s"] / bases[0]["samples_per_s"] - 1 if len(bases) > 1 else None
    return {
        "samples_per_s": side["samples_per_s"],
        "samples_per_s_ci95_low": side.get("samples_per_s_ci95_low"),
        "samples_per_s_ci95_high": side.get("samples_per_s_ci95_high"),
        "baseline_samples_per_s": base["samples_per_s"],
        "baseline_ci95_low": base["samples_per_s_ci95_low"],
        "baseline_ci95_high": base["samples_per_s_ci95_high"],
        "baseline_ci_low": base_lo,
        "baseline_ci_high": base_hi,
        "baseline_drift_frac": drift,
        "action_gain_frac": gain,
        "action_gain_ci95_low": lo,
        "action_gain_ci95_high": hi,
        "ci_level": level,
        "device_us_per_sample": side.get("device_us_per_sample"),
        "baseline_device_us_per_sample": _mean(base_us),
        "pass_start_s": side.get("pass_start_s"),
        "baseline_pass_start_s": _mean([b.get("pass_start_s") for b in bases]),
        "samples_per_pass": side.get("samples_per_pass") or _mean([b.get("samples_per_pass") for b in bases]),
        "receive_us_per_sample": side.get("receive_us_per_sample"),
        "baseline_receive_us_per_sample": _mean([b.get("receive_us_per_sample") for b in bases]),
        # the training process's CPU in the side's windows and in the baseline's (for the record: not modelled)
        "main_cpu_pct_mean": side.get("main_cpu_pct_mean"),
        "baseline_main_cpu_pct_mean": _mean([b.get("main_cpu_pct_mean") for b in bases]),
        "windows": len(mine),
        "baseline_windows": len(pooled),
        "unstable": side.get("unstable"),
        "unstable_reason": side.get("unstable_reason"),
    }


def with_step(row: dict, step_rate: float, step_ends: tuple = (None, None)) -> dict:
    """An action's reading (:func:`bracketed`) with its end-to-end prediction: the loader alone and the training
    process's work per sample (``device_us_per_sample``, the baseline's copy subtracted) against the step watched
    in the loop. That work runs in the training process between steps (one stream, one thread), so it adds to
    the step's time per sample: predicted = min(variant alone, 1 / (1/step + extra)) over min(baseline alone,
    step), each with its own batches' receiving (:func:`receive_bound`: uint8 batches are a quarter of the bytes)
    and its own passes' starts (:func:`in_passes`: persistent workers start no processes at a pass).
    The interval's ends are the loader gain's ends read against the step at its median and at its interval's
    ends (``step_ends``) and against the baseline at its interval's ends: where the step binds both sides the
    loader's interval alone collapses to a point, and where it binds the variant alone the baseline's spread is
    the ratio's.
    ``verified``: the loader's gain interval is above zero."""
    base, gain = row.get("baseline_samples_per_s"), row.get("action_gain_frac")
    if row.get("error") or not base or gain is None:
        return row | {"measured": False}
    extra = max(0.0, (row.get("device_us_per_sample") or 0.0) - (row.get("baseline_device_us_per_sample") or 0.0))
    n = row.get("samples_per_pass")
    mine, theirs = (
        {"pass_start_s": row.get(k), "samples_per_pass": n} for k in ("pass_start_s", "baseline_pass_start_s")
    )
    if not (mine["pass_start_s"] and theirs["pass_start_s"]):  # one side's passes unseen: neither counts them
        mine, theirs = {}, {}

    def fed(step: float) -> float:  # the step with the change's work on the device and its batch's receiving
        return receive_bound(1.0 / (1.0 / step + extra / 1e6), row.get("receive_us_per_sample"))

    def e2e(g: float, step: float = step_rate, b: float = base) -> float:  # the variant at b x (1 + g), fed by the step
        own = receive_bound(step, row.get("baseline_receive_us_per_sample"))
        was = in_passes(min(b, own), own, theirs)
        return in_passes(min(b * (1 + g), fed(step)), fed(step), mine) / was - 1

    steps = [step_rate] + [s for s in step_ends if s]
    # the baseline's own interval, at the gains' level: where both sides bind on the loader the ratio is the paired
    # gain whatever the baseline, but where the variant binds on the step and the baseline on the loader the ratio
    # is step over baseline, whose spread the paired windows no longer cancel (docs/watch.md: an interval without
    # it missed what the script then ran)
    bases = [base] + [b for b in (row.get("baseline_ci_low"), row.get("baseline_ci_high")) if b]
    corners = [(s, b) for s in steps for b in bases]

    return row | {
        "measured": True,
        "verified": bool(row["action_gain_ci95_low"] > 0),
        "extra_device_us_per_sample": extra,
        "predicted_e2e_gain_frac": e2e(gain),
        "predicted_e2e_gain_ci95_low": min(e2e(row["action_gain_ci95_low"], s, b) for s, b in corners),
        "predicted_e2e_gain_ci95_high": max(e2e(row["action_gain_ci95_high"], s, b) for s, b in corners),
        "predicted_e2e_samples_per_s": in_passes(min(base * (1 + gain), fed(step_rate)), fed(step_rate), mine),
    }


def best_action(tried: list[dict]) -> Optional[dict]:
    """The verified action (its loader gain's interval above zero) with the largest predicted end-to-end gain,
    among those whose end-to-end interval is above zero too, else None: no action tried was shown to help the
    loop. A loader made faster behind a step that binds gains the loop nothing (+0.0% … +0.0%): that is not a
    change to write (a watched loop named one such in one run of two and none in the other, on noise)."""
    from pipeprof.actions import best_measured

    helps = [a for a in tried if a.get("measured") and (a.get("predicted_e2e_gain_ci95_low") or 0.0) > 0]
    return best_measured(helps, "predicted_e2e_gain_frac", verified_only=True)


def as_good(best: Optional[dict], tried: list[dict]) -> list[str]:
    """The ids of the other actions shown to help (verified, end-to-end interval above zero) whose end-to-end
    interval reaches the best one's: not separable from it, so naming the best alone would pick one on noise."""
    if best is None:
        return []
    low = best["predicted_e2e_gain_ci95_low"]
    return [
        a["id"]
        for a in tried
        if a is not best
        and a.get("measured")
        and a.get("verified")
        and (a.get("predicted_e2e_gain_ci95_low") or 0.0) > 0
        and a["predicted_e2e_gain_ci95_high"] >= low
    ]


def knob_snippet(site: str, params: dict, loader: Optional[dict] = None) -> str:
    """An action's DataLoader keywords as the user writes them: in ``DataLoader(...)``, or in the framework's
    class where one built the loader from its settings (``TrainingArguments(..., dataloader_pin_memory=True)``)."""
    names = {k: sites.knob_name(loader or {}, k) for k in params}
    holders = {h for _, h in names.values()}
    holder = holders.pop() if len(holders) == 1 else "DataLoader"  # a keyword the framework has no field for
    words = ", ".join(f"{names[k][0] if holder != 'DataLoader' else k}={v!r}" for k, v in params.items())
    return f"# the DataLoader at {site}\n{holder}(..., {words})"
