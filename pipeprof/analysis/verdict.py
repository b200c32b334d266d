"""Verdicts in two levels: first the side that binds, then the resource on that side.

Each end-to-end trial's own evidence comes first: the share of time the step waited for data
(``data_wait_frac``), how busy the run's cores were (``usable_busy_cores``), how much of their time
the workers computed, and the rate against the limits measured alone. Each of these carries its
95% interval (from the trial's windows, or from blocks of the monitor's samples), and every rule
compares the *interval* with its threshold, so that a figure sitting on a threshold does not flip
the answer from one run to the next: where the interval straddles a threshold the row names both
readings (``also``) instead of picking one by its median.

**Side** (``side``): ``input`` when the step waits >= ``WAIT_INPUT`` of the time (the whole interval
at or above it), ``step`` when it waits < ``WAIT_STEP`` (the whole interval below), ``balanced`` when
the loader alone and the step alone are within their noise of each other and the step does not wait
much; otherwise the isolated bounds (``bounds.classify``) decide, and say so. With 0 workers loading and
the step take turns in one process: the larger share binds.

**Resource** (``resource``), on the input side, each tested with its interval:

* ``storage``: the pipeline runs at the rate the storage delivers alone (``storage_fetch``);
* ``cores``: the usable cores are all busy (>= ``SATURATED``): more workers cannot help;
* ``handoff``: the rate reaches the loader's hand-off limit measured by the ``handoff`` trial (the
  same loader over pre-built samples): neither workers nor cores raise it;
* ``workers``: the workers compute most of their time (>= ``WORKERS_BUSY``) and the cores have room
  for more of them; when the workers and the training process already fill the cores, it is ``cores``;
* ``unattributed``: none of these is shown (e.g. a limit was not measured): the row says what is missing.

On the step side: ``gpu`` (or ``step`` on a machine without one); ``gpu-pipeline`` when decoding and
augmenting on the GPU (``augment.device: cuda``) take >= ``GPU_PIPELINE_SHARE`` of its time, measured
with CUDA events around them; or ``cores`` when the step runs more than 10% below its rate alone on
saturated cores (its host side is starved).

``verdict`` keeps the one-word names the reports have always printed, from (side, resource):
cpu-bound (workers), cores-bound, loader-bound (hand-off), io-bound (storage), input-bound
(unattributed), gpu-/step-bound, balanced. The thresholds follow TensorFlow's input-pipeline analyzer
(>= 20% of step time waiting is "highly input-bound", >= 5% "moderately").
"""

from __future__ import annotations

from typing import NamedTuple, Optional

import numpy as np
import pandas as pd

from pipeprof.schema import OVERLAPPED, overlap_mode
from pipeprof.stats import workers_text

from .bounds import (
    BALANCED,
    NEAR_BEST,
    _clean,
    _known,
    at_handoff,
    classify,
    cpu_curve,
    curves,
    groups,
    predict,
    prediction_noise,
    present_group_keys,
    waits_on_storage,
    worker_capacity,
)

WAIT_INPUT = 0.20  # the step waits >= 20% of the wall time: input-bound
WAIT_STEP = 0.05  # the step waits < 5%: the step binds
SATURATED = 0.90  # >= 90% of the usable cores busy: the machine's cores are the limit
# a step running > 10% below its rate alone, hardly waiting for data, with >= 80% of the cores busy:
# its host side is starved (a machine-wide mean hides each DDP rank's full slice: with each rank's workers and
# training process sharing its slice, a 2-GPU step ran well under its ceiling while the machine-wide mean stayed
# under 90%; docs/measured.md, "Two GPUs against one")
SLOWED_SATURATED = 0.80
WORKERS_BUSY = 0.70  # workers computing >= 70% of their time: they are the CPU limit, not waiting
# decode + augment on the GPU taking >= 25% of the wall time: the GPU is bound by its input work too
GPU_PIPELINE_SHARE = 0.25
STEP_SIDE = {"gpu-bound", "step-bound"}
INPUT_SIDE = {"cpu-bound", "io-bound", "loader-bound", "input-bound", "cores-bound"}
INPUT_RESOURCES = ("storage", "cores", "handoff", "workers")  # the order a clear binding is named in
ALSO = "; also within its interval of its limit: "  # joins the resources that may bind too to a basis
VERDICT_OF = {
    ("input", "storage"): "io-bound",
    ("input", "cores"): "cores-bound",
    ("input", "handoff"): "loader-bound",
    ("input", "workers"): "cpu-bound",
    ("input", "unattributed"): "input-bound",
    ("step", "gpu"): "gpu-bound",
    ("step", "gpu-pipeline"): "gpu-bound",
    ("step", "step"): "step-bound",
    ("step", "cores"): "cores-bound",
    ("balanced", None): "balanced",
    (None, None): "unknown",
}
YES, MAYBE, NO = "yes", "maybe", "no"


