"""``pipeprof bench watch-overhead SCRIPT``: what ``pipeprof watch`` costs a training script.

The script runs plain and under ``pipeprof watch``, alternating (plain then watched, watched then
plain, ...), each with ``--steps N`` added to its arguments. Its rate is read from the progress lines
it prints anyway ("step 50 loss 2.31"): its standard output is read here line by line and each line
is stamped on arrival; a line that matches ``--progress`` (default: ``step <n>``) gives the step count
at that moment. A run's rate is (last step - first step) / (arrival of the last - arrival of the
first), in steps/s: start-up (imports, workers, cuDNN autotuning), the steps before the first
progress line and the tear-down are outside the timed region, and both modes are timed by the same
clock in the same way. Between two start-ups of the same script the time to the first step moves by
seconds, so timing whole runs (or a long run against a short one) would bury a cost of 1% under it.

Under ``pipeprof watch`` the job writes to the descriptors the watch was given (the watch does not
pipe its output), so a line arrives here as fast in both modes. A pair's cost is 1 - watched / plain;
the result is the mean over pairs with its 95% interval, and each run's progress intervals give its
own spread.
"""

from __future__ import annotations

import re
import shlex
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Callable, Optional

import pandas as pd

from pipeprof.stats import mean_ci95

PROGRESS = r"\bstep\s+(\d+)"


def progress_rate(stamped: list[tuple[float, str]], pattern: str = PROGRESS) -> dict:
    """Steps/s between the first and the last progress line of one run's stamped output ((arrival s,
    line) pairs), and each interval's rate between consecutive progress lines (their spread)."""
    seen = [(t, int(m.group(1))) for t, line in stamped if (m := re.search(pattern, line))]
    if len(seen) < 2 or seen[-1][1] <= seen[0][1] or seen[-1][0] <= seen[0][0]:
        raise ValueError(
            f"the script printed {len(seen)} progress line(s) matching {pattern!r}: at least two, "
            "with rising step counts, are needed to time it (print e.g. 'step 50' as it trains, "
            "or pass --progress REGEX whose first group is the step count)"
        )
    parts = [(s1 - s0) / (t1 - t0) for (t0, s0), (t1, s1) in zip(seen, seen[1:]) if t1 > t0 and s1 > s0]
    return {
        "steps_per_s": (seen[-1][1] - seen[0][1]) / (seen[-1][0] - seen[0][0]),
        "timed_steps": seen[-1][1] - seen[0][1],
        "timed_s": seen[-1][0] - seen[0][0],
        "first_progress_s": seen[0][0],
        "interval_rates_cv": (statistics.stdev(parts) / statistics.fmean(parts)) if len(parts) > 1 else None,
    }


def stamped_run(cmd: list[str], log_file: Path) -> tuple[list[tuple[float, str]], float]:
    """Run ``cmd``; its stdout lines stamped on arrival (seconds from Popen) and copied with its stderr
    to ``log_file``; (the lines, the wall time). A failing command is an error, not a figure."""
    lines = []
    with open(log_file, "a") as sink:
        t0 = time.perf_counter()
        proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=sink, text=True, bufsize=1)
        for line in proc.stdout:
            lines.append((time.perf_counter() - t0, line))
            sink.write(line)
        code = proc.wait()
        wall = time.perf_counter() - t0
    if code != 0:
        raise RuntimeError(f"{' '.join(cmd)} exited {code}; its output is in {log_file}")
    return lines, wall


def _one_run(job: list[str], mode: str, out: Path, pattern: str) -> dict:
    log_file = out / f"{mode}.log"
    cmd = (
        job
        if mode == "plain"
        else [
            sys.executable,
            "-m",
            "pipeprof",
            "watch",
            "--out-dir",
            str(out / "runs"),
            "--log",
            str(out / "watch.log"),
            "--",
            *job,
        ]
    )
    lines, wall = stamped_run(cmd, log_file)
    return {"mode": mode, "wall_s": wall} | progress_rate(lines, pattern)


def watch_overhead(
    script: str,
    script_args: str = "",
    steps: int = 200,
    repeats: int = 3,
    out_dir: str = "out/bench",
    progress: str = PROGRESS,
    log: Callable[[str], None] = print,
) -> pd.DataFrame:
    """The script plain and watched, ``repeats`` pairs in alternating order, each run at ``--steps``;
    one row per run (see the module)."""
    if not script:
        raise ValueError("watch-overhead needs the training script: pipeprof bench watch-overhead SCRIPT")
    re.compile(progress)  # a bad pattern fails here, before the first run
    out = Path(out_dir) / f"watch-overhead-{time.strftime('%Y%m%d-%H%M%S')}"
    out.mkdir(parents=True)
    job = [sys.executable, script, *shlex.split(script_args), "--steps", str(steps)]
    rows = []
    for pair in range(1, repeats + 1):
        for mode in ("plain", "watched") if pair % 2 else ("watched", "plain"):
            rows.append(_one_run(job, mode, out, progress) | {"pair": pair})
            log(
                f"pair {pair}/{repeats} {mode}: {rows[-1]['steps_per_s']:.2f} steps/s over "
                f"{rows[-1]['timed_steps']} steps ({rows[-1]['wall_s']:.1f} s in all)"
            )
    return pd.DataFrame(rows)


def overhead(df: pd.DataFrame) -> dict:
    """Cost of watching per pair (1 - watched / plain steps/s), its mean and 95% interval."""
    wide = df.pivot(index="pair", columns="mode", values="steps_per_s")
    costs = list(1 - wide["watched"] / wide["plain"])
    lo, hi = mean_ci95(costs)
    return {"costs": costs, "mean": statistics.fmean(costs), "ci95_low": lo, "ci95_high": hi, "pairs": len(costs)}


def render_watch_overhead(df: pd.DataFrame) -> str:
    """Markdown: per pair the two rates and the cost, then the mean cost with its 95% interval."""
    o = overhead(df)
    wide = df.pivot(index="pair", columns="mode", values="steps_per_s")
    cv = df.pivot(index="pair", columns="mode", values="interval_rates_cv")
    lines = [
        "| pair | plain steps/s | watched steps/s | cost | spread inside the runs (CV, plain / watched) |",
        "|---|---|---|---|---|",
    ]
    for (pair, row), c in zip(wide.iterrows(), o["costs"]):
        lines.append(
            f"| {pair} | {row['plain']:.2f} | {row['watched']:.2f} | {c:+.2%} | "
            f"{_pct(cv.loc[pair, 'plain'])} / {_pct(cv.loc[pair, 'watched'])} |"
        )
    span = (
        f" (95% interval {o['ci95_low']:+.2%} to {o['ci95_high']:+.2%})"
        if o["ci95_low"] is not None
        else " (one pair: no interval)"
    )
    return (
        "\n".join(
            lines
            + [
                "",
                f"cost of watching: {o['mean']:+.2%} of steps/s{span}, over {o['pairs']} pairs; "
                "timed from the script's first to its last progress line",
            ]
        )
        + "\n"
    )


def _pct(v: Optional[float]) -> str:
    return "–" if v is None or v != v else f"{v:.1%}"
