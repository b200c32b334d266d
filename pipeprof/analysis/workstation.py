"""Sizing a workstation: what each candidate machine would deliver for the measured workloads, and the cheapest
that keeps the GPUs near their ceiling (``pipeprof size RUN_DIR... [--machines FILE | --cores ... --gpus ...]``).

A *workload* is one answer's group of a stored run (model, precision, preset, batch ...) with what the run
measured for it: the step's ceiling (``gpu_ceiling``, its 95% interval), the loader's CPU curve (``cpu_pipeline``
at each worker count, with intervals), the training process's CPU per sample, the hand-off limit where the
``handoff`` trial measured one, and the machine's usable cores. A *candidate* is a machine to buy: cores, GPUs
(and their model), threads per core, an optional price.

For a candidate with C cores and G GPUs (:func:`predict`): the GPUs take G x the step's ceiling, times the
scaling efficiency a run measured for G GPUs, else assumed linear (labelled); the CPUs feed the curve at the
workers C cores leave after G training processes (``advice.rate_for_cores``, capped at G hand-offs); the rate is
the smaller. Its interval reads the same on the curve's interval ends. Past the cores any run measured the
figure is extrapolated (marked) and its low end falls further by the curve's measured per-worker fall-off between
its last two counts, once per doubling past them: a buyer reads the range, not the middle. Pure: no I/O.
"""

from __future__ import annotations

import math
from typing import NamedTuple, Optional

import numpy as np
import pandas as pd

from pipeprof.schema import DEFAULT_GPU_DECODER, GROUP_KEYS, OVERLAP_TAGS, on_gpu_pipeline, overlap_mode
from pipeprof.stats import cost_bounds

from .advice import rate_at_workers, rate_for_cores
from .bounds import BOUND_KEYS, cpu_curve_rows, handoff_limit, matching, ok, worker_cores
from .scaling import job_rates

#: the candidates' core counts and the target share of the GPUs' ceiling where none are given (``pipeprof size``,
#: the report's sizing section)
DEFAULT_CORES = (4, 8, 12, 16, 24, 32)
DEFAULT_TARGET = 0.9


class Candidate(NamedTuple):
    name: str
    cores: int
    gpus: int = 1
    gpu: Optional[str] = None  # the GPU's model, where the machines file names one
    threads_per_core: int = 1
    price: Optional[float] = None


class Workload(NamedTuple):
    label: str
    step: tuple  # the step's ceiling on one GPU: (samples/s, low, high)
    # the loader's CPU curve: the cores its workers had (bounds.worker_cores) and rates (median, low, high)
    ws: np.ndarray
    rates: np.ndarray
    lows: np.ndarray
    highs: np.ndarray
    main_s: float  # the training process's CPU seconds per sample
    cores: float  # the measuring machine's usable cores
    cap: float = math.inf  # the hand-off limit one loader passes (inf: not measured)
    scaling: dict = {}  # GPUs -> measured scaling efficiency (DDP trials)
    gpu: Optional[str] = None  # the GPU the run measured its step on (its name)


MACHINE_FIELDS = {"name": str, "cores": int, "gpus": int, "gpu": str, "threads_per_core": int, "price": float}


