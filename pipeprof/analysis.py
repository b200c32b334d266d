"""Pure analysis of a sweep's trials: no I/O, no printing, no plotting.

Input is the trials DataFrame of a run (one row per trial, see ``results``) and a
few machine facts; outputs are DataFrames and plain dicts that renderers format
and run.json stores. One function per question:

- :func:`curves`      each end-to-end trial beside the bounds measured alone at the same settings
- :func:`verdicts`    which bound it sits on, how close, the predicted rate and its error
- :func:`recommend_workers`, :func:`cores_needed`, :func:`what_if`, :func:`actions`
- :func:`storage_actions` storage changes (RAM, shards, more workers, faster storage) from swept sources
- :func:`epoch_estimates` first (cold) vs later (warm) epoch times from the storage_fetch rates

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

GROUP_KEYS = ["model", "precision", "preset", "batch_size", "source", "cache_state"]
NEAR_BEST = 0.95  # "reaches the best rate" means within 5% of it: window CVs are a few %
BALANCED = 0.05  # two bounds within 5% of each other: neither change alone helps much
LOADER_GAP = 0.75  # pipeline below 75% of what its workers' CPU time allows: the hand-off binds

# which settings each isolated bound shares with an end-to-end trial
BOUND_KEYS = {
    "gpu_ceiling": ["model", "precision", "mode", "batch_size", "image_size"],
    "cpu_pipeline": ["preset", "decoder", "source", "cache_state", "batch_size", "num_workers", "pin_memory",
                     "image_size"],
    "storage_fetch": ["source", "cache_state", "batch_size", "num_workers"],
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
        cpu = cpu_curve(trials, curve.iloc[0])
        advice = _group_advice(curve, cpu, v, cores)
        best = curve.loc[curve["samples_per_s"].idxmax()]
        advice["actions"] = merge_actions(advice["actions"], storage_actions(trials, best, *cpu, cores))
        if storage_limited(curve):  # its cpu_pipeline curve measured the storage: no CPU figures from it
            for k in ("cores_needed", "what_if", "scaling"):
                advice.pop(k, None)
            advice["cpu_figures_skipped"] = ("the pipeline ran at the storage's pace (cpu_pipeline within 10% of "
                                             "storage_fetch at every worker count): cores needed and what-if "
                                             "need a pipeline that is not waiting on storage")
        out.append(entry | advice)
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



# ---- storage -----------------------------------------------------------------------
#
# Storage actions swap the row's storage for another source measured in the same run
# (same batch and workers): its storage_fetch rate replaces the io bound and its
# cpu_pipeline curve (which includes the reads) the CPU bound, then :func:`predict` runs
# again. Gains are relative to the model's own figure for the row, like :func:`actions`.

MIN_GAIN = 0.02  # storage changes predicted to gain less than this are not worth listing
LATENCY_SCALING = 0.7  # raw reads growing at >= 70% of linear with workers: latency, not bandwidth, binds
COLD_STATES = ("cold", "cold-system")


def _match(df: pd.DataFrame, **keys) -> pd.DataFrame:
    for k, v in keys.items():
        if k in df:
            df = df[df[k].isna()] if v is None or (isinstance(v, float) and v != v) else df[df[k] == v]
    return df


def _source_facts(trials: pd.DataFrame) -> dict:
    """source label -> {kind, throttle, emulated} from the trials' own columns."""
    facts = {}
    if "source" not in trials:
        return facts
    for label, sub in trials[trials["source"].notna()].groupby("source"):
        first = sub.iloc[0]
        kind = first.get("source_kind")
        facts[label] = {"kind": kind if isinstance(kind, str) else str(label).split("-")[0],
                        "throttle": first.get("throttle") if isinstance(first.get("throttle"), str) else None,
                        "emulated": bool(first.get("emulated")) if first.get("emulated") == first.get("emulated")
                        and first.get("emulated") is not None else False}
    return facts


def _state_for(trials: pd.DataFrame, label: str, wanted) -> object:
    """The target source's cache state comparable to the row's: the same if swept, else its only one."""
    states = trials.loc[trials["source"] == label, "cache_state"].dropna().unique() if "cache_state" in trials else []
    if wanted in states:
        return wanted
    return "n/a" if "n/a" in states else (states[0] if len(states) else None)


def _swap_storage(trials: pd.DataFrame, row: pd.Series, label: str, ws, rates, cores: float):
    """(predicted samples/s, target io bound) with ``row``'s storage replaced by source ``label``; None if unmeasured."""
    state = _state_for(trials, label, row.get("cache_state"))
    at = dict(source=label, cache_state=state, batch_size=row["batch_size"])
    io = _match(ok(trials, "storage_fetch"), num_workers=row["num_workers"], **at)
    if io.empty:
        return None
    r = row.copy()
    r["io_bound_samples_per_s"] = float(io["samples_per_s"].iloc[0])
    like = row.copy()
    like["source"], like["cache_state"] = label, state
    ws_t, rates_t = cpu_curve(trials, like)
    if len(ws_t):  # the target's own loader curve (it includes its reads); else the row's CPU figures stand
        here = rates_t[ws_t == row["num_workers"]]
        if len(here):
            r["cpu_bound_samples_per_s"] = float(here[0])
    else:
        ws_t, rates_t = ws, rates
    return predict(r, ws_t, rates_t, cores)[0], r["io_bound_samples_per_s"]


