"""Pure analysis of a sweep's trials: no I/O, no printing, no plotting.

Input is the trials DataFrame of a run (one row per trial, see ``results``) and a
few machine facts; outputs are DataFrames and plain dicts that renderers format
and run.json stores. One function per question:

- :func:`curves`      each end-to-end trial beside the bounds measured alone at the same settings
- :func:`verdicts`    which bound it sits on, how close, the predicted rate and its error
- :func:`recommend_workers`, :func:`cores_needed`, :func:`what_if`, :func:`actions`

The prediction model (why not just ``min`` of the bounds):

* with workers, loading overlaps the step, so the slower side binds:
  ``min(gpu, cpu(w_eff), io(w))``; ``w_eff`` caps the workers at the cores left
  after the training process's own CPU use (measured in the gpu_ceiling trial),
  because the isolated cpu_pipeline trial had those cores to itself;
* with 0 workers the main process alternates loading and stepping, so per-sample
  times add: ``1 / (1/cpu(0) + 1/gpu)``.
"""
from __future__ import annotations

import math

import numpy as np
import pandas as pd

GROUP_KEYS = ["model", "precision", "preset", "batch_size", "source"]
NEAR_BEST = 0.95  # "reaches the best rate" means within 5% of it: window CVs are a few %
BALANCED = 0.05  # two bounds within 5% of each other: neither change alone helps much
LOADER_GAP = 0.75  # pipeline below 75% of what its workers' CPU time allows: the hand-off binds

# which settings each isolated bound shares with an end-to-end trial
BOUND_KEYS = {
    "gpu_ceiling": ["model", "precision", "mode", "batch_size", "image_size"],
    "cpu_pipeline": ["preset", "decoder", "source", "batch_size", "num_workers", "pin_memory", "image_size"],
    "storage_fetch": ["source", "batch_size", "num_workers"],
}
BOUND_COLUMN = {"gpu_ceiling": "gpu_bound_samples_per_s", "cpu_pipeline": "cpu_bound_samples_per_s",
                "storage_fetch": "io_bound_samples_per_s"}


def ok(df: pd.DataFrame, kind: str) -> pd.DataFrame:
    """Successful trials of one kind (the stage-timing-off twins excluded)."""
    if df.empty or "kind" not in df:
        return df.iloc[0:0]
    sel = (df["kind"] == kind) & (df["status"] == "ok")
    if "stage_timing" in df:
        sel &= df["stage_timing"].astype("boolean").fillna(True)
    return df[sel & df["samples_per_s"].notna()] if "samples_per_s" in df else df[sel]


def present_group_keys(df: pd.DataFrame) -> list[str]:
    return [k for k in GROUP_KEYS if k in df]


def groups(df: pd.DataFrame):
    """(key dict, sub-frame) per model/precision/preset/batch/source group, NaN-safe."""
    keys = present_group_keys(df)
    if df.empty:
        return []
    return [({k: _clean(v) for k, v in zip(keys, key)}, sub) for key, sub in df.groupby(keys, dropna=False)]


def _clean(value):
    if isinstance(value, float) and math.isnan(value):
        return None
    return value.item() if hasattr(value, "item") else value


def curves(trials: pd.DataFrame) -> pd.DataFrame:
    """End-to-end trials with ``gpu_bound_/cpu_bound_/io_bound_samples_per_s`` joined on,
    plus ``main_cores_step``: CPU the training process used in the gpu_ceiling trial.

    A bound missing (trial kind switched off or failed) is NaN.
    """
    e2e = ok(trials, "end_to_end").copy()
    for kind, keys in BOUND_KEYS.items():
        bound, col = ok(trials, kind), BOUND_COLUMN[kind]
        extra = {"gpu_ceiling": {"main_cpu_pct_mean": "main_cores_step"},
                 "storage_fetch": {"mean_sample_kb": "mean_sample_kb"}}.get(kind, {})
        if bound.empty:
            e2e[col] = float("nan")
            continue
        on = [k for k in keys if k in e2e and k in bound]
        cols = ["samples_per_s"] + [c for c in extra if c in bound]
        right = bound[on + cols].drop_duplicates(on).rename(columns={"samples_per_s": col, **extra})
        e2e = e2e.merge(right, on=on, how="left")
    if "main_cores_step" in e2e:
        e2e["main_cores_step"] = e2e["main_cores_step"] / 100
    return e2e.sort_values(present_group_keys(e2e) + ["num_workers"]).reset_index(drop=True)


# ---- per-trial verdicts ------------------------------------------------------------

