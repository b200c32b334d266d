"""Pure row builders: the columns a trial adds from what it recorded (no I/O, no timing)."""
from __future__ import annotations

import os
from typing import NamedTuple, Optional

import numpy as np

from ..loader import worker_pids
from ..monitors import total_pss_mb


class StepRecord(NamedTuple):
    """One measured step: its wait for data (None without a loader), clock marks, stage seconds."""

    wait_s: Optional[float]
    marks: tuple
    stage_s: Optional[object] = None


def pct(x) -> str:
    return "?" if x is None else f"{x:.0%}"


def memory_columns(it) -> dict:
    """RAM the main process and its workers take together at steady state (PSS, after the windows)."""
    return {"pss_mb_steady": total_pss_mb([os.getpid(), *worker_pids(it)])}


def stage_columns(names: list[str], stage_sum_s: np.ndarray, samples: int) -> dict:
    """Mean µs per sample and share of worker time for each stage (+ collate)."""
    names = list(names) + ["collate"]
    total = float(stage_sum_s.sum()) or 1.0
    cols = {}
    for name, s in zip(names, stage_sum_s):
        cols[f"stage_us_per_sample.{name}"] = float(s) / samples * 1e6
        cols[f"stage_share.{name}"] = float(s) / total
    return cols


def step_columns(step, records: list, m) -> dict:
    """Data wait share, copy and compute times of the measured steps (clocks read after sync)."""
    if not records:
        return {}
    measured = m.t_measure_end - m.t_measure_start
    h2d = np.array([step.clock.elapsed_ms(r.marks[0], r.marks[1]) for r in records])
    compute = np.array([step.clock.elapsed_ms(r.marks[1], r.marks[2]) for r in records])
    cols = {"tf32": step.settings["tf32"], "cudnn_benchmark": step.settings["cudnn_benchmark"],
            "h2d_ms_mean": float(h2d.mean()), "compute_ms_p50": float(np.median(compute)),
            "compute_ms_p95": float(np.percentile(compute, 95)),
            "device_busy_frac": float((h2d.sum() + compute.sum()) / 1e3 / measured),
            "batch_ms_mean": float(measured / len(records) * 1e3)}
    if records[0].wait_s is not None:  # gpu_ceiling has no loader, so no wait to report
        wait = np.array([r.wait_s for r in records])
        cols |= {"data_wait_frac": float(wait.sum() / measured), "data_wait_ms_p50": float(np.median(wait) * 1e3),
                 "data_wait_ms_p95": float(np.percentile(wait, 95) * 1e3)}
    return cols


def stage_totals(dataset, records: list, m) -> dict:
    stage = [r.stage_s for r in records if r.stage_s is not None]
    if not stage or not getattr(dataset, "stage_timing", False):
        return {}
    return stage_columns(dataset.stage_names, np.sum([s.numpy() for s in stage], axis=0),
                         m.stats()["samples_measured"])