def parse_machines(data) -> list[Candidate]:
    """Candidates from a machines file's content (``{"machines": [...]}`` or a list); ValueError naming the
    machine and the field that is wrong."""
    items = data.get("machines") if isinstance(data, dict) else data
    if not isinstance(items, list) or not items:
        raise ValueError("the machines file needs a list 'machines:' of at least one machine")
    out = []
    for i, m in enumerate(items):
        where = f"machines[{i}]" + (f" ({m.get('name')})" if isinstance(m, dict) and m.get("name") else "")
        if not isinstance(m, dict):
            raise ValueError(f"{where}: a machine is a mapping of {', '.join(MACHINE_FIELDS)}")
        unknown = sorted(set(m) - set(MACHINE_FIELDS))
        if unknown:
            raise ValueError(f"{where}: unknown field {unknown[0]!r}; a machine has {', '.join(MACHINE_FIELDS)}")
        if "cores" not in m:
            raise ValueError(f"{where}: 'cores' is required (physical cores for the data loading)")
        for field in ("cores", "gpus", "threads_per_core"):
            v = m.get(field, 1)
            if isinstance(v, bool) or not isinstance(v, int) or v < 1:
                raise ValueError(f"{where}: '{field}' must be a whole number of at least 1, not {v!r}")
        price = m.get("price")
        if price is not None and (isinstance(price, bool) or not isinstance(price, (int, float)) or price <= 0):
            raise ValueError(f"{where}: 'price' must be a positive number, not {price!r}")
        fields = {k: m[k] for k in MACHINE_FIELDS if k in m}
        out.append(Candidate(**{"name": f"{m['cores']}c x {m.get('gpus', 1)} GPU"} | fields))
    return out


def grid(cores: list[int], gpus: list[int]) -> list[Candidate]:
    """The ``--cores 8,16 --gpus 1,2`` shortcut: every pair, unpriced."""
    return [Candidate(f"{c} core{'s' * (c > 1)}, {g} GPU{'s' * (g > 1)}", c, g) for g in gpus for c in cores]


def predict(w: Workload, c: Candidate) -> dict:
    """What ``c`` would deliver for ``w`` (see the module): samples/s with its interval, the binding resource,
    the share of the GPUs' ceiling, samples/s per unit of price, and whether it was extrapolated."""
    eff = w.scaling.get(c.gpus)
    scale = c.gpus * (eff if eff is not None else 1.0)
    gpu = [s * scale for s in w.step]
    cap = c.gpus * w.cap  # one loader per GPU process
    cpu = [rate_for_cores(c.cores, w.ws, r, w.main_s, w.cores, cap) for r in (w.rates, w.lows, w.highs)]
    extrapolated = cpu[0].extrapolated or c.cores > w.cores
    low_cpu = cpu[1].value * _falloff(w) ** _doublings(w, c.cores) if extrapolated else cpu[1].value
    rate, low, high = min(gpu[0], cpu[0].value), min(gpu[1], low_cpu), min(gpu[2], cpu[2].value)
    return {
        "workload": w.label,
        "machine": c.name,
        "cores": c.cores,
        "gpus": c.gpus,
        "samples_per_s": rate,
        "samples_per_s_low": low,
        "samples_per_s_high": high,
        "binding": "gpu" if gpu[0] <= cpu[0].value else "cpu" if cpu[0].value < cap else "handoff",
        # the CPUs' share of what the GPUs take (their ceiling's median): the step's own spread is not the buyer's
        "of_ceiling_frac": min(1.0, cpu[0].value / gpu[0]),
        "of_ceiling_low_frac": min(1.0, low_cpu / gpu[0]),
        "extrapolated": bool(extrapolated),
        "gpu_scaling": "measured" if eff is not None else ("assumed linear" if c.gpus > 1 else "one GPU"),
        "price": c.price,
        "samples_per_s_per_price": rate / c.price if c.price else None,
        "note": "; ".join(_caveats(w, c, bool(extrapolated), reaches=cpu[0].value >= 0.9 * gpu[0])),
    }


def _caveats(w: Workload, c: Candidate, extrapolated: bool, reaches: bool = False) -> list[str]:
    """What the row's figure assumes beyond what the run measured. ``reaches``: the CPUs deliver at least 90% of
    the GPUs' ceiling, where an unmeasured hand-off limit may bind instead (a masked run that held below the
    step where the table read its ceiling: docs/verdicts.md, "Sizing a workstation")."""
    out = ["extrapolated"] if extrapolated else []
    if reaches and not math.isfinite(w.cap):
        out.append("hand-off not measured (trials: handoff): one loader may pass fewer")
    if c.gpu and w.gpu and c.gpu.lower() not in w.gpu.lower():
        out.append(f"the step's ceiling is this run's {w.gpu}'s, not measured on a {c.gpu}")
    if c.threads_per_core > 1:
        out.append("cores counted, not their SMT threads (the curve was measured one worker a core)")
    return out


