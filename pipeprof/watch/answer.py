"""The watch's answer, from the same analysis as a sweep's, and its lines on the console.

:func:`analyse_loaders` runs ``analysis.analyse`` on each loader's rows apart (its end-to-end rows per
rank, its step row, the pause's cpu_pipeline rows: a loader's step is joined to its own rows only)
and merges them into one analysis as run.json stores a sweep's. Verdicts, their basis, the
prediction and the advice are the analysis' own; this module adds only what a watch has and a sweep
has not: the slowest rank of each loader and the pause's recommendation (``tune.recommend``).
"""

from __future__ import annotations

import statistics

from pipeprof.analysis import analyse
from pipeprof.analysis.failures import failures
from pipeprof.results import frame

SUMMED = ("trials", "failed_trials", "unstable_trials")


def _merge(parts: list[dict]) -> dict:
    """One analysis from several: lists joined, counts added, the rest (cores, device) from the first."""
    out: dict = {}
    for part in parts:
        for k, v in part.items():
            if k not in out:
                out[k] = list(v) if isinstance(v, list) else dict(v) if isinstance(v, dict) else v
            elif isinstance(v, list):
                out[k] += v
            elif k in SUMMED:
                out[k] += v
            elif k == "unstable_causes":
                out[k] = {c: out[k].get(c, 0) + v.get(c, 0) for c in set(out[k]) | set(v)}
    return out


def slowest_rank(rows: list[dict]) -> dict | None:
    """Of one loader's ranks, the one that holds the job back, and why. In DDP the ranks keep step with each
    other (the all-reduce), so their rates hardly differ: the rank that waits for data longest (by more
    than 5 points over the others' median) is the slowest; else the one with the lowest rate."""
    ok = [r for r in rows if r.get("kind") == "end_to_end" and r.get("status") == "ok"]
    if len(ok) < 2:
        return None
    waiting = max(ok, key=lambda r: r["data_wait_frac"])
    others = statistics.median(r["data_wait_frac"] for r in ok if r is not waiting)
    if waiting["data_wait_frac"] > others + 0.05:
        slow, why = (
            waiting,
            (
                f"rank {waiting['rank']} waits for data {waiting['data_wait_frac']:.0%} of the time "
                f"against {others:.0%} on the other ranks: its input holds the job back"
            ),
        )
    else:
        slow = min(ok, key=lambda r: r["samples_per_s"])
        why = (
            f"rank {slow['rank']} runs at {slow['samples_per_s']:,.1f} samples/s and waits for data no more than "
            "the others: its step is the slower (or the ranks wait for each other in the all-reduce)"
        )
    return {
        "rank": slow["rank"],
        "samples_per_s": slow["samples_per_s"],
        "data_wait_frac": slow["data_wait_frac"],
        "others_data_wait_frac_median": others,
        "why": why,
    }


def analyse_loaders(rows: list[dict], cores: float, device: str, draws: int = 60) -> dict:
    """run.json's ``analysis`` for a watch (see the module docstring); ``draws``: re-draws of the windows
    for the answer's confidence (``--redraws``)."""
    parts, loaders = [], {}
    for label in dict.fromkeys(r["loader"] for r in rows):
        mine = [r for r in rows if r["loader"] == label]
        part = analyse(frame(mine), cores=cores, device=device, draws=draws)
        for a in part["groups"]:  # each an answer.Answer: a watch's group is keyed by its loader too
            a.key["loader"] = label
        parts.append(part)
        loaders[label] = {"slowest_rank": slowest_rank(mine)}
    out = _merge(parts)
    # run-wide figures over every loader's rows, not the first loader's (only the tuned one has predictions)
    errors = [
        abs(v["prediction_error_frac"])
        for v in out["verdicts"]
        if v.get("prediction_error_frac") is not None and v["prediction_error_frac"] == v["prediction_error_frac"]
    ]
    return out | {
        "failures": failures(frame(rows)),
        "loaders": loaders,
        "prediction_error_abs_median": statistics.median(errors) if errors else None,
    }
