"""Verdicts: each end-to-end trial's own evidence first, the isolated bounds second.

An end-to-end trial measures directly how long the step waited for data
(``data_wait_frac``), and the monitor measures how busy the run's cores were
(``usable_busy_cores_mean``; the run's own processes ``run_cores_mean``, the rest
``foreign_cores_mean``) and how busy the workers were. Those decide the side:

* the step waits little (< ``WAIT_STEP``): the step binds — ``gpu-bound`` on a GPU,
  ``step-bound`` on a machine without one; when the usable cores are all busy and the step
  shares them with the workers (on a CPU device always; on a GPU when the step runs more than
  10% below its rate alone, and then from 80% of the cores busy) the cores bind: ``cores-bound``;
* the step waits much (>= ``WAIT_INPUT``): the input binds — ``io-bound`` when the pipeline
  runs at the storage's measured rate, ``cores-bound`` when the usable cores are all busy
  (more workers cannot help), ``loader-bound`` when the workers idle while the loader's main
  process (the hand-off) runs near a full core, ``cpu-bound`` when the workers compute most
  of the time (more workers would help), ``loader-bound`` when they idle although the storage keeps up, and
  ``input-bound`` when the storage was not measured and so cannot be told from the hand-off;
* in between, the isolated bounds decide (``bounds.classify``); ``balanced`` when they are
  close (and the step does not wait much) or missing;
* with 0 workers loading and the step take turns: the larger share of the time binds.

The thresholds follow TensorFlow's input-pipeline analyzer (>= 20% of step time waiting is
"highly input-bound", >= 5% "moderately"). The isolated-bound verdict and prediction stay
beside the evidence; when they disagree the row says so with both figures. A rate above its
bound is noise, not a different bottleneck, so the evidence never reads it as one.
"""
from __future__ import annotations

from typing import NamedTuple, Optional

import pandas as pd

from .bounds import (BALANCED, _clean, _known, classify, cpu_curve, curves, groups, handoff_saturated, predict,
                     present_group_keys, step_verdict, waits_on_storage, worker_capacity)

WAIT_INPUT = 0.20  # the step waits >= 20% of the wall time: input-bound
WAIT_STEP = 0.05  # the step waits < 5%: the step binds
SATURATED = 0.90  # >= 90% of the usable cores busy: the machine's cores are the limit
# a step running > 10% below its rate alone, hardly waiting for data, with >= 80% of the cores busy:
# its host side is starved (a machine-wide mean hides each DDP rank's full slice: on the 2xH200 box
# 2 ranks x (15 workers + the training process) kept 28.7 of 32 cores busy at 70% of the 2-GPU ceiling)
SLOWED_SATURATED = 0.80
WORKERS_BUSY = 0.70  # workers computing >= 70% of their time: they are the CPU limit, not waiting
STEP_SIDE = {"gpu-bound", "step-bound"}
INPUT_SIDE = {"cpu-bound", "io-bound", "loader-bound", "input-bound", "cores-bound"}


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


def _num(row: pd.Series, key: str) -> Optional[float]:
    v = row.get(key)
    return float(v) if v is not None and v == v else None


def evidence(row: pd.Series, cores: float) -> Evidence:
    """The trial's own figures; busy cores fall back on the machine-wide CPU share."""
    w = int(row["num_workers"])
    main, workers = _num(row, "main_cpu_pct_mean"), _num(row, "workers_cpu_pct_mean")
    run = _num(row, "run_cores_mean")
    if run is None and main is not None:
        run = (main + (workers or 0.0)) / 100
    busy = _num(row, "usable_busy_cores_mean")
    if busy is None and _num(row, "cpu_util_pct_mean") is not None:
        busy = _num(row, "cpu_util_pct_mean") / 100 * cores
    cpus = _num(row, "usable_cores")
    if cpus is not None and cpus > cores + 0.5:  # a CPU quota below the CPUs it may run on: others' load on
        busy = run  # those CPUs does not take the run's quota, so only the run's own use counts
    return Evidence(_num(row, "data_wait_frac"), busy, run, _num(row, "foreign_cores_mean"), cores, w,
                    workers / (100 * w) if w and workers is not None else None, _num(row, "device_busy_frac"))


def _saturated(ev: Evidence, share: float = SATURATED) -> bool:
    return ev.busy_cores is not None and ev.busy_cores >= share * ev.cores