def storage_actions(trials: pd.DataFrame, row: pd.Series, ws: np.ndarray, rates: np.ndarray,
                    cores: float) -> list[dict]:
    """Storage changes for one end-to-end trial, each predicted from this run's measured figures:
    cache in RAM (a ``memory`` source), pack into shards (a ``shards`` source on the same storage),
    faster storage (the same layout without / with a looser throttle, or local files instead of
    an object store), and more workers to hide latency (raw reads that scale with workers)."""
    if "source" not in row or not isinstance(row.get("source"), str):
        return []
    now = row["samples_per_s"]
    base, bounds = predict(row, ws, rates, cores)
    io_now = bounds.get("io")
    if not (base == base and base) or not _known(io_now):
        return []
    facts = _source_facts(trials)
    me = facts.get(row["source"], {"kind": None, "throttle": None})
    out = []

    def add(action, predicted, basis):
        gain = predicted / base - 1
        if gain > MIN_GAIN:
            out.append({"action": action, "predicted_samples_per_s": now * (1 + gain), "basis": basis,
                        "gain_frac": gain})

    for label, f in facts.items():
        if label == row["source"]:
            continue
        swap = _swap_storage(trials, row, label, ws, rates, cores)
        if swap is None:
            continue
        predicted, io_t = swap
        basis = (f"storage_fetch {io_t:,.0f} vs {io_now:,.0f} samples/s measured at {int(row['num_workers'])} workers"
                 f" ({label} vs {row['source']}), with {label}'s measured pipeline rate")
        if f["kind"] == "memory" and not f["throttle"]:
            add("cache the dataset in RAM (source: memory; measured)", predicted, basis)
        elif f["kind"] == "shards" and me["kind"] in ("files", "url") and f["throttle"] == me["throttle"]:
            add("pack the files into tar shards (`pipeprof pack`) and read them sequentially", predicted, basis)
        elif (f["kind"] == me["kind"] or {f["kind"], me["kind"]} <= {"files", "url"}) and io_t > io_now:
            what = f"emulated {f['throttle']}" if f["throttle"] else "this machine's own, unthrottled"
            add(f"faster storage: as measured with {label} ({what})", predicted, basis)
    latency = _more_workers_for_latency(trials, row, bounds, base, cores)
    if latency:
        add(*latency)
    if not any(f["kind"] == "memory" for f in facts.values()):
        ram = _ram_from_stage_clocks(row, bounds, cores)
        if ram:
            add(*ram)
    return out


def storage_limited(curve: pd.DataFrame) -> bool:
    """Whether every point's loader bound sits at its storage bound (the CPU curve is really an I/O curve)."""
    if "io_bound_samples_per_s" not in curve:
        return False
    c = curve[["cpu_bound_samples_per_s", "io_bound_samples_per_s"]].dropna()
    return bool(len(c)) and bool((c["cpu_bound_samples_per_s"] >= (1 - 2 * BALANCED) * c["io_bound_samples_per_s"]).all())


def _stage_cost_s(row: pd.Series) -> float | None:
    stage_us = sum(v for k, v in row.items() if k.startswith("stage_us_per_sample.") and v == v)
    return stage_us * 1e-6 if stage_us else None


def _ram_from_stage_clocks(row: pd.Series, bounds: dict, cores: float):
    """(action, predicted, basis) for caching in RAM when the measured loader bound waited on storage:
    the loader's CPU bound then comes from its stage clocks (worker CPU per sample) instead."""
    cpu, io, cost = bounds.get("cpu"), bounds.get("io"), _stage_cost_s(row)
    if not (_known(cpu) and _known(io) and cost and cpu >= (1 - 2 * BALANCED) * io):
        return None
    w = max(int(row["num_workers"]), 1)
    r = row.copy()
    r["io_bound_samples_per_s"], r["cpu_bound_samples_per_s"] = float("nan"), w / cost
    ws2, rates2 = np.array([1.0, float(w)]), np.array([1 / cost, w / cost])
    return ("cache the dataset in RAM (source: memory) or move it to faster storage", predict(r, ws2, rates2, cores)[0],
            f"storage bound removed; the loader's CPU bound from its stage clocks ({cost * 1e6:,.0f} us of worker "
            "CPU per sample), because the measured pipeline waited on storage")