class Interval(NamedTuple):
    """A measured figure and its 95% interval (low = high = mid when only the figure was recorded)."""

    mid: float
    low: float
    high: float

    def against(self, threshold: float) -> str:
        """yes: the whole interval at or above ``threshold``; no: all below; maybe: it straddles."""
        return YES if self.low >= threshold else NO if self.high < threshold else MAYBE

    def text(self, fmt: str = "{:.0%}") -> str:
        """The interval as read: "3%-6%"; a low end that rounds to 0 is said as a ceiling, "≤ 6%", never "-0%"
        (``stats.share_text``: every figure here is a share, a rate or a count of cores, none below 0)."""
        low = max(self.low, 0.0)
        lo, hi, mid = fmt.format(low), fmt.format(self.high), fmt.format(self.mid)
        if lo == hi:
            return mid if mid.strip("-0.,%") else fmt.format(0.0)
        return f"≤ {hi}" if not lo.strip("0.,%") else f"{lo}-{hi}"


class Evidence(NamedTuple):
    """What one end-to-end trial measured about itself (None: not measured)."""

    wait: Optional[float]  # share of wall time blocked on next(loader)
    busy_cores: Optional[float]  # cores busy on the run's CPUs, whoever used them
    run_cores: Optional[float]  # cores the main process and the workers used
    foreign_cores: Optional[float]  # cores used by processes outside the run
    cores: float  # usable cores
    workers: int
    worker_busy: Optional[float]  # workers' CPU / (100% x workers)
    device_busy: Optional[float]  # copy + compute time (CUDA events or host clock) / wall time
    wait_iv: Optional[Interval] = None  # the same figures with their 95% intervals
    busy_iv: Optional[Interval] = None
    worker_iv: Optional[Interval] = None

    def waits(self) -> Optional[Interval]:
        return self.wait_iv or (Interval(self.wait, self.wait, self.wait) if self.wait is not None else None)

    def busy(self) -> Optional[Interval]:
        b = self.busy_cores
        return self.busy_iv or (Interval(b, b, b) if b is not None else None)

    def computing(self) -> Optional[Interval]:
        b = self.worker_busy
        return self.worker_iv or (Interval(b, b, b) if b is not None else None)


def _num(row: pd.Series, key: str) -> Optional[float]:
    v = row.get(key)
    return float(v) if v is not None and not isinstance(v, (list, tuple)) and v == v else None


def interval(row: pd.Series, key: str, low: str, high: str, scale: float = 1.0) -> Optional[Interval]:
    """``row[key]`` with its recorded interval (columns ``low``/``high``), scaled; None when unmeasured."""
    mid = _num(row, key)
    if mid is None:
        return None
    lo, hi = _num(row, low), _num(row, high)
    lo, hi = (mid, mid) if lo is None or hi is None else (min(lo, mid), max(hi, mid))
    # every figure read here (a share, a rate, cores) is at least 0: a run stored before the bounds' rule
    # (``stats.rate_bounds``) kept a symmetric interval's negative low end
    return Interval(mid * scale, max(lo, 0.0) * scale, hi * scale)


