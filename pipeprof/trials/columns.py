"""Pure row builders: the columns a trial adds from what it recorded (no I/O, no timing)."""

from __future__ import annotations

import os
import re
from typing import NamedTuple, Optional

import numpy as np
import psutil
import torch

from pipeprof.measure.loader import worker_pids
from pipeprof.measure.monitors import total_pss_mb
from pipeprof.stats import share_ci95


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


def sample_columns(tally, policy) -> dict:
    """Bad samples skipped and outsize images seen over the trial (a ``data.dataset.SampleTally``); a trial
    that skipped more than ``policy.max_bad_frac`` of its samples is failed, with that reason."""
    if not tally.reported:
        return {}
    tried = tally.samples + tally.bad
    frac = tally.bad / tried if tried else 0.0
    first = "; ".join(f"{where}: {why}" for where, why in tally.bad_first) or None
    cols = {
        "bad_samples": tally.bad,
        "bad_samples_frac": frac,
        "bad_samples_first": first,
        "large_images": tally.large,
        "large_images_first": "; ".join(f"{w} ({p / 1e6:.0f} MP)" for w, p in tally.large_first) or None,
        # their share of the workers' clocked time; None when the clocks were off for any of them
        "large_images_cost_frac": tally.large_s / tally.stage_s
        if tally.large and tally.large_timed and tally.stage_s > 0
        else None,
    }
    if frac > policy.max_bad_frac:
        cols |= {
            "status": "failed",
            "error": f"{tally.bad} of {tried} samples ({frac:.1%}) could not be read or decoded, more than "
            f"data.max_bad_frac ({policy.max_bad_frac:.1%}); first: {first}",
        }
    return cols


_MIB = 2**20
#: what an allocator says when memory ran out: CUDA's "out of memory", the CPU allocator's "can't allocate memory"
OOM_WORDS = re.compile(r"out of memory|(?:could not|can't|cannot|unable to|failed to) allocate", re.IGNORECASE)


def is_oom(exc: BaseException) -> bool:
    """The trial ran out of memory (device or host), as opposed to failing: the batch did not fit."""
    if isinstance(exc, (torch.cuda.OutOfMemoryError, MemoryError)):
        return True
    return isinstance(exc, RuntimeError) and bool(OOM_WORDS.search(str(exc)))


def oom_columns(device) -> dict:
    """The memory held when a trial ran out of it, read at once (before the sweep releases anything): the
    device's allocated and peak bytes since the trial began on CUDA, the process's RSS on a CPU device."""
    if device.type == "cuda":
        return {
            "oom_allocated_mb": torch.cuda.memory_allocated(device) / _MIB,
            "oom_peak_allocated_mb": torch.cuda.max_memory_allocated(device) / _MIB,
        }
    return {"oom_rss_mb": psutil.Process().memory_info().rss / _MIB}


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
    cols = {
        "tf32": step.settings["tf32"],
        "cudnn_benchmark": step.settings["cudnn_benchmark"],
        "h2d_ms_mean": float(h2d.mean()),
        "compute_ms_p50": float(np.median(compute)),
        "compute_ms_p95": float(np.percentile(compute, 95)),
        "device_busy_frac": float((h2d.sum() + compute.sum()) / 1e3 / measured),
        "batch_ms_mean": float(measured / len(records) * 1e3),
    }
    if records[0].wait_s is not None:  # gpu_ceiling has no loader, so no wait to report
        wait = np.array([r.wait_s for r in records])
        cols |= {
            "data_wait_frac": float(wait.sum() / measured),
            "data_wait_ms_p50": float(np.median(wait) * 1e3),
            "data_wait_ms_p95": float(np.percentile(wait, 95) * 1e3),
        } | window_waits(wait, m.windows)
    return cols


def window_waits(wait: np.ndarray, windows: list) -> dict:
    """The data-wait share of each timed window (its batches' waits over its duration) and the 95%
    interval of their mean: a verdict compares the interval, not one figure, with its thresholds."""
    shares, start = [], 0
    for w in windows:
        n = w.batches
        if n and w.t_end > w.t_start and start + n <= len(wait):
            shares.append(float(wait[start : start + n].sum() / (w.t_end - w.t_start)))
        start += n
    lo, hi = share_ci95(shares)  # a share: within [0, 1]
    return {"window_data_wait": shares, "data_wait_frac_ci95_low": lo, "data_wait_frac_ci95_high": hi}