def _more_workers_for_latency(trials: pd.DataFrame, row: pd.Series, bounds: dict, base: float, cores: float):
    """(action, predicted, basis) when the storage bound binds and raw reads scale with workers."""
    io = bounds.get("io")
    if not (_known(io) and io <= 1.1 * base):
        return None
    f = _match(ok(trials, "storage_fetch"), source=row["source"], cache_state=row.get("cache_state"),
               batch_size=row["batch_size"])
    f = f[f["num_workers"] > 0].drop_duplicates("num_workers").sort_values("num_workers")
    if len(f) < 2:
        return None
    (w1, r1), (wm, rm) = f[["num_workers", "samples_per_s"]].iloc[[0, -1]].to_numpy(float)
    eff = (rm / r1) / (wm / w1)
    if eff < LATENCY_SCALING:
        return None
    cost = _stage_cost_s(row)
    if not cost:  # no worker CPU cost measured apart from the waits: cannot tell where the CPU binds
        return None
    stage_us = cost * 1e6
    w2 = int(2 * wm)
    r = row.copy()
    r["num_workers"], r["io_bound_samples_per_s"] = w2, rm * 2 * min(eff, 1.0)
    r["cpu_bound_samples_per_s"] = w2 / cost
    ws2, rates2 = np.array([1.0, float(w2)]), np.array([1 / cost, w2 / cost])  # worker CPU alone, no waits
    return (f"num_workers={w2} to hide storage latency (workers mostly wait on reads)",
            predict(r, ws2, rates2, cores)[0],
            f"raw reads scale {r1:,.0f} -> {rm:,.0f} samples/s from {w1:.0f} to {wm:.0f} workers ({eff:.0%} of "
            f"linear), extrapolated to {w2}; worker CPU {stage_us:,.0f} us/sample from the stage clocks")


def merge_actions(actions_: list[dict], extra: list[dict]) -> list[dict]:
    """Both lists, ranked by gain; a RAM-cache action in ``extra`` (measured, or from the stage clocks)
    replaces :func:`actions`' own, which took the storage-limited loader bound as the CPU bound."""
    if any(a["action"].startswith("cache the dataset in RAM") for a in extra):
        actions_ = [a for a in actions_ if not a["action"].startswith("cache the dataset in RAM")]
    return sorted(actions_ + extra, key=lambda a: -(a["gain_frac"] or 0))


def epoch_estimates(trials: pd.DataFrame, samples: int, fits: bool) -> list[dict]:
    """Per file-backed source with both cold and warm storage_fetch trials: how long one epoch of
    ``samples`` would take from storage cold (first epoch) and warm (later ones), at the worker count
    where cold reads were fastest; and, with end-to-end trials on it, for training itself."""
    fetch = ok(trials, "storage_fetch")
    if fetch.empty or "cache_state" not in fetch or not samples:
        return []
    out = []
    for label, sub in fetch.groupby("source"):
        cold = sub[sub["cache_state"].isin(COLD_STATES)]
        if "cache_note" in cold:  # a cold trial that says it was not cold (too small a dataset, cache held)
            cold = cold[cold["cache_note"].isna()]
        cold = cold[["batch_size", "num_workers", "samples_per_s"]]
        warm = sub[sub["cache_state"] == "warm"][["batch_size", "num_workers", "samples_per_s"]]
        both = cold.merge(warm, on=["batch_size", "num_workers"], suffixes=("_cold", "_warm"))
        if both.empty:
            continue
        b = both.loc[both["samples_per_s_cold"].idxmax()]
        cold_rate, warm_rate = float(b["samples_per_s_cold"]), float(b["samples_per_s_warm"])
        later_rate = warm_rate if fits else cold_rate
        e = {"source": label, "batch_size": int(b["batch_size"]), "num_workers": int(b["num_workers"]),
             "cold_samples_per_s": cold_rate, "warm_samples_per_s": warm_rate,
             "first_epoch_s": samples / cold_rate, "later_epoch_s": samples / later_rate, "fits_in_page_cache": fits}
        text = (f"{label}, storage alone at {e['num_workers']} workers: first epoch (cold) ≈ {e['first_epoch_s']:.3g} s, "
                f"later epochs ({'warm' if fits else 'cold again: the dataset does not fit in the page cache'}) ≈ "
                f"{e['later_epoch_s']:.3g} s for {samples} samples")
        e2e = ok(trials, "end_to_end")
        e2e = e2e[(e2e["source"] == label) & (e2e["cache_state"] == "warm")] if "source" in e2e else e2e.iloc[0:0]
        if len(e2e):
            top = e2e.loc[e2e["samples_per_s"].idxmax()]
            io_cold = cold[cold["num_workers"] == top["num_workers"]]["samples_per_s"]
            if len(io_cold):
                first = min(float(top["samples_per_s"]), float(io_cold.max()))
                later = float(top["samples_per_s"]) if fits else first
                e |= {"train_num_workers": int(top["num_workers"]), "train_first_epoch_s": samples / first,
                      "train_later_epoch_s": samples / later}
                text += (f"; training at {int(top['num_workers'])} workers ≈ {samples / first:.3g} s first, "
                         f"{samples / later:.3g} s later")
        e["text"] = text
        out.append(e)
    return out
