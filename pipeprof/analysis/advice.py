"""Recommendations from the measured curves: workers, cores per GPU, what-if, ranked actions."""
from __future__ import annotations

import math

import numpy as np
import pandas as pd

from .bounds import NEAR_BEST, _known, ok, predict, BOUND_KEYS

# ---- recommendations ---------------------------------------------------------------

def recommend_workers(curve: pd.DataFrame, near: float = NEAR_BEST) -> dict:
    """Smallest ``num_workers`` whose rate is within ``near`` of the best seen.

    ``curve`` has columns num_workers and samples_per_s (one row per count).
    """
    curve = curve.sort_values("num_workers")
    best = curve["samples_per_s"].max()
    pick = curve[curve["samples_per_s"] >= near * best].iloc[0]
    top = curve.loc[curve["samples_per_s"].idxmax()]
    return {"recommended_workers": int(pick["num_workers"]), "recommended_samples_per_s": float(pick["samples_per_s"]),
            "best_workers": int(top["num_workers"]), "best_samples_per_s": float(best),
            "criterion": f"smallest num_workers within {1 - near:.0%} of the best end-to-end rate"}


def scaling(ws: np.ndarray, rates: np.ndarray) -> dict | None:
    """Per-worker rate (best single-worker-equivalent) and scaling efficiency at the most workers."""
    pos = ws > 0
    if not pos.any():
        return None
    per_worker = float(rates[pos][0] / ws[pos][0])  # the smallest count measured: least contention
    w_max, r_max = float(ws[pos][-1]), float(rates[pos][-1])
    return {"per_worker_samples_per_s": per_worker, "workers_max": w_max,
            "efficiency_at_max": r_max / (per_worker * w_max)}


def cpu_rate_for_cores(cores: float, sc: dict, main_cores: float) -> float:
    """Predicted pipeline samples/s with ``cores`` cores, one training process taking ``main_cores``."""
    workers = max(cores - main_cores, 0.0)
    return sc["per_worker_samples_per_s"] * workers * min(sc["efficiency_at_max"], 1.0)


def cores_needed(gpu_rate: float, sc: dict, main_cores: float) -> dict:
    """Cores one GPU needs to be fed at its ceiling, from the measured per-worker rate and efficiency."""
    per_core = sc["per_worker_samples_per_s"] * min(sc["efficiency_at_max"], 1.0)
    workers = gpu_rate / per_core
    return {"cores_needed": math.ceil(workers + main_cores), "workers_needed": workers,
            "extrapolated": workers > sc["workers_max"],
            "basis": f"{sc['per_worker_samples_per_s']:.0f} samples/s per worker at {sc['efficiency_at_max']:.0%} "
                     f"scaling efficiency (at {sc['workers_max']:.0f} workers), + {main_cores:.1f} core(s) "
                     "for the training process"}


def what_if(gpu_rate: float, sc: dict, main_cores: float, io_mb_s: float | None, sample_mb: float | None,
            cores=(4, 8, 16, 32, 64, 128), gpus=(1, 2, 4, 8), storage_mb_s=(None, 125.0, 500.0, 3000.0)) -> list[dict]:
    """Predicted samples/s for other machines: min(GPUs × ceiling, CPU(cores), storage / sample size).

    ``storage_mb_s`` None means "as measured". Each GPU's training process takes ``main_cores``.
    Linear GPU scaling is an upper bound (no all-reduce cost); every row is labelled a prediction.
    """
    rows = []
    for n_gpu in gpus:
        for c in cores:
            for mb_s in storage_mb_s:
                bw = io_mb_s if mb_s is None else mb_s
                bounds = {"gpu": n_gpu * gpu_rate, "cpu": cpu_rate_for_cores(c, sc, n_gpu * main_cores),
                          "io": bw / sample_mb if bw and sample_mb else float("inf")}
                side = min(bounds, key=bounds.get)
                rows.append({"gpus": n_gpu, "cores": c, "storage_mb_s": bw, "storage": "as measured" if mb_s is None else "assumed",
                             "predicted_samples_per_s": bounds[side], "binding": side, "label": "prediction"})
    return rows


def _cheaper_cpu(row: pd.Series, ws: np.ndarray, rates: np.ndarray, share: float, cores: float) -> float:
    """Predicted rate with ``share`` of worker time removed (row, CPU curve and stage clocks scaled)."""
    f = 1 / (1 - share)
    r = row.copy()
    r["cpu_bound_samples_per_s"] = row.get("cpu_bound_samples_per_s", float("nan")) * f
    for k in r.index:
        if k.startswith("stage_us_per_sample."):
            r[k] = r[k] / f
    return predict(r, ws, rates * f, cores)[0]