def worker_capacity(row: pd.Series) -> float | None:
    """Samples/s the workers' own CPU time allows: workers / (stage seconds per sample)."""
    stage_us = sum(v for k, v in row.items() if k.startswith("stage_us_per_sample.") and v == v)
    if not stage_us:
        return None
    return max(row["num_workers"], 1) / (stage_us * 1e-6)


def cpu_curve(trials: pd.DataFrame, like: pd.Series) -> tuple[np.ndarray, np.ndarray]:
    """(workers, samples/s) of every cpu_pipeline trial at ``like``'s settings, sorted by workers.

    Taken from the cpu_pipeline trials themselves, not the end-to-end rows, so
    worker counts measured only in isolation still shape the curve.
    """
    c = ok(trials, "cpu_pipeline")
    for k in BOUND_KEYS["cpu_pipeline"]:
        if k != "num_workers" and k in c and k in like:
            c = c[c[k].eq(like[k]) | (c[k].isna() & pd.isna(like[k]))]
    c = c[["num_workers", "samples_per_s"]].dropna().drop_duplicates("num_workers").sort_values("num_workers")
    return c["num_workers"].to_numpy(float), c["samples_per_s"].to_numpy(float)


def cpu_at(workers: float, ws: np.ndarray, rates: np.ndarray) -> float:
    """CPU bound at a (possibly fractional) worker count, interpolated on the measured curve."""
    if not len(ws):
        return float("nan")
    return float(np.interp(workers, ws, rates))


def load_cost_s(row: pd.Series, ws: np.ndarray, rates: np.ndarray) -> float | None:
    """Worker CPU seconds per sample: the stage clocks' sum, else 1 / (rate of one worker)."""
    stage_us = sum(v for k, v in row.items() if k.startswith("stage_us_per_sample.") and v == v)
    if stage_us:
        return stage_us * 1e-6
    pos = ws > 0
    return float(ws[pos][0] / rates[pos][0]) if pos.any() else None


def _known(x) -> bool:
    return x is not None and x == x and x > 0


def predict(row: pd.Series, ws: np.ndarray, rates: np.ndarray, cores: float) -> tuple[float, dict]:
    """Predicted end-to-end samples/s and the bounds it used (see the module docstring).

    Bounds: ``gpu`` (step alone), ``cpu`` (loader alone at these workers, capped at the
    cores the step leaves free), ``io`` (raw reads alone), and ``cores``: the CPU budget
    when the step and the workers share the machine, cores / (step CPU s + worker CPU s
    per sample). The last one matters where the step itself burns CPU (CPU training,
    or a small machine); on a GPU box it is rarely the lowest.
    """
    gpu, io, w = row.get("gpu_bound_samples_per_s"), row.get("io_bound_samples_per_s"), row["num_workers"]
    main = row.get("main_cores_step")
    main = 1.0 if main is None or main != main else main
    if w == 0:
        cpu = row.get("cpu_bound_samples_per_s")
        bounds = {"gpu": gpu, "cpu": cpu, "io": io, "cores": None}
        serial = [b for b in (gpu, cpu) if _known(b)]
        return (1 / sum(1 / b for b in serial) if serial else float("nan")), bounds
    w_eff = min(w, max(cores - main, 1.0))
    cpu = cpu_at(w_eff, ws, rates) if w_eff < w else row.get("cpu_bound_samples_per_s")
    load = load_cost_s(row, ws, rates)
    budget = cores / (main / gpu + load) if _known(gpu) and load else None
    bounds = {"gpu": gpu, "cpu": cpu, "io": io, "cores": budget}
    known = [b for b in bounds.values() if _known(b)]
    return (min(known) if known else float("nan")), bounds


def classify(row: pd.Series, bounds: dict) -> str:
    """The verdict: gpu-bound, cpu-bound, io-bound, loader-bound or balanced.

    ``cores`` binding counts as cpu-bound (the machine's cores are the limit).
    """
    known = sorted((v, "cpu" if k == "cores" else k) for k, v in bounds.items() if _known(v))
    if not known:
        return "unknown"
    low, side = known[0]
    cpu, io = bounds.get("cpu"), bounds.get("io")
    if side == "cpu" and _known(io) and _known(cpu) and cpu >= (1 - 2 * BALANCED) * io:
        side = "io"  # the pipeline runs at the speed its bytes arrive: storage, not CPU, binds
    if side == "cpu" and _known(cpu) and cpu <= low * (1 + BALANCED):
        cap = worker_capacity(row)
        if cap and row["num_workers"] > 0 and cpu < LOADER_GAP * cap:
            return "loader-bound"
    # the loader chain (cpu, io) against the step (gpu): balanced when the two ends are close
    chain = {"cpu", "io"}
    other = [v for v, k in known if (k in chain) != (side in chain)]
    if other and other[0] <= (1 + BALANCED) * low:
        return "balanced"
    return f"{side}-bound"