def _busy_text(ev: Evidence) -> str:
    if ev.busy_cores is None:
        return "busy cores not measured"
    own = f"the run {ev.run_cores:.1f}" if ev.run_cores is not None else "the run"
    other = f", other processes {ev.foreign_cores:.1f}" if ev.foreign_cores and ev.foreign_cores >= 0.1 else ""
    return f"{ev.busy_cores:.1f} of {ev.cores:g} usable cores busy ({own}{other})"


def _input_side(ev: Evidence, bounds: dict, rate: float, fallback: str, row: pd.Series) -> tuple[str, str]:
    """Which input bound: the step waits for data; the cores, the storage, the workers or the hand-off."""
    waits = f"the step waits for data {ev.wait:.0%} of the time"
    io, cpu = bounds.get("io"), bounds.get("cpu")
    if _known(io) and (waits_on_storage(cpu, io) or rate >= (1 - 2 * BALANCED) * io):
        return "io-bound", f"{waits}; the pipeline runs at the storage's rate ({io:,.0f} samples/s read alone)"
    if _saturated(ev):
        return "cores-bound", f"{waits} with {_busy_text(ev)}: more workers cannot help, more cores or a " \
                              "cheaper pipeline would"
    if ev.workers == 0:
        return "cpu-bound", f"{waits}: with 0 workers the training process loads every batch itself"
    if ev.worker_busy is None:
        return (fallback, f"{waits}; workers' CPU not measured: from the isolated bounds") \
            if fallback in INPUT_SIDE else ("input-bound", f"{waits}; workers' CPU not measured")
    if ev.worker_busy < WORKERS_BUSY and handoff_saturated(row):
        return "loader-bound", f"{waits}; the workers compute only {ev.worker_busy:.0%} of their time while the " \
                               f"loader alone kept its main process {row['loader_main_cpu_pct']:.0f}% busy: the " \
                               "hand-off (receive, unpickle, pin: about one core) is the limit; send smaller " \
                               "batches (uint8) rather than adding workers or cores"
    if ev.worker_busy >= WORKERS_BUSY:
        return "cpu-bound", f"{waits}; the {ev.workers} workers compute {ev.worker_busy:.0%} of their time " \
                            f"and {_busy_text(ev)}: more workers would help"
    if _known(io):
        return "loader-bound", f"{waits}, yet the workers compute only {ev.worker_busy:.0%} of their time and the " \
                               f"storage keeps up ({io:,.0f} samples/s alone): batches do not get through " \
                               "(collate, pinning, the main process)"
    return "input-bound", f"{waits}; the workers compute only {ev.worker_busy:.0%} of their time, and the " \
                          "storage was not measured, so slow reads cannot be told from the hand-off"


def decide(ev: Evidence, bounds: dict, row: pd.Series, device: str, from_bounds: str) -> tuple[str, str]:
    """(verdict, basis): the trial's evidence first; ``from_bounds`` (bounds.classify) where it is silent."""
    rate = row["samples_per_s"]
    if ev.wait is None:
        why = "no data-wait measurement"
        return (from_bounds, f"{why}: from the isolated bounds") if from_bounds != "unknown" else \
            ("unknown", f"{why}, and the step or loader bound was not measured")
    if ev.workers == 0:  # loading and the step take turns in one process: the larger share binds
        turns = f"0 workers: loading takes {ev.wait:.0%} of the time, the step the rest"
        if ev.wait >= 0.5:
            return _input_side(ev, bounds, rate, from_bounds, row)[0], turns
        return step_verdict(device), turns
    if from_bounds == "balanced" and ev.wait < WAIT_INPUT:
        return "balanced", f"the loader alone and the step alone are within {BALANCED:.0%} of each other or " \
                           f"within their measured noise, and the step waits {ev.wait:.0%} of the time: speeding " \
                           "up one side alone gains little"
    if ev.wait < WAIT_STEP:
        step = bounds.get("step")
        slowed = _known(step) and rate < (1 - 2 * BALANCED) * step  # the step runs slower than alone
        starved = _saturated(ev) or (slowed and _saturated(ev, SLOWED_SATURATED))
        if ev.workers > 0 and starved and (device != "cuda" or slowed):
            # the training process shares the cores with the workers: its host side (launches, the
            # hand-off, the copy) is starved, so the step itself slows although it hardly waits
            alone = f", at {rate / step:.0%} of its rate alone" if _known(step) else ""
            return "cores-bound", f"the step waits only {ev.wait:.0%}{alone}, but it shares the cores with " \
                                  f"{ev.workers} workers: {_busy_text(ev)}"
        busy = f"; device busy {ev.device_busy:.0%}" if ev.device_busy is not None and device == "cuda" else ""
        return step_verdict(device), f"the step waits for data only {ev.wait:.0%} of the time{busy}"
    if ev.wait >= WAIT_INPUT:
        return _input_side(ev, bounds, rate, from_bounds, row)
    between = f"the step waits {ev.wait:.0%} of the time (between {WAIT_STEP:.0%} and {WAIT_INPUT:.0%})"
    if from_bounds != "unknown":
        return from_bounds, f"{between}: from the isolated bounds"
    return "balanced", f"{between}, and the isolated bounds were not both measured: neither side binds clearly"