def actions(row: pd.Series, ws: np.ndarray, rates: np.ndarray, cores: float) -> list[dict]:
    """Ranked single changes with their predicted gain, each computed from this run's
    figures at one end-to-end trial (the group's best) with the same model as :func:`predict`."""
    now = row["samples_per_s"]
    base, bounds = predict(row, ws, rates, cores)
    out = []

    def add(action, predicted, basis):
        out.append({"action": action, "predicted_samples_per_s": predicted, "basis": basis})

    shares = {k.split(".", 1)[1]: v for k, v in row.items() if k.startswith("stage_share.") and v == v}
    costly = max(((k, v) for k, v in shares.items() if k not in ("read", "collate")), key=lambda kv: kv[1],
                 default=None)
    if costly and costly[1] < 1:
        name, share = costly
        if name == "decode":  # decoding cannot be dropped; a 2x faster path is the realistic change
            add(f"halve decode time (OpenCV/SIMD decoder, smaller stored JPEGs, GPU decode): decode is "
                f"{share:.0%} of worker time", _cheaper_cpu(row, ws, rates, share / 2, cores),
                "worker time less half of decode's measured share (the 2x is an assumption)")
        else:
            add(f"drop or cheapen {name}: {share:.0%} of worker time",
                _cheaper_cpu(row, ws, rates, share, cores), "worker time less that stage's measured share")
    uint8_share = shares.get("Normalize", 0) + 0.75 * shares.get("collate", 0)
    if shares.get("Normalize", 0) and uint8_share < 1:
        add("normalise on the GPU and send uint8 (4x fewer bytes through collate and IPC)",
            _cheaper_cpu(row, ws, rates, uint8_share, cores),
            "Normalize's share and 3/4 of collate's share removed from worker time")
    if _known(bounds.get("io")) and bounds["io"] <= 1.1 * base:
        r = row.copy()
        r["io_bound_samples_per_s"] = float("nan")
        add("cache the dataset in RAM (source: memory) or move it to faster storage",
            predict(r, ws, rates, cores)[0], "storage bound removed; CPU and GPU bounds as measured")
    sc = scaling(ws, rates)
    main = row.get("main_cores_step") if _known(row.get("main_cores_step")) else 1.0
    more = max(int(cores - main), 1)
    if sc and more > max(ws.max(), row["num_workers"]):  # counts already measured speak for themselves
        r = row.copy()
        r["num_workers"], r["cpu_bound_samples_per_s"] = more, cpu_rate_for_cores(more + main, sc, main)
        add(f"num_workers={more} (all cores but the training process's)", predict(r, ws, rates, cores)[0],
            "per-worker rate x measured scaling efficiency")
    if _known(bounds.get("gpu")) and now >= 0.9 * bounds["gpu"]:
        add("the GPU is the limit: lower precision, a larger batch or a faster GPU", bounds["gpu"],
            "already at the measured GPU ceiling; CPU-side changes cannot help")
    for a in out:
        # predictions are relative to the model's own figure for today, so model error cancels
        a["gain_frac"] = a["predicted_samples_per_s"] / base - 1 if base == base and base else None
        a["predicted_samples_per_s"] = now * (1 + a["gain_frac"]) if a["gain_frac"] is not None else None
    return sorted(out, key=lambda a: -(a["gain_frac"] or 0))


def stage_overhead(trials: pd.DataFrame) -> list[dict]:
    """cpu_pipeline with vs without per-stage clocks at the same settings: the cost of measuring."""
    if "stage_timing" not in trials:
        return []
    cp = trials[(trials["kind"] == "cpu_pipeline") & (trials["status"] == "ok")]
    off = cp[cp["stage_timing"].astype("boolean").fillna(True) == False]  # noqa: E712 - nullable boolean
    on = ok(trials, "cpu_pipeline")
    keys = [k for k in BOUND_KEYS["cpu_pipeline"] if k in cp]
    out = []
    for _, r in off.iterrows():
        match = on
        for k in keys:
            match = match[match[k].eq(r[k]) | (match[k].isna() & pd.isna(r[k]))]
        if len(match):
            timed = float(match["samples_per_s"].iloc[0])
            noise = math.hypot(float(match["samples_per_s_cv"].iloc[0]), float(r["samples_per_s_cv"]))
            overhead = 1 - timed / float(r["samples_per_s"])
            out.append({"preset": r.get("preset"), "num_workers": int(r["num_workers"]),
                        "timed_samples_per_s": timed, "untimed_samples_per_s": float(r["samples_per_s"]),
                        "overhead_frac": overhead, "noise_frac": noise,
                        "resolved": abs(overhead) > 2 * noise})
    return out