def _falloff(w: Workload) -> float:
    """The curve's per-worker rate at its last count over that at the count before (at most 1)."""
    pos = np.flatnonzero(w.ws > 0)
    if len(pos) < 2:
        return 1.0
    a, b = pos[-2], pos[-1]
    return min(1.0, (w.rates[b] / w.ws[b]) / (w.rates[a] / w.ws[a]))


def _doublings(w: Workload, cores: int) -> float:
    top = float(max(w.ws.max(), 1.0))
    return max(0.0, math.log2(cores / top)) if cores > top else 0.0


def _ends(t: pd.DataFrame) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    rate = t["samples_per_s"].to_numpy(float)
    low = t.get("samples_per_s_ci95_low", t["samples_per_s"]).fillna(t["samples_per_s"]).to_numpy(float)
    high = t.get("samples_per_s_ci95_high", t["samples_per_s"]).fillna(t["samples_per_s"]).to_numpy(float)
    return rate, low, high


def label(key) -> str:
    """A workload's name from its group's settings (an answer's ``key``): every group key that names one, so that
    two groups of a run never share a name (batch, source and cache state too; the GPU pipeline, inference)."""
    words = [
        key.get("model"),
        key.get("precision"),
        "inference" if key.get("mode") == "inference" else None,
        key.get("preset"),
        "-".join(filter(None, ["gpu-augment", OVERLAP_TAGS.get(overlap_mode(key))])) if on_gpu_pipeline(key) else None,
        key.get("gpu_decoder") if key.get("gpu_decoder") not in (None, DEFAULT_GPU_DECODER) else None,
        f"bs{key['batch_size']}" if key.get("batch_size") is not None else None,
        key.get("source"),
        key.get("cache_state") if key.get("cache_state") not in (None, "n/a") else None,
    ]
    return " ".join(str(w) for w in words if w is not None and w == w)


#: the step's settings a workload's ceilings share: every GPU count (its N-GPU rows are the scaling) and link
STEP_KEYS = [k for k in BOUND_KEYS["gpu_ceiling"] if k not in ("gpus", "p2p")]


def workloads(run, skipped: bool = False) -> list[Workload]:
    """One workload per one-GPU answer of a stored run that measured both its step and its CPU curve, read as the
    analysis reads them (``bounds.cpu_curve_rows``, ``bounds.handoff_limit`` at the group's first end-to-end
    row); its N-GPU ceilings give the scaling (:func:`step_and_scaling`). An answer whose cores figures the
    analysis skipped (``cpu_figures_skipped``: no GPU, the GPU pipeline, a pipeline at the storage's pace) is not
    a workload: its curve does not say what cores deliver; ``skipped`` takes them all the same (the sizing check,
    whose masked runs measure what the table says, and whose known workload's CPU step stands in for a GPU's)."""
    t, out = run.trials.reset_index(drop=True), []
    machine = run.meta.get("machine") or {}
    usable = (machine.get("cores") or {}).get("usable") or 1
    gpu = next((g.get("name") for g in machine.get("gpus") or [] if g.get("name")), None)
    e2e = ok(t, "end_to_end")
    for a in (run.meta.get("analysis") or {}).get("groups") or []:
        if (a.key.get("gpus") or 1) > 1 or (a.cpu_figures_skipped and not skipped):  # N GPUs: the scaling
            continue
        rows = matching(e2e, pd.Series(a.key), GROUP_KEYS)
        if rows.empty:
            continue
        like = rows.iloc[0]
        one, scaling = step_and_scaling(matching(ok(t, "gpu_ceiling"), like, STEP_KEYS))
        rows = cpu_curve_rows(t, like)
        curve = t.iloc[rows]
        if one is None or len(curve) < 2:
            continue
        rates, lows, highs = _ends(curve)
        out.append(
            Workload(
                label(a.key),
                one,
                worker_cores(t, rows, float(usable)),
                rates,
                lows,
                highs,
                a.main_cpu_s_per_sample or 0.0,
                float(usable),
                handoff_limit(t, like),
                scaling,
                gpu,
            )
        )
    return out