def evidence(row: pd.Series, cores: float) -> Evidence:
    """The trial's own figures and their intervals; busy cores fall back on the machine-wide CPU share."""
    w = int(row["num_workers"])
    main, workers = _num(row, "main_cpu_pct_mean"), _num(row, "workers_cpu_pct_mean")
    run = _num(row, "run_cores_mean")
    if run is None and main is not None:
        run = (main + (workers or 0.0)) / 100
    busy = _num(row, "usable_busy_cores_mean")
    busy_iv = interval(row, "usable_busy_cores_mean", "usable_busy_cores_ci95_low", "usable_busy_cores_ci95_high")
    if busy is None and _num(row, "cpu_util_pct_mean") is not None:
        busy = _num(row, "cpu_util_pct_mean") / 100 * cores
    cpus = _num(row, "usable_cores")
    if cpus is not None and cpus > cores + 0.5:  # a CPU quota below the CPUs it may run on: others' load on
        busy, busy_iv = run, None  # those CPUs does not take the run's quota, so only the run's own use counts
    worker_iv = (
        interval(row, "workers_cpu_pct_mean", "workers_cpu_pct_ci95_low", "workers_cpu_pct_ci95_high", 1 / (100 * w))
        if w
        else None
    )
    return Evidence(
        _num(row, "data_wait_frac"),
        busy,
        run,
        _num(row, "foreign_cores_mean"),
        cores,
        w,
        workers / (100 * w) if w and workers is not None else None,
        _num(row, "device_busy_frac"),
        interval(row, "data_wait_frac", "data_wait_frac_ci95_low", "data_wait_frac_ci95_high"),
        busy_iv,
        worker_iv,
    )


def _busy_text(ev: Evidence) -> str:
    if ev.busy() is None:
        return "busy cores not measured"
    own = f"the run {ev.run_cores:.1f}" if ev.run_cores is not None else "the run"
    other = f", other processes {ev.foreign_cores:.1f}" if ev.foreign_cores and ev.foreign_cores >= 0.1 else ""
    return f"{ev.busy().text('{:.1f}')} of {ev.cores:g} usable cores busy ({own}{other})"


class Reading(NamedTuple):
    """One resource tested against its threshold: yes / maybe / no, and the figures that say so."""

    resource: str
    state: str
    text: str
    measured: bool = True


def _rate_iv(row: pd.Series) -> Interval:
    return interval(row, "samples_per_s", "samples_per_s_ci95_low", "samples_per_s_ci95_high")


def _storage(ev: Evidence, bounds: dict, row: pd.Series) -> Reading:
    io, cpu, rate = bounds.get("io"), bounds.get("cpu"), _rate_iv(row)
    if not _known(io):
        return Reading("storage", NO, "storage not measured", False)
    state = YES if waits_on_storage(cpu, io) else rate.against((1 - 2 * BALANCED) * io)
    return Reading(
        "storage", state, f"the pipeline runs at {rate.text('{:,.0f}')} samples/s, the storage alone delivers {io:,.0f}"
    )


ROOM = 0.5  # half a core left over is room for another worker: it would add about half a worker's rate


def _room(ev: Evidence) -> bool:
    """Room for another worker: the cores the run was measured to use (workers and training process) leave
    at least ROOM of a core. Measured, not assumed: a training process that waits on its GPU (or a step that
    sleeps) leaves its core to the workers, one that launches kernels flat out does not."""
    used = ev.run_cores if ev.run_cores is not None else ev.workers + 1.0
    return ev.cores - used >= ROOM


def _cores(ev: Evidence) -> Reading:
    busy, computing = ev.busy(), ev.computing()
    full = computing.against(WORKERS_BUSY) if computing is not None and not _room(ev) else NO
    if busy is None and full == NO:
        return Reading("cores", NO, "busy cores not measured", False)
    state = busy.against(SATURATED * ev.cores) if busy is not None else NO
    if full != NO and state != YES:  # busy workers that, with the training process, fill the usable cores
        return Reading(
            "cores",
            full,
            f"the {workers_text(ev.workers)} compute {computing.text()} of their time and, with "
            f"the training process, fill the {ev.cores:g} usable cores ({_busy_text(ev)})",
        )
    return Reading("cores", state, _busy_text(ev))


def _handoff(row: pd.Series) -> Reading:
    limit = interval(row, "handoff_samples_per_s", "handoff_ci95_low", "handoff_ci95_high")
    if limit is None:
        return Reading("handoff", NO, "hand-off limit not measured", False)
    rate = _rate_iv(row)
    state = YES if at_handoff(rate.low, row) else MAYBE if at_handoff(rate.high, row) else NO
    return Reading(
        "handoff",
        state,
        f"the loader's hand-off passes at most {limit.text('{:,.0f}')} samples/s "
        f"(measured: the handoff trial), the run reaches {rate.text('{:,.0f}')}",
    )


