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


def render_pairs(rows: pd.DataFrame) -> str:
    """The size table's model against a run's own masked pairs (``analysis.workstation.masked_pairs``), a row
    each; empty where the run measured none."""
    if rows.empty:
        return ""
    out = [
        "the model against the run's masked pairs (windows alternated between all CPUs and the mask):",
        "",
        "| workload | cores | CPUs | all CPUs/s | masked/s | predicted/s | ratio: model / measured | error "
        "| worker CPU ms a sample: pair / curve | ratio on the curve |",
        "|" + "---|" * 10,
    ]
    for _, r in rows.iterrows():
        span = "" if r["error_low"] != r["error_low"] else f" ({r['error_low']:+.1%} … {r['error_high']:+.1%})"
        cost = "–" if r.get("basis") != "pair" else f"{r['worker_cpu_ms']:.2f}"
        out.append(
            f"| {r['workload']} | {r['cores']} | {r['cpus']} | {r['all_cpus_samples_per_s']:,.1f} | "
            f"{r['masked_samples_per_s']:,.1f} | {r['predicted_samples_per_s']:,.1f} | {r['model_ratio']:.3f} / "
            f"{r['measured_ratio']:.3f} | {r['error_frac']:+.1%}{span} | {cost} / {r['curve_worker_cpu_ms']:.2f} | "
            f"{r['curve_ratio']:.3f} ({r['curve_ratio'] / r['measured_ratio'] - 1:+.1%}) |"
        )
    out += [
        "",
        "model: the size table's arithmetic (the cores less the training process's share, a worker a core, under "
        "the step and the hand-off) at the CPU cost a sample the pair's own all-CPU windows measured; predicted: the "
        "all-CPU windows' rate times its ratio of that many cores to that many workers on all of them, the masked "
        "rate for the same minutes; error: against the masked windows' rate, the machine's moves paired out. "
        "Ratio on the curve: the same read at the curve's cost (its trials ran in other minutes), its error beside",
    ]
    return "\n".join(out) + "\n"