def verdicts(trials: pd.DataFrame, cores: float) -> pd.DataFrame:
    """One row per end-to-end trial: verdict, evidence, predicted rate and its error."""
    out = []
    for _, group in groups(curves(trials)):
        ws, rates = cpu_curve(trials, group.iloc[0])
        for _, row in group.iterrows():
            predicted, bounds = predict(row, ws, rates, cores)
            verdict = classify(row, bounds)
            bound = predicted if verdict != "io-bound" else bounds["io"]
            w = row["num_workers"]
            out.append({
                "trial_id": row["trial_id"], **{k: _clean(row.get(k)) for k in present_group_keys(group)},
                "num_workers": int(w), "verdict": verdict, "samples_per_s": row["samples_per_s"],
                "predicted_samples_per_s": predicted,
                "prediction_error_frac": (predicted - row["samples_per_s"]) / row["samples_per_s"],
                "of_binding_bound_frac": row["samples_per_s"] / bound if bound else None,
                "gpu_bound_samples_per_s": bounds["gpu"], "cpu_bound_samples_per_s": bounds["cpu"],
                "io_bound_samples_per_s": bounds["io"], "cores_bound_samples_per_s": bounds["cores"],
                "data_wait_frac": row.get("data_wait_frac"),
                "gpu_util_pct_mean": row.get("gpu_util_pct_mean"),
                "worker_cpu_util_frac": (row.get("workers_cpu_pct_mean") or 0) / (100 * w) if w else None,
                "worker_capacity_samples_per_s": worker_capacity(row)})
    return pd.DataFrame(out)


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
    Linear GPU scaling is an upper bound (no all-reduce cost): labelled as such.
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


# ---- the whole run -----------------------------------------------------------------

def analyse(trials: pd.DataFrame, cores: float = 1.0) -> dict:
    """Everything run.json's ``analysis`` holds: verdicts, accuracy, recommendations per group."""
    v = verdicts(trials, cores) if len(ok(trials, "end_to_end")) else pd.DataFrame()
    cv = curves(trials)
    out = []
    for key, curve in groups(cv):
        entry = key | recommend_workers(curve)
        out.append(entry | _group_advice(curve, cpu_curve(trials, curve.iloc[0]), v, cores))
    errors = v["prediction_error_frac"].dropna().abs() if len(v) else pd.Series(dtype=float)
    failed = trials[trials["status"] != "ok"] if "status" in trials else trials.iloc[0:0]
    unstable = trials["unstable"].astype("boolean").fillna(False) if "unstable" in trials else []
    return {"groups": out, "verdicts": v.to_dict("records") if len(v) else [],
            "prediction_error_abs_median": float(errors.median()) if len(errors) else None,
            "stage_timing_overhead": stage_overhead(trials), "cores": cores,
            "trials": int(len(trials)), "failed_trials": int(len(failed)), "unstable_trials": int(sum(unstable))}


def _group_advice(curve: pd.DataFrame, cpu: tuple, v: pd.DataFrame, cores: float) -> dict:
    ws, rates = cpu
    sc = scaling(ws, rates)
    gpu = curve["gpu_bound_samples_per_s"].dropna()
    main = curve["main_cores_step"].dropna() if "main_cores_step" in curve else pd.Series(dtype=float)
    main_cores = float(main.iloc[0]) if len(main) else 1.0
    best = curve.loc[curve["samples_per_s"].idxmax()]
    mine = v[v["trial_id"].isin(curve["trial_id"])] if len(v) else v
    advice = {"actions": actions(best, ws, rates, cores), "main_cores_step": main_cores}
    if sc and len(gpu):
        advice["cores_needed"] = cores_needed(float(gpu.iloc[0]), sc, main_cores)
        io_mb_s = _io_mb_s(curve)
        advice["what_if"] = what_if(float(gpu.iloc[0]), sc, main_cores, io_mb_s, _sample_mb(curve))
        advice["scaling"] = sc
    rec = mine[mine["num_workers"] == recommend_workers(curve)["recommended_workers"]] if len(mine) else mine
    if len(rec):
        advice["verdict_at_recommended"] = rec["verdict"].iloc[0]
    return advice


def _io_mb_s(curve: pd.DataFrame) -> float | None:
    col = curve.get("io_bound_samples_per_s")
    size = _sample_mb(curve)
    if col is None or size is None or col.dropna().empty:
        return None
    return float(col.dropna().max()) * size


def _sample_mb(curve: pd.DataFrame) -> float | None:
    if "mean_sample_kb" in curve and curve["mean_sample_kb"].notna().any():
        return float(curve["mean_sample_kb"].dropna().iloc[0]) / 1e3
    return None