def _workers(ev: Evidence) -> Reading:
    busy = ev.computing()
    if busy is None:
        return Reading("workers", NO, "workers' CPU not measured", False)
    state = busy.against(WORKERS_BUSY) if _room(ev) else NO  # no room: the cores bind, not the count
    return Reading("workers", state, f"the {workers_text(ev.workers)} compute {busy.text()} of their time")


def readings(ev: Evidence, bounds: dict, row: pd.Series) -> list[Reading]:
    """Each input-side resource tested with its interval, in INPUT_RESOURCES order."""
    return [_storage(ev, bounds, row), _cores(ev), _handoff(row), _workers(ev)]


# what the resource rules out is measured; what might help instead is the ranked actions' to say (predicted,
# and measured by the action trials): decoding on the GPU can be slower than the cores it spares
# (docs/measured.md, "The GPU pipeline")
ADVICE = {
    "storage": "the storage binds: see the ranked actions (RAM, shards) for what was measured",
    "cores": "more workers cannot help (the cores are full); more cores or a cheaper pipeline may: see the "
    "ranked actions",
    "handoff": "more workers or cores cannot raise it; fewer bytes per batch may: see the ranked actions",
    "workers": "more workers would help: the cores have room for them",
    "unattributed": "no single input resource is shown to bind",
}


FROM_BOUNDS = {"cpu-bound": "workers", "io-bound": "storage", "loader-bound": "handoff"}


def input_resource(
    ev: Evidence, bounds: dict, row: pd.Series, from_bounds: str = "unknown"
) -> tuple[str, list[str], str]:
    """(resource, also, basis) on the input side: the first resource whose whole interval binds, else the
    first whose interval straddles; ``also`` names every other one whose interval reaches its threshold.
    With none shown by the trial's own figures, the isolated bounds' resource (and the basis says so)."""
    rs = readings(ev, bounds, row)
    clear = [r for r in rs if r.state == YES] or [r for r in rs if r.state == MAYBE]
    if not clear:
        missing = "; ".join(r.text for r in rs if not r.measured)
        missing = f" ({missing})" if missing else ""
        unseen = {r.resource for r in rs if not r.measured}
        if FROM_BOUNDS.get(from_bounds) in unseen:  # the trial could not see it; the bounds measured alone did
            res = FROM_BOUNDS[from_bounds]
            return res, [], f"from the isolated bounds ({from_bounds}){missing}: {ADVICE[res]}"
        return "unattributed", [], f"{ADVICE['unattributed']}{missing}"
    first, others = clear[0], [r for r in rs if r is not clear[0] and r.state != NO]
    also = "".join(f"{ALSO}{r.text}" for r in others)
    return first.resource, [r.resource for r in others], f"{first.text}: {ADVICE[first.resource]}{also}"


def step_resource(ev: Evidence, bounds: dict, row: pd.Series, device: str) -> tuple[str, list[str], str]:
    """(resource, also, basis) on the step side: the device, or the cores when the step's host side starves."""
    step, rate = bounds.get("step"), _rate_iv(row)
    slowed = rate.against((1 - 2 * BALANCED) * step) != YES if _known(step) else False
    busy = ev.busy()
    share = SATURATED if device != "cuda" else SLOWED_SATURATED
    sat = busy.against(share * ev.cores) if busy is not None else NO
    if ev.workers > 0 and sat != NO and (device != "cuda" or slowed):
        alone = f", at {rate.mid / step:.0%} of its rate alone" if _known(step) else ""
        if _known(step) and rate.low > step:  # faster than the step alone, beyond its interval: a bound not holding
            alone = f", faster than the step measured alone ({step:,.3g} samples/s): that bound did not hold here"
        text = f"the step shares the cores with {workers_text(ev.workers)}{alone}: {_busy_text(ev)}"
        if sat == YES:
            return "cores", [], text
        return ("gpu" if device == "cuda" else "step"), ["cores"], f"{text} (within its interval of saturation)"
    # the data wait is the caller's lead (:func:`_on`): not said twice
    busy_dev = f"device busy {ev.device_busy:.0%}" if ev.device_busy is not None and device == "cuda" else ""
    shared = _shared(row)  # the GPU pipeline and the step measured together (trial gpu_shared)
    if device == "cuda" and shared is not None:
        return shared[0], [], "; ".join(filter(None, [busy_dev, shared[1]]))
    share = _num(row, "device_pipeline_frac")  # decode and augment on the GPU (augment.device: cuda)
    if device == "cuda" and share is not None:
        text = "; ".join(
            filter(None, [busy_dev, f"decoding and augmenting take {share:.0%} of the GPU's time beside the step"])
        )
        if share >= GPU_PIPELINE_SHARE:  # the GPU's own input work is a large part of what binds it
            return "gpu-pipeline", [], f"{text}: a lighter GPU pipeline or decoding on the CPU would free it"
        return "gpu", [], text
    return ("gpu" if device == "cuda" else "step"), [], busy_dev