def stage_totals(dataset, records: list, m) -> dict:
    stage = [r.stage_s for r in records if r.stage_s is not None]
    if not stage or not getattr(dataset, "stage_timing", False):
        return {}
    return stage_columns(dataset.stage_names, np.sum([s.numpy() for s in stage], axis=0), m.stats()["samples_measured"])


# ---- N-GPU trials: the job's row from its ranks' rows ------------------------------------------

RANK_SUMMED = (
    "samples_per_s",
    "samples_per_s_ci95_low",
    "samples_per_s_ci95_high",
    "samples_per_s_min",
    "samples_per_s_max",
    "main_cpu_pct_mean",
    "workers_cpu_pct_mean",
    "pss_mb_steady",
)
RANK_MEAN = ("data_wait_frac", "samples_per_s_cv")


def combine_ranks(ranks: list[dict], gpus: int) -> dict:
    """The job's row: rates and CPU summed over ranks (their windows ran at the same time), data
    wait averaged. The rate's interval and extremes are summed too: exact for the step kinds, whose
    ranks time the same windows on rank 0's clock (every window's job rate is N times a rank's), and
    wider than the job's for the loaders alone, whose ranks time their own windows. Also: the slowest
    rank named with why, and how many of the job's ranks reported (a node of a multi-machine job
    holds its own only; ``merge`` joins the nodes' rows).

    Slowest: the lowest rate; in DDP the ranks step in lockstep and their rates agree, so then the
    rank that waited longest for data (it holds the others at each all-reduce)."""
    ranks = sorted(ranks, key=lambda r: r["rank"])
    first = ranks[0]
    row = {k: v for k, v in first.items() if k not in ("rank", "local_rank", "node", "cpus", "cores", "pid")}
    for k in RANK_SUMMED:
        vals = [r.get(k) for r in ranks]
        row[k] = sum(vals) if all(v is not None for v in vals) else None
    for k in RANK_MEAN:
        vals = [r[k] for r in ranks if r.get(k) is not None]
        row[k] = sum(vals) / len(vals) if vals else None
    row["unstable"] = any(bool(r.get("unstable")) for r in ranks)
    row["unstable_reason"] = (
        "; ".join(f"rank {r['rank']}: {r['unstable_reason']}" for r in ranks if r.get("unstable_reason")) or None
    )
    low = min(r.get("samples_per_s") or 0 for r in ranks)
    tied = [r for r in ranks if (r.get("samples_per_s") or 0) <= low * 1.005]  # within 0.5%: equal
    slow = max(tied, key=lambda r: r.get("data_wait_frac") or 0)
    total = row["samples_per_s"]
    partial = (
        (
            f"this node's {len(ranks)} of {gpus} ranks only: rates and CPU count them alone; "
            "`pipeprof merge` joins the nodes' run folders into the whole job"
        )
        if len(ranks) < gpus
        else None
    )
    return row | {
        "gpus": gpus,
        "partial_job": partial,
        "ranks_reported": len(ranks),
        "nodes_reported": len({r["node"] for r in ranks}),
        "samples_per_s_per_gpu": None if total is None else total / len(ranks),
        "cores": sum(r.get("cores") or 0 for r in ranks),
        "slowest_rank": slow["rank"],
        "slowest_rank_samples_per_s": slow.get("samples_per_s"),
        "slowest_rank_data_wait_frac": slow.get("data_wait_frac"),
        "slowest_rank_cpu_pct": _cpu(slow),
        "slowest_rank_why": _why_slow(slow),
    }


def _cpu(rank: dict) -> Optional[float]:
    main, workers = rank.get("main_cpu_pct_mean"), rank.get("workers_cpu_pct_mean")
    return None if main is None else main + (workers or 0)


def _why_slow(rank: dict) -> str:
    wait = rank.get("data_wait_frac")
    parts = [f"rank {rank['rank']} on {rank.get('node')} CPUs {rank.get('cpus')} ({rank.get('cores')} cores)"]
    if wait is not None:
        parts.append(f"waited for data {wait:.0%} of the time")
    cpu = _cpu(rank)
    if cpu is not None:
        parts.append(f"used {cpu / 100:.1f} cores (main process and its workers)")
    return ", ".join(parts)
