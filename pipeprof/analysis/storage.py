"""Storage advice and epoch estimates, from the other sources measured in the same run."""
from __future__ import annotations

import numpy as np
import pandas as pd

from .bounds import _known, cpu_curve, ok, predict, stage_cost_s, waits_on_storage

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
    """source label -> {kind, throttle} from the trials' own columns."""
    facts = {}
    if "source" not in trials:
        return facts
    for label, sub in trials[trials["source"].notna()].groupby("source"):
        first = sub.iloc[0]
        kind = first.get("source_kind")
        facts[label] = {"kind": kind if isinstance(kind, str) else str(label).split("-")[0],
                        "throttle": first.get("throttle") if isinstance(first.get("throttle"), str) else None}
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
    candidates = list(_measured_swaps(trials, row, facts, io_now, ws, rates, cores))
    latency = _more_workers_for_latency(trials, row, bounds, base, cores)
    if latency:
        candidates.append(latency)
    if not any(f["kind"] == "memory" for f in facts.values()):
        ram = _ram_from_stage_clocks(row, bounds, cores)
        if ram:
            candidates.append(ram)
    return [a for c in candidates if (a := _gain_action(now, base, *c))]


def _gain_action(now: float, base: float, action: str, predicted: float, basis: str) -> dict | None:
    """The action with its predicted rate, or None when it gains no more than ``MIN_GAIN``."""
    gain = predicted / base - 1
    if gain <= MIN_GAIN:
        return None
    return {"id": storage_id(action), "action": action, "predicted_samples_per_s": now * (1 + gain), "basis": basis,
            "gain_frac": gain}


#: a storage action's id (what an action trial matches it by) from the start of its text
STORAGE_IDS = {"cache the dataset in RAM": "memory", "pack the files into tar shards": "shards",
               "faster storage": "faster_storage", "num_workers=": "workers_latency"}


def storage_id(action: str) -> str:
    return next((key for start, key in STORAGE_IDS.items() if action.startswith(start)), "storage")


def _measured_swaps(trials: pd.DataFrame, row: pd.Series, facts: dict, io_now: float, ws: np.ndarray,
                    rates: np.ndarray, cores: float):
    """(action, predicted rate, basis) for each other measured source this trial's storage could become."""
    me = facts.get(row["source"], {"kind": None, "throttle": None})
    for label, f in facts.items():
        if label == row["source"]:
            continue
        swap = _swap_storage(trials, row, label, ws, rates, cores)
        if swap is None:
            continue
        predicted, io_t = swap
        basis = (f"storage_fetch {io_t:,.0f} vs {io_now:,.0f} samples/s measured at {int(row['num_workers'])} workers"
                 f" ({label} vs {row['source']}), with {label}'s measured pipeline rate")
        action = _swap_action(label, f, me, io_t, io_now)
        if action:
            yield action, predicted, basis


def _swap_action(label: str, f: dict, me: dict, io_t: float, io_now: float) -> str | None:
    if f["kind"] == "memory" and not f["throttle"]:
        return "cache the dataset in RAM (source: memory; measured)"
    if f["kind"] == "shards" and me["kind"] in ("files", "url") and f["throttle"] == me["throttle"]:
        return "pack the files into tar shards (`pipeprof pack`) and read them sequentially"
    if (f["kind"] == me["kind"] or {f["kind"], me["kind"]} <= {"files", "url"}) and io_t > io_now:
        what = f"emulated {f['throttle']}" if f["throttle"] else "this machine's own, unthrottled"
        return f"faster storage: as measured with {label} ({what})"
    return None


def storage_limited(curve: pd.DataFrame) -> bool:
    """Whether every point's loader bound sits at its storage bound (the CPU curve is really an I/O curve)."""
    if "io_bound_samples_per_s" not in curve:
        return False
    c = curve[["cpu_bound_samples_per_s", "io_bound_samples_per_s"]].dropna()
    return bool(len(c)) and all(waits_on_storage(cpu, io) for cpu, io in c.itertuples(index=False))


def _ram_from_stage_clocks(row: pd.Series, bounds: dict, cores: float):
    """(action, predicted, basis) for caching in RAM when the measured loader bound waited on storage:
    the loader's CPU bound then comes from its stage clocks (worker CPU per sample) instead."""
    cpu, io, cost = bounds.get("cpu"), bounds.get("io"), stage_cost_s(row)
    if not (cost and waits_on_storage(cpu, io)):
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
    cost = stage_cost_s(row)
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
    """Both lists, findings (no gain: "the GPU is the limit") first, then ranked by gain; a RAM-cache
    action in ``extra`` (measured, or from the stage clocks) replaces :func:`actions`' own, which took the
    storage-limited loader bound as the CPU bound."""
    if any(a["action"].startswith("cache the dataset in RAM") for a in extra):
        actions_ = [a for a in actions_ if not a["action"].startswith("cache the dataset in RAM")]
    return sorted(actions_ + extra, key=lambda a: (a["gain_frac"] is not None, -(a["gain_frac"] or 0)))


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
            io_cold = cold[(cold["num_workers"] == top["num_workers"])
                           & (cold["batch_size"] == top["batch_size"])]["samples_per_s"]
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
