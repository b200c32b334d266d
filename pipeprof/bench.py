"""Benchmarks of pipeprof itself: commands that print figures, not timed tests.

``pipeprof bench sweep-speed``: the adaptive search against the exhaustive grid on the same
machine and dataset, run in alternation (A E, then E A, ...) so the machine's drift does not
favour one. Per run it prints the wall time to the full answer (preparation, CPU reference,
trials and analysis: what a user waits for), the trials run, the recommended num_workers, the
end-to-end rate measured there, the verdict there and the two overheads pipeprof measures on
itself (monitor, stage clocks) with their intervals; then per pair the time ratio and the rate
difference at the two recommendations.
"""
from __future__ import annotations

import time
from typing import Callable, Optional

import pandas as pd

from . import config as cfgmod
from .runner import execute, prepare


def sweep_speed(config: Optional[str], overrides: list[str], repeats: int = 1, out_dir: str = "out/bench",
                log: Callable[[str], None] = print) -> pd.DataFrame:
    """One row per run: ``repeats`` pairs of (adaptive, exhaustive), the order alternating per pair."""
    base = [*overrides, f"out_dir={out_dir}"]
    if cfgmod.load(config, base).loader.num_workers is not None:
        raise cfgmod.ConfigError("loader.num_workers must be unset for sweep-speed: the adaptive sweep searches "
                                 "it and the exhaustive one takes the machine's default grid")
    prepare(cfgmod.load(config, base), log=lambda *a: None)  # the dataset is made once, outside the timing
    rows = []
    for i in range(repeats):
        for sweep in ("adaptive", "exhaustive") if i % 2 == 0 else ("exhaustive", "adaptive"):
            cfg = cfgmod.load(config, [*base, f"sweep={sweep}", f"name=bench-{sweep}"])
            log(f"pair {i + 1}/{repeats}: {sweep} sweep")
            t0 = time.perf_counter()
            run = execute(cfg, log=lambda *a: None)
            rows += [_row(run, sweep, i, time.perf_counter() - t0, g) for g in run.meta["analysis"]["groups"]]
    return pd.DataFrame(rows)


def _row(run, sweep: str, pair: int, wall_s: float, group: dict) -> dict:
    """One run's answer for one group, read from its stored analysis."""
    a = run.meta["analysis"]
    rec = group.get("recommended_workers")
    at = [c for c in a["curves"] if c["num_workers"] == rec and all(c.get(k) == group.get(k) for k in
                                                                    ("model", "precision", "preset", "source"))]
    monitor, clocks = a.get("monitor_overhead") or {}, a.get("stage_timing_overhead") or {}
    return {"pair": pair + 1, "sweep": sweep, "group": " ".join(str(group.get(k)) for k in
                                                               ("model", "precision", "preset", "batch_size")),
            "wall_s": wall_s, "trials": a["trials"], "recommended_workers": rec,
            "samples_per_s": at[0]["samples_per_s"] if at else None,
            "verdict": group.get("verdict_at_recommended"), "run": str(run.path),
            **_cost("monitor", monitor), **_cost("clocks", clocks)}


def _cost(name: str, overhead: dict) -> dict:
    """An overhead's cost and 95% interval (each a share of the rate), None where not measured."""
    if isinstance(overhead, list):  # one per preset: the first stands for the run
        overhead = overhead[0] if overhead else {}
    return {f"{name}_cost": overhead.get("overhead_frac"), f"{name}_low": overhead.get("overhead_ci95_low"),
            f"{name}_high": overhead.get("overhead_ci95_high")}


def pairs(df: pd.DataFrame) -> pd.DataFrame:
    """Per pair and group: exhaustive/adaptive wall time, the two recommendations and the rate
    difference at them (adaptive's rate at its pick relative to the exhaustive one's at its pick)."""
    out = []
    for (pair, group), g in df.groupby(["pair", "group"], sort=False):
        a, e = (g[g["sweep"] == s].iloc[0] if (g["sweep"] == s).any() else None for s in ("adaptive", "exhaustive"))
        if a is None or e is None:
            continue
        diff = a["samples_per_s"] / e["samples_per_s"] - 1 if a["samples_per_s"] and e["samples_per_s"] else None
        out.append({"pair": pair, "group": group, "adaptive_s": a["wall_s"], "exhaustive_s": e["wall_s"],
                    "time_ratio": e["wall_s"] / a["wall_s"], "adaptive_trials": a["trials"],
                    "exhaustive_trials": e["trials"], "adaptive_workers": a["recommended_workers"],
                    "exhaustive_workers": e["recommended_workers"], "rate_diff": diff,
                    "adaptive_verdict": a["verdict"], "exhaustive_verdict": e["verdict"]})
    return pd.DataFrame(out)


def render_sweep_speed(df: pd.DataFrame) -> str:
    """Markdown: the runs, then the pairs."""
    def pct(v, lo=None, hi=None) -> str:
        if v is None or v != v:
            return "–"
        return f"{v:+.1%}" + ("" if lo is None or lo != lo else f" ({lo:+.1%}…{hi:+.1%})")

    lines = ["| pair | sweep | group | wall s | trials | num_workers | samples/s | verdict | monitor cost | "
             "clock cost |", "|" + "---|" * 10]
    for r in df.itertuples():
        rate = "–" if r.samples_per_s is None or r.samples_per_s != r.samples_per_s else f"{r.samples_per_s:,.1f}"
        lines.append(f"| {r.pair} | {r.sweep} | {r.group} | {r.wall_s:.0f} | {r.trials} | {r.recommended_workers} | "
                     f"{rate} | {r.verdict} | {pct(r.monitor_cost, r.monitor_low, r.monitor_high)} | "
                     f"{pct(r.clocks_cost, r.clocks_low, r.clocks_high)} |")
    p = pairs(df)
    lines += ["", "| pair | group | exhaustive / adaptive time | num_workers (adaptive, exhaustive) | "
                  "rate at adaptive's pick vs exhaustive's | verdicts |", "|" + "---|" * 6]
    for r in p.itertuples():
        lines.append(f"| {r.pair} | {r.group} | {r.exhaustive_s:.0f} s / {r.adaptive_s:.0f} s = {r.time_ratio:.1f}x | "
                     f"{r.adaptive_workers}, {r.exhaustive_workers} | {pct(r.rate_diff)} | "
                     f"{r.adaptive_verdict}, {r.exhaustive_verdict} |")
    return "\n".join(lines) + "\n"