def _shared(row: pd.Series) -> Optional[tuple[str, str]]:
    """(resource, basis) where the GPU pipeline shares the step's device and the two were measured together:
    'gpu-pipeline' when together they fall short of the step alone by more than the noise (the decode/augment
    takes GPU time the step needed), else 'gpu' (the step binds; the pipeline fits beside it)."""
    # the step alone as the same trial measured it, next to its together windows (the ceiling's trial otherwise)
    together = _num(row, "shared_bound_samples_per_s")
    alone = _num(row, "shared_step_alone") or _num(row, "step_bound_samples_per_s")
    if together is None or not alone:
        return None
    half = _num(row, "shared_bound_samples_per_s_noise") or 0.0
    overlap = _num(row, "shared_overlap_frac")
    mode = overlap_mode(row)
    how = (
        f"overlapped, {overlap:.0%} of its device time beside the step's"
        if mode in OVERLAPPED and overlap is not None
        else "serially, before each step"
        if mode == "off"
        else "beside it"
    )
    text = (
        f"the step with the GPU's decode/augment ({how}) runs at {together:,.0f} samples/s "
        f"(±{half:.0%}), {together / alone:.0%} of the step alone ({alone:,.0f})"
    )
    if together * (1 + half) < NEAR_BEST * alone:
        return "gpu-pipeline", f"{text}: the GPU's decode/augment binds"
    return "gpu", f"{text}: the step binds"


class Decision(NamedTuple):
    side: Optional[str]
    resource: Optional[str]
    also: list
    basis: str

    @property
    def verdict(self) -> str:
        return VERDICT_OF.get((self.side, self.resource if self.side != "balanced" else None), "unknown")


def _on(
    side: str, ev: Evidence, bounds: dict, row: pd.Series, device: str, lead: str, from_bounds: str = "unknown"
) -> Decision:
    res, also, text = (
        input_resource(ev, bounds, row, from_bounds) if side == "input" else step_resource(ev, bounds, row, device)
    )
    return Decision(side, res, also, "; ".join(filter(None, [lead, text])))


def decide_two_level(ev: Evidence, bounds: dict, row: pd.Series, device: str, from_bounds: str) -> Decision:
    """The side from the data wait's interval (the isolated bounds where it is not clear), then the resource."""
    wait = ev.waits()
    if wait is None:
        fb = side(from_bounds)
        if fb is None:
            return Decision(
                "balanced" if from_bounds == "balanced" else None,
                None,
                [],
                "no data-wait measurement"
                + ("" if from_bounds != "unknown" else ", and the step or loader bound was not measured"),
            )
        return _on(
            fb, ev, bounds, row, device, "no data-wait measurement: the side from the isolated bounds", from_bounds
        )
    if ev.workers == 0:  # loading and the step take turns in one process: the larger share binds
        lead = f"0 workers: loading takes {wait.text()} of the time, the step the rest"
        if wait.against(0.5) == YES:
            return Decision(
                "input", "workers", [], f"{lead}; the training process loads every batch itself: workers would help"
            )
        return _on("step", ev, bounds, row, device, lead)
    waits = f"the step waits for data {wait.text()} of the time"
    if from_bounds == "balanced" and wait.against(WAIT_INPUT) == NO:
        return Decision(
            "balanced",
            None,
            [],
            f"the loader alone and the step alone are within {BALANCED:.0%} of "
            f"each other or within their measured noise, and {waits}: speeding "
            "up one side alone gains little",
        )
    if wait.against(WAIT_INPUT) == YES:
        return _on("input", ev, bounds, row, device, waits, from_bounds)
    if wait.against(WAIT_STEP) == NO:
        return _on("step", ev, bounds, row, device, waits)
    between = f"{waits} (the interval reaches {WAIT_STEP:.0%} or {WAIT_INPUT:.0%})"
    if side(from_bounds):
        return _on(
            side(from_bounds),
            ev,
            bounds,
            row,
            device,
            f"{between}: the side from the isolated bounds ({from_bounds})",
            from_bounds,
        )
    return Decision(
        "balanced", None, [], f"{between}, and the isolated bounds do not separate: neither side binds clearly"
    )


