"""Pure analysis of a sweep's trials: no I/O, no printing, no plotting.

Input is the trials DataFrame of a run (one row per trial, see ``results``);
outputs are DataFrames and plain dicts that renderers format and run.json stores.
The central table is :func:`curves`: each end-to-end trial beside the isolated
bounds measured at the same settings.
"""
from __future__ import annotations

import math

import pandas as pd

GROUP_KEYS = ["model", "precision", "preset", "batch_size", "source"]
NEAR_BEST = 0.95  # "reaches the best rate" means within 5% of it: window CVs are a few %

# which settings each isolated bound shares with an end-to-end trial
BOUND_KEYS = {
    "gpu_ceiling": ["model", "precision", "mode", "batch_size", "image_size"],
    "cpu_pipeline": ["preset", "decoder", "source", "batch_size", "num_workers", "pin_memory", "image_size"],
    "storage_fetch": ["source", "batch_size", "num_workers"],
}
BOUND_COLUMN = {"gpu_ceiling": "gpu_bound_samples_per_s", "cpu_pipeline": "cpu_bound_samples_per_s",
                "storage_fetch": "io_bound_samples_per_s"}


def ok(df: pd.DataFrame, kind: str) -> pd.DataFrame:
    """Successful trials of one kind."""
    if df.empty or "kind" not in df:
        return df.iloc[0:0]
    sel = (df["kind"] == kind) & (df["status"] == "ok")
    return df[sel & df["samples_per_s"].notna()] if "samples_per_s" in df else df[sel]


def curves(trials: pd.DataFrame) -> pd.DataFrame:
    """End-to-end trials with ``gpu_bound_/cpu_bound_/io_bound_samples_per_s`` joined on.

    A bound missing (trial kind switched off or failed) is NaN.
    """
    e2e = ok(trials, "end_to_end").copy()
    for kind, keys in BOUND_KEYS.items():
        bound = ok(trials, kind)
        col = BOUND_COLUMN[kind]
        if bound.empty:
            e2e[col] = float("nan")
            continue
        on = [k for k in keys if k in e2e and k in bound]
        right = bound[on + ["samples_per_s"]].drop_duplicates(on).rename(columns={"samples_per_s": col})
        e2e = e2e.merge(right, on=on, how="left")
    return e2e.sort_values(present_group_keys(e2e) + ["num_workers"]).reset_index(drop=True)


def present_group_keys(df: pd.DataFrame) -> list[str]:
    return [k for k in GROUP_KEYS if k in df]


def groups(df: pd.DataFrame):
    """(key dict, sub-frame) per model/precision/preset/batch/source group, NaN-safe."""
    keys = present_group_keys(df)
    if df.empty:
        return []
    return [({k: _clean(v) for k, v in zip(keys, key)}, sub) for key, sub in df.groupby(keys, dropna=False)]


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


def _clean(value):
    if isinstance(value, float) and math.isnan(value):
        return None
    return value.item() if hasattr(value, "item") else value


def analyse(trials: pd.DataFrame) -> dict:
    """Per model/precision/preset/batch group: the worker recommendation and its curve."""
    out = []
    for key, curve in groups(ok(trials, "end_to_end")):
        out.append(key | recommend_workers(curve))
    failed = trials[trials["status"] != "ok"] if "status" in trials else trials.iloc[0:0]
    unstable = trials["unstable"].astype("boolean").fillna(False) if "unstable" in trials else []
    return {"groups": out, "trials": int(len(trials)), "failed_trials": int(len(failed)),
            "unstable_trials": int(sum(unstable))}