def side(verdict: str) -> Optional[str]:
    return "step" if verdict in STEP_SIDE else "input" if verdict in INPUT_SIDE else None


def disagreement(verdict: str, from_bounds: str, bounds: dict, rate: float, predicted: float,
                 noise: Optional[float]) -> Optional[str]:
    """Text when the isolated bounds point the other way, or predict a rate the trial did not reach."""
    notes = []
    if side(verdict) and side(from_bounds) and side(verdict) != side(from_bounds):
        figures = ", ".join(f"{k} {v:,.0f}/s" for k, v in bounds.items() if _known(v))
        notes.append(f"the isolated bounds say {from_bounds} ({figures} alone); the trial's own evidence says "
                     f"{verdict}")
    if _known(predicted) and rate and noise is not None:
        err = predicted / rate - 1
        if abs(err) > max(2 * noise, BALANCED):
            notes.append(f"predicted {predicted:,.0f} vs measured {rate:,.0f} samples/s ({err:+.0%}), beyond the "
                         f"measured noise (±{noise:.0%})")
    return "; ".join(notes) or None


def _noise(row: pd.Series) -> Optional[float]:
    lo, hi, mid = _num(row, "samples_per_s_ci95_low"), _num(row, "samples_per_s_ci95_high"), _num(row, "samples_per_s")
    return (hi - lo) / 2 / mid if None not in (lo, hi, mid) and mid else None


def verdict_row(row: pd.Series, ws, rates, cores: float, device: str, keys: list[str]) -> dict:
    """One end-to-end trial's verdict, basis, isolated-bound prediction and its error."""
    predicted, bounds = predict(row, ws, rates, cores)
    from_bounds = classify(row, bounds, device)
    rate, ev = row["samples_per_s"], evidence(row, cores)
    verdict, basis = decide(ev, bounds, row, device, from_bounds)
    bound = bounds["io"] if verdict == "io-bound" else predicted
    return {
        "trial_id": row["trial_id"], **{k: _clean(row.get(k)) for k in keys},
        "num_workers": ev.workers, "verdict": verdict, "verdict_basis": basis, "bounds_verdict": from_bounds,
        "disagreement": disagreement(verdict, from_bounds, bounds, rate, predicted, _noise(row)),
        "samples_per_s": rate, "samples_per_s_ci95_low": row.get("samples_per_s_ci95_low"),
        "samples_per_s_ci95_high": row.get("samples_per_s_ci95_high"),
        "predicted_samples_per_s": predicted,
        "prediction_error_frac": (predicted - rate) / rate if _known(predicted) else None,
        "of_binding_bound_frac": rate / bound if _known(bound) else None,
        "step_bound_samples_per_s": bounds["step"], "cpu_bound_samples_per_s": bounds["cpu"],
        "io_bound_samples_per_s": bounds["io"], "cores_bound_samples_per_s": bounds["cores"],
        "data_wait_frac": ev.wait, "device_busy_frac": ev.device_busy, "busy_cores": ev.busy_cores,
        "run_cores": ev.run_cores, "foreign_cores": ev.foreign_cores,
        "gpu_util_pct_mean": row.get("gpu_util_pct_mean") if device == "cuda" else None,
        "worker_cpu_util_frac": ev.worker_busy, "worker_capacity_samples_per_s": worker_capacity(row)}


def verdicts(trials: pd.DataFrame, cores: float, device: str = "cuda") -> pd.DataFrame:
    """One row per end-to-end trial: verdict, its basis, the isolated bounds' view, prediction and error."""
    out = []
    for _, group in groups(curves(trials)):
        ws, rates = cpu_curve(trials, group.iloc[0])
        keys = present_group_keys(group)
        out += [verdict_row(row, ws, rates, cores, device, keys) for _, row in group.iterrows()]
    return pd.DataFrame(out)