def decide(ev: Evidence, bounds: dict, row: pd.Series, device: str, from_bounds: str) -> tuple[str, str]:
    """(verdict, basis): the one-word name of :func:`decide_two_level`'s (side, resource)."""
    d = decide_two_level(ev, bounds, row, device, from_bounds)
    return d.verdict, d.basis


def side(verdict: str) -> Optional[str]:
    return "step" if verdict in STEP_SIDE else "input" if verdict in INPUT_SIDE else None


def disagreement(
    verdict: str,
    from_bounds: str,
    bounds: dict,
    rate: float,
    predicted: float,
    noise: Optional[float],
    predicted_noise: Optional[float] = None,
) -> Optional[str]:
    """Text when the isolated bounds point the other way, or predict a rate the trial did not reach.

    A prediction misses when its error passes :data:`BALANCED` and the two intervals do not meet: the trial's
    (``noise``) and the binding bound's (``predicted_noise``; taken as wide as the trial's where its trial
    recorded none). A bound timed in few windows has a wide interval of its own: its figure's error beside the
    trial's is not shown beyond the noise, as ``watch --tune`` reads its own-count check (both intervals)."""
    notes = []
    if side(verdict) and side(from_bounds) and side(verdict) != side(from_bounds):
        figures = ", ".join(f"{k} {v:,.0f}/s" for k, v in bounds.items() if _known(v))
        notes.append(
            f"the isolated bounds say {from_bounds} ({figures} alone); the trial's own evidence says {verdict}"
        )
    if _known(predicted) and rate and noise is not None:
        err, pred_noise = predicted / rate - 1, noise if predicted_noise is None else predicted_noise
        if abs(err) > max(noise + pred_noise, BALANCED):
            notes.append(
                f"predicted {predicted:,.0f} vs measured {rate:,.0f} samples/s ({err:+.0%}), beyond the "
                f"measured noise (±{noise:.0%} measured, "
                + (
                    f"±{pred_noise:.0%} predicted)"
                    if predicted_noise is not None
                    else "the prediction's interval not recorded: taken as wide)"
                )
            )
    return "; ".join(notes) or None


def _noise(row: pd.Series) -> Optional[float]:
    lo, hi, mid = _num(row, "samples_per_s_ci95_low"), _num(row, "samples_per_s_ci95_high"), _num(row, "samples_per_s")
    return (hi - lo) / 2 / mid if None not in (lo, hi, mid) and mid else None


def verdict_row(row: pd.Series, ws, rates, cores: float, device: str, keys: list[str]) -> dict:
    """One end-to-end trial's verdict, basis, isolated-bound prediction and its error."""
    predicted, bounds = predict(row, ws, rates, cores)
    from_bounds = classify(row, bounds, device)
    rate, ev = row["samples_per_s"], evidence(row, cores)
    d = decide_two_level(ev, bounds, row, device, from_bounds)
    verdict, basis = d.verdict, d.basis
    bound = bounds["io"] if verdict == "io-bound" else predicted
    return {
        "trial_id": row["trial_id"],
        **{k: _clean(row.get(k)) for k in keys},
        "num_workers": ev.workers,
        "verdict": verdict,
        "side": d.side,
        "resource": d.resource,
        "also": d.also,
        "verdict_basis": basis,
        "bounds_verdict": from_bounds,
        "disagreement": disagreement(
            verdict, from_bounds, bounds, rate, predicted, _noise(row), prediction_noise(row, bounds)
        ),
        "samples_per_s": rate,
        "samples_per_s_ci95_low": row.get("samples_per_s_ci95_low"),
        "samples_per_s_ci95_high": row.get("samples_per_s_ci95_high"),
        "predicted_samples_per_s": predicted,
        "prediction_error_frac": (predicted - rate) / rate if _known(predicted) else None,
        "of_binding_bound_frac": rate / bound if _known(bound) else None,
        "step_bound_samples_per_s": bounds["step"],
        "cpu_bound_samples_per_s": bounds["cpu"],
        "io_bound_samples_per_s": bounds["io"],
        "cores_bound_samples_per_s": bounds["cores"],
        "data_wait_frac": ev.wait,
        "device_busy_frac": ev.device_busy,
        "busy_cores": ev.busy_cores,
        "run_cores": ev.run_cores,
        "foreign_cores": ev.foreign_cores,
        "gpu_util_pct_mean": row.get("gpu_util_pct_mean") if device == "cuda" else None,
        "worker_cpu_util_frac": ev.worker_busy,
        "worker_capacity_samples_per_s": worker_capacity(row),
        "handoff_samples_per_s": _num(row, "handoff_samples_per_s"),
    }