def step_and_scaling(step: pd.DataFrame) -> tuple[Optional[tuple], dict]:
    """(the one-GPU ceiling as (median, low, high) of its trials, {GPUs: scaling efficiency}) from a workload's
    ``gpu_ceiling`` rows: an N-GPU row's rate is the job's total, so its efficiency is that over N one-GPU
    ceilings; of several link settings (``p2p``) the better; only whole jobs' rates (``scaling.job_rates``). (None,
    {}) without a one-GPU ceiling."""
    step = job_rates(step)
    gpus = step["gpus"].fillna(1) if "gpus" in step else pd.Series(1, index=step.index)
    one = step[gpus == 1]
    if one.empty:
        return None, {}
    ceiling = tuple(float(np.median(v)) for v in _ends(one))
    scaling = {
        int(n): float(rows["samples_per_s"].max()) / (n * ceiling[0]) for n, rows in step[gpus > 1].groupby(gpus)
    }
    return ceiling, scaling


def table(workloads: list[Workload], candidates: list[Candidate]) -> pd.DataFrame:
    return pd.DataFrame([predict(w, c) for w in workloads for c in candidates])


def cheapest(rows: pd.DataFrame, target: float) -> dict:
    """Per workload, and for all together, the candidate whose interval's low end reaches ``target`` of the GPUs'
    ceiling at the lowest price (the fewest cores, then GPUs, where unpriced); None where none does."""
    out = {}
    key = ["price", "cores", "gpus"] if rows["price"].notna().all() else ["cores", "gpus"]
    for name, g in rows.groupby("workload", sort=False):
        ok = g[g["of_ceiling_low_frac"] >= target].sort_values(key)
        out[name] = ok.iloc[0]["machine"] if len(ok) else None
    every = rows.groupby("machine", sort=False)["of_ceiling_low_frac"].min()
    fits = rows.drop_duplicates("machine").set_index("machine").loc[every[every >= target].index]
    out["all workloads"] = fits.sort_values(key).index[0] if len(fits) else None
    return out


def masked_pairs(run) -> pd.DataFrame:
    """The run's own masked pairs (``trials.kinds.cores_pair``) against the size table's model, one row per pair.

    The model's ratio of w cores to w workers on all the run's cores is the size table's arithmetic
    (:func:`predict`: the cores less the training process's share feed a worker a core, under the step and the
    hand-off) read at the CPU cost per sample that the pair's own all-CPU windows measured (:func:`pair_cpu`: its
    workers' and training process's CPU time); the pair measured that ratio in alternating
    windows (1 - mask_cost, with its 95% interval). ``predicted_samples_per_s``, the all-CPU windows' rate times
    the model's ratio, is the masked rate the model gives for those very minutes, so ``error_frac`` against the
    masked windows' rate is the model's own: the machine's moves, between runs and within one, are paired out.

    Why not the curve's cost: where the all-CPU side sits on the step, the ratio no longer cancels the machine's
    speed, and the curve's points were measured in other minutes, between which the machine moves (docs/verdicts.md,
    "Masked pairs in one run"). The ratio read on the curve stays beside it (``curve_ratio``; ``basis: curve`` where
    the pair has no CPU columns to read, and it is the model's)."""
    t = ok(run.trials, "cores_pair")
    loads = {w.label: w for w in workloads(run, skipped=True)} if len(t) else {}
    rows = []
    for _, r in t.iterrows():
        w, n = loads.get(label(r)), int(r["num_workers"])
        if w is None or not pd.notna(r.get("mask_cost_frac")):
            continue
        curve = model_ratio(w, n)
        cost = pair_cpu(r)
        model = curve if cost is None else model_ratio(at_cost(w, n, *cost), n)
        ratio, (low, high) = 1 - float(r["mask_cost_frac"]), masked_ratio_bounds(r)
        rows.append(
            {
                "workload": w.label,
                "cores": n,
                "cpus": r.get("mask_cpus"),
                "all_cpus_samples_per_s": float(r["samples_per_s"]),
                "masked_samples_per_s": float(r["masked_samples_per_s"]),
                "measured_ratio": ratio,
                "measured_ratio_ci95_low": low,
                "measured_ratio_ci95_high": high,
                "model_ratio": model,
                "basis": "curve" if cost is None else "pair",
                "curve_ratio": curve,
                "worker_cpu_ms": None if cost is None else cost[0] * 1e3,
                # the curve's CPU per sample at n workers' cores: its level against the pair's
                "curve_worker_cpu_ms": 1e3 * n / rate_at_workers(n, w.ws, w.rates, w.cores).value,
                "predicted_samples_per_s": float(r["samples_per_s"]) * model,
                "error_frac": model / ratio - 1,
                **error_bounds(model, low, high),
                "pairs": r.get("pairs"),
            }
        )
    return pd.DataFrame(rows)


