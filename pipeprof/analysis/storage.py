"""Storage figures of a run: whether a curve ran at the storage's pace, and epoch estimates (cold first
epoch vs warm later ones). The storage actions and their predictions are ``pipeprof.actions`` and
``analysis.gains``."""

from __future__ import annotations

import pandas as pd

from pipeprof.stats import workers_text

from .bounds import ok, waits_on_storage

COLD_STATES = ("cold", "cold-system")


def storage_limited(curve: pd.DataFrame) -> bool:
    """Whether every point's loader bound sits at its storage bound (the CPU curve is really an I/O curve)."""
    if "io_bound_samples_per_s" not in curve:
        return False
    c = curve[["cpu_bound_samples_per_s", "io_bound_samples_per_s"]].dropna()
    return bool(len(c)) and all(waits_on_storage(cpu, io) for cpu, io in c.itertuples(index=False))


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
        e = {
            "source": label,
            "batch_size": int(b["batch_size"]),
            "num_workers": int(b["num_workers"]),
            "cold_samples_per_s": cold_rate,
            "warm_samples_per_s": warm_rate,
            "first_epoch_s": samples / cold_rate,
            "later_epoch_s": samples / later_rate,
            "fits_in_page_cache": fits,
        }
        text = (
            f"{label}, storage alone at {workers_text(e['num_workers'])}: first epoch (cold) ≈ "
            f"{e['first_epoch_s']:.3g} s, "
            f"later epochs ({'warm' if fits else 'cold again: the dataset does not fit in the page cache'}) ≈ "
            f"{e['later_epoch_s']:.3g} s for {samples} samples"
        )
        e2e = ok(trials, "end_to_end")
        e2e = e2e[(e2e["source"] == label) & (e2e["cache_state"] == "warm")] if "source" in e2e else e2e.iloc[0:0]
        if len(e2e):
            top = e2e.loc[e2e["samples_per_s"].idxmax()]
            io_cold = cold[(cold["num_workers"] == top["num_workers"]) & (cold["batch_size"] == top["batch_size"])][
                "samples_per_s"
            ]
            if len(io_cold):
                first = min(float(top["samples_per_s"]), float(io_cold.max()))
                later = float(top["samples_per_s"]) if fits else first
                e |= {
                    "train_num_workers": int(top["num_workers"]),
                    "train_first_epoch_s": samples / first,
                    "train_later_epoch_s": samples / later,
                }
                text += (
                    f"; training at {workers_text(top['num_workers'])} ≈ {samples / first:.3g} s first, "
                    f"{samples / later:.3g} s later"
                )
        e["text"] = text
        out.append(e)
    return out
