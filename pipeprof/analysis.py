"""Pure analysis of a sweep's trials: no I/O, no printing, no plotting.

Input is the trials DataFrame of a run (one row per trial, see ``results``);
outputs are plain dicts/DataFrames that renderers format and run.json stores.
"""
from __future__ import annotations

import math

import pandas as pd

GROUP_KEYS = ["model", "precision", "preset", "batch_size", "source"]
NEAR_BEST = 0.95  # "reaches the best rate" means within 5% of it: window CVs are a few %


def ok(df: pd.DataFrame, kind: str) -> pd.DataFrame:
    """Successful trials of one kind."""
    if df.empty or "kind" not in df:
        return df.iloc[0:0]
    sel = (df["kind"] == kind) & (df["status"] == "ok") & df.get("samples_per_s", pd.Series(dtype=float)).notna()
    return df[sel]


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
    e2e = ok(trials, "end_to_end")
    groups = []
    keys = [k for k in GROUP_KEYS if k in e2e]
    for key, curve in (e2e.groupby(keys, dropna=False) if len(e2e) else []):
        entry = {k: _clean(v) for k, v in zip(keys, key)}
        entry |= recommend_workers(curve)
        groups.append(entry)
    failed = trials[trials["status"] != "ok"] if "status" in trials else trials.iloc[0:0]
    return {"groups": groups, "trials": int(len(trials)), "failed_trials": int(len(failed)),
            "unstable_trials": int(trials.get("unstable", pd.Series(dtype=bool)).fillna(False).astype(bool).sum())}
