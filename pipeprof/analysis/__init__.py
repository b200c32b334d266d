"""Pure analysis of a sweep's trials: no I/O, no printing, no plotting.

Input is the trials DataFrame of a run (one row per trial, see ``results``) and a
few machine facts; outputs are DataFrames and plain dicts that renderers format
and run.json stores. One module per question, :func:`analyse` the facade:

- ``bounds``:  :func:`curves` (each end-to-end trial beside the bounds measured alone at the
  same settings), :func:`verdicts` (which bound it sits on, the predicted rate and its error)
- ``advice``:  :func:`recommend_workers`, :func:`cores_needed`, :func:`what_if`, :func:`actions`,
  :func:`stage_overhead`
- ``storage``: :func:`storage_actions` (RAM, shards, more workers, faster storage from swept
  sources), :func:`epoch_estimates` (cold first epoch vs warm later ones)
"""
from __future__ import annotations

import pandas as pd

from .advice import (actions, cores_needed, cpu_rate_for_cores, recommend_workers, scaling, stage_overhead,
                     what_if)
from .bounds import (BALANCED, BOUND_COLUMN, BOUND_KEYS, GROUP_KEYS, LOADER_GAP, NEAR_BEST, classify, cpu_at,
                     cpu_curve, curves, groups, load_cost_s, ok, predict, present_group_keys, verdicts,
                     worker_capacity)
from .storage import epoch_estimates, merge_actions, storage_actions, storage_limited

__all__ = ["BALANCED", "BOUND_COLUMN", "BOUND_KEYS", "GROUP_KEYS", "LOADER_GAP", "NEAR_BEST", "actions", "analyse",
           "classify", "cores_needed", "cpu_at", "cpu_curve", "cpu_rate_for_cores", "curves", "epoch_estimates",
           "groups", "load_cost_s", "ok", "predict", "present_group_keys", "recommend_workers", "scaling",
           "stage_overhead", "storage_actions", "verdicts", "what_if", "worker_capacity"]

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
            advice["cpu_figures_skipped"] = (f"the pipeline ran at the storage's pace (cpu_pipeline within "
                                             f"{2 * BALANCED:.0%} of storage_fetch at every worker count): cores "
                                             "needed and what-if need a pipeline that is not waiting on storage")
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