def masked_ratio_bounds(r) -> tuple[Optional[float], Optional[float]]:
    """(low, high) of a pair's measured ratio, masked over all CPUs (1 - mask_cost): a ratio of rates, so by the
    rule of ratios (``stats.cost_bounds``), above 0."""
    low, high = cost_bounds(r.get("mask_cost_frac"), r.get("mask_cost_ci95_low"), r.get("mask_cost_ci95_high"))
    return (None, None) if low is None else (1 - high, 1 - low)


def error_bounds(model: float, low: Optional[float], high: Optional[float]) -> dict:
    """``error_low``/``error_high``: the interval of the model's error against a pair (``model`` / ratio - 1) from
    the measured ratio's (``low``, ``high``, above 0: :func:`masked_ratio_bounds`): the ratio's high end gives the
    error's low end, never below -100%; NaN where the pair has no interval."""
    if low is None or high is None or not low > 0:
        return {"error_low": float("nan"), "error_high": float("nan")}
    return {"error_low": model / high - 1, "error_high": model / low - 1}


def pair_cpu(r) -> Optional[tuple[float, float]]:
    """(workers', training process's) CPU seconds per sample in a pair's all-CPU windows: the monitor's mean CPU
    of each inside those windows over their rate (``trials.kinds.cores_pair``). A pair recorded before it kept
    each side's CPU has only the trial's means over both sides: those over the mean of the two sides' rates (its
    windows last about as long on each side). None where the monitor recorded no CPU for it."""
    workers, main = r.get("all_cpus_workers_cpu_pct_mean"), r.get("all_cpus_main_cpu_pct_mean")
    rate = float(r["samples_per_s"])
    if not (pd.notna(workers) and pd.notna(main)):
        workers, main = r.get("workers_cpu_pct_mean"), r.get("main_cpu_pct_mean")
        rate = (rate + float(r["masked_samples_per_s"])) / 2
    if not (pd.notna(workers) and pd.notna(main) and workers > 0 and rate > 0):
        return None
    return workers / 100 / rate, main / 100 / rate


def model_ratio(w: Workload, n: int) -> float:
    """The size table's rate on ``n`` cores (:func:`predict`, one GPU) over its rate at ``n`` workers on all the
    run's cores (the curve at n, under the step and the hand-off): what a masked pair of n measures."""
    return predict(w, Candidate(f"{n} cores", n))["samples_per_s"] / min(
        w.step[0], rate_at_workers(n, w.ws, w.rates, w.cores, w.cap).value
    )


def at_cost(w: Workload, n: int, worker_s: float, main_s: float) -> Workload:
    """``w`` with its curve and training process read at a fixed CPU cost a sample (``worker_s`` in the workers,
    ``main_s`` in the training process): n workers' cores give n / worker_s, fewer in proportion."""
    line = np.array([n / worker_s])
    return w._replace(ws=np.array([float(n)]), rates=line, lows=line, highs=line, main_s=main_s)