def verdicts(
    trials: pd.DataFrame,
    cores: float,
    device: str = "cuda",
    joined: Optional[pd.DataFrame] = None,
    parts: Optional[list] = None,
) -> pd.DataFrame:
    """One row per end-to-end trial: verdict, its basis, the isolated bounds' view, prediction and error.
    ``joined``: ``curves(trials)`` when the caller has it already; ``parts``: its groups, each (key, rows,
    :class:`CpuCurve`), likewise (the re-draws: ``confidence.Layout``)."""
    if parts is None:
        parts = [
            (key, group, cpu_curve(trials, group.iloc[0]))
            for key, group in groups(curves(trials) if joined is None else joined)
        ]
    out = []
    for _, group, (ws, rates) in parts:
        keys = present_group_keys(group)
        out += [verdict_row(row, ws, rates, cores, device, keys) for _, row in group.iterrows()]
    return pd.DataFrame(out)


def at_recommended(mine: pd.DataFrame, recommended: int) -> Optional[pd.Series]:
    """The verdict row the answer gives at the recommended count (``mine``: the group's verdict rows).

    Its own, unless it says more workers would help (resource ``workers``) while a larger count was
    measured: the recommendation is the smallest count within reach of the best, so a larger one gained
    too little to recommend (under 5%, or not separable from it), and "more workers" is refuted by
    measurement. The answer then names the next resource within its interval of binding at the recommended
    count itself, on its own side; only where there is none, what binds at the fastest larger count. Its
    basis says why. Without this, runs of one workload answered "too few workers" at the recommended count
    where others answered "cores full" at a larger measured one, and, where the workers came first at the
    recommended count with the cores within their interval there, took the larger count's side: one answer
    now (docs/measured.md, "The answer at the recommended count")."""
    at = mine[mine["num_workers"] == recommended] if len(mine) else mine
    if at.empty:
        return None
    row = at.iloc[0]
    more = mine[mine["num_workers"] > recommended]
    if row["resource"] != "workers" or more.empty:
        return row
    other = more.loc[more["samples_per_s"].idxmax()].copy()
    if other["resource"] == "workers":
        return row
    why = (
        f"more workers were measured and did not help: {int(other['num_workers'])} workers ran at "
        f"{other['samples_per_s']:,.0f} samples/s against {row['samples_per_s']:,.0f} at {recommended} (not "
        "enough to recommend them)"
    )
    also = list(row["also"]) if isinstance(row.get("also"), (list, tuple, np.ndarray)) else []
    nearest = next((r for r in also if r != "workers"), None)
    if nearest is None:
        other["verdict_basis"] = f"{why}, and there {other['verdict_basis']}"
        return other
    # the basis lists the resources within their interval in the order of ``also``, each after this joiner
    texts = str(row["verdict_basis"]).split(ALSO)[1:]
    text = texts[also.index(nearest)] if len(texts) == len(also) else ""
    own = row.copy()
    own["resource"], own["also"] = nearest, [r for r in also if r != nearest]
    own["verdict"] = VERDICT_OF.get((row["side"], nearest), row["verdict"])
    advice = ADVICE.get(nearest, nearest)
    own["verdict_basis"] = (
        f"{why}, and at {recommended}, within its interval of its limit: {text}: {advice}"
        if text
        else f"{why}: {advice}"
    )
    return own
