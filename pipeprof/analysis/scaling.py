"""Several GPUs: what N GPUs give over one, what the direct link between them is worth.

Pure: reads trial rows (an N-GPU trial's row is its job, see ``trials.columns.combine_ranks``).
Each N-GPU trial is set beside the one-GPU trial of the same settings (kind, model, precision,
mode, batch, pipeline, storage, workers per rank):

- ``efficiency`` = rate on N GPUs / (N × rate on one): 1.0 is linear scaling;
- on the step ceilings (device-resident data, so no loader in the way) ``1 − efficiency`` is the
  share of step time the gradient all-reduce adds where it is not hidden behind the backward
  pass: ``comm_exposed_frac``;
- ``p2p_effect``: the rate with NCCL's peer-to-peer path off over the rate with it on, minus one
  (the reviews' NVLink on/off experiment), per setting measured both ways.
"""

from __future__ import annotations

import pandas as pd

from .bounds import matching

SAME = ["kind", "model", "precision", "mode", "batch_size", "preset", "source", "cache_state", "num_workers"]


def job_rates(done: pd.DataFrame) -> pd.DataFrame:
    """The rows whose rate is a whole job's, timed as the sweep times: a node's share of a multi-machine job is
    no job rate (merge first), and an overhead check's untimed twin is not the trial."""
    if "ranks_reported" in done:
        done = done[done["ranks_reported"].isna() | (done["ranks_reported"] >= done["gpus"])]
    if "stage_timing" in done:
        done = done[done["stage_timing"].astype("boolean").fillna(True)]
    return done


def scaling(trials: pd.DataFrame) -> list[dict]:
    """One entry per N-GPU trial with its one-GPU counterpart, efficiency and p2p effect."""
    if "gpus" not in trials or "samples_per_s" not in trials or not (trials["gpus"] > 1).any():
        return []
    done = job_rates(trials[(trials["status"] == "ok") & trials["samples_per_s"].notna()])
    keys = [k for k in SAME if k in done]
    one = done[done["gpus"] == 1]
    out = []
    for _, r in done[done["gpus"] > 1].iterrows():
        base = matching(one, r, keys)
        single = float(base["samples_per_s"].iloc[0]) if len(base) else None
        n = int(r["gpus"])
        eff = r["samples_per_s"] / (n * single) if single else None
        entry = {k: _plain(r.get(k)) for k in [*keys, "gpus", "p2p", "trial_id"]} | {
            "samples_per_s": float(r["samples_per_s"]),
            "samples_per_s_per_gpu": float(r["samples_per_s"]) / n,
            "one_gpu_samples_per_s": single,
            "efficiency": eff,
            "slowest_rank": _plain(r.get("slowest_rank")),
            "slowest_rank_why": _plain(r.get("slowest_rank_why")),
        }
        if r["kind"] == "gpu_ceiling" and eff is not None:
            entry["comm_exposed_frac"] = max(0.0, 1 - eff)
        entry["p2p_effect"] = _p2p_effect(done, r, keys)
        out.append(entry)
    return out


def _p2p_effect(done: pd.DataFrame, r: pd.Series, keys: list[str]):
    """rate(p2p off) / rate(p2p on) − 1 at this trial's settings; None unless both were measured."""
    if "p2p" not in done or pd.isna(r.get("p2p")):
        return None
    same = matching(done[done["gpus"] == r["gpus"]], r, keys)
    on, off = same[same["p2p"].eq(True)], same[same["p2p"].eq(False)]
    if on.empty or off.empty:
        return None
    return float(off["samples_per_s"].iloc[0] / on["samples_per_s"].iloc[0] - 1)


def _plain(v):
    if v is None or (isinstance(v, float) and v != v):
        return None
    return v.item() if hasattr(v, "item") else v
