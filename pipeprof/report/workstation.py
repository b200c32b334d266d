"""``pipeprof size``'s words: the candidate table in markdown, the line a buyer reads first per workload, and the
cheapest candidate reaching the target (the figures are ``analysis.workstation``'s)."""

from __future__ import annotations

import math

import pandas as pd


def at_least(frac: float) -> str:
    """A lower bound as a whole percent, rounded down: 89.85% of the ceiling must not read "≥ 90%" beside a pick
    that (rightly) found it short of a 90% target."""
    return f"{math.floor(frac * 100 + 1e-9):.0f}%"


def sentence(rows: pd.DataFrame, best: dict, target: float) -> list[str]:
    """The lines a buyer reads first, one per workload."""
    out = []
    for label, g in rows.groupby("workload", sort=False):
        pick = best.get(label)
        smallest = g.sort_values(["cores", "gpus"]).iloc[0]
        head = f"for {label}, "
        if pick is None:
            top = g.sort_values("of_ceiling_low_frac").iloc[-1]
            out.append(
                head + f"no candidate keeps the GPUs at {target:.0%} of their ceiling; the closest is {top['machine']} "
                f"({at_least(top['of_ceiling_low_frac'])}-{min(top['of_ceiling_frac'], 1):.0%})"
            )
            continue
        r = g[g["machine"] == pick].iloc[0]
        more = " (extrapolated past the cores measured)" if r["extrapolated"] else ""
        out.append(
            head + f"{pick} keeps the GPUs at {r['of_ceiling_frac']:.0%} of their ceiling (at least "
            f"{at_least(r['of_ceiling_low_frac'])}){more}; {smallest['machine']} reaches "
            f"{smallest['of_ceiling_frac']:.0%}"
        )
    return out


def render_size(rows: pd.DataFrame, best: dict, target: float) -> str:
    """The candidate table, then the buyer's lines and the cheapest candidate reaching ``target`` for all."""
    out = [
        "| workload | machine | samples/s (range) | binding | of ceiling | GPU scaling | per price | note |",
        "|" + "---|" * 8,
    ]
    for _, r in rows.iterrows():
        per = r["samples_per_s_per_price"]
        per = "–" if per is None or per != per else f"{per:.3g}"
        out.append(
            f"| {r['workload']} | {r['machine']} | {r['samples_per_s']:,.1f} ({r['samples_per_s_low']:,.1f}–"
            f"{r['samples_per_s_high']:,.1f}) | {r['binding']} | {r['of_ceiling_frac']:.0%} "
            f"(≥ {at_least(r['of_ceiling_low_frac'])}) | {r['gpu_scaling']} | {per} | "
            f"{r['note']} |"
        )
    out += [""] + sentence(rows, best, target)
    out.append(f"cheapest reaching {target:.0%} of the ceiling for all workloads: {best['all workloads'] or 'none'}")
    return "\n".join(out) + "\n"
