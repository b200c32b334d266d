"""``pipeprof bench regress CONFIG --against RUN_DIR``: the CI guard where the base run is old.

A stored base run was measured on another day, on a machine that has drifted since; comparing a new run with it
mixes the machine's drift into the change. Here the base run's own config (as its run.json stored it) is run
again, alternating with CONFIG, in one process and today's code, A B B A (``--times`` cycles): the slow drift of
the machine falls on both, and each side's windows are pooled over its runs before the guard
(``analysis.guard``) reads the change with its interval. Settings that differ wholesale between the two configs
(a preset, a decoder) are what is compared, not a reason for trials not to match.
"""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace
from typing import Callable

import numpy as np
import pandas as pd
import yaml

from pipeprof import config as cfgmod
from pipeprof.analysis.compare import SETTINGS, changed
from pipeprof.analysis.guard import Guarded, guard
from pipeprof.orchestrate.runner import execute, prepare
from pipeprof.results import load_run

ORDER = ("base", "new", "new", "base")


def pooled(runs: list):
    """The runs of one side as one: each trial's windows from every run (matched by trial id), its rate their
    median, and each run's mean (``run_rates``: the guard widens the windows' interval by the runs' spread); the
    CPU reference left out (the alternation, not a reference, takes the drift out)."""
    first = runs[0]
    windows: dict = {}
    means: dict = {}
    for run in runs:
        for tid, rates in zip(run.trials["trial_id"], run.trials.get("window_rates", [])):
            if rates is not None and not isinstance(rates, float) and len(rates):
                windows.setdefault(tid, []).extend(list(rates))
                means.setdefault(tid, []).append(float(np.mean(rates)))
    trials = first.trials.copy()
    trials["window_rates"] = [windows.get(t) for t in trials["trial_id"]]
    trials["run_rates"] = [means.get(t) for t in trials["trial_id"]]
    trials["samples_per_s"] = [
        float(np.median(w)) if w else r for w, r in zip(trials["window_rates"], trials["samples_per_s"])
    ]
    return SimpleNamespace(trials=trials, meta={**first.meta, "cpu_reference": None}, path=first.path)


def regress(
    config: str,
    against: str,
    overrides: list[str],
    threshold_frac: float = 0.05,
    times: int = 1,
    out_dir: str = "out/bench",
    log: Callable[[str], None] = print,
) -> tuple[Guarded, pd.DataFrame]:
    """The guard's reading of CONFIG against the base run's config, run A B B A ``times`` times; and one row
    per run (side, folder, wall time)."""
    base = load_run(against)
    base_config = Path(out_dir) / f"regress-base-{base.path.name}.yaml"
    base_config.parent.mkdir(parents=True, exist_ok=True)
    base_config.write_text(yaml.safe_dump(base.meta["config"]))
    paths = {"base": str(base_config), "new": config}
    for side in ("base", "new"):
        prepare(cfgmod.load(paths[side], [*overrides, f"out_dir={out_dir}"]), log=lambda *a: None)
    runs: dict = {"base": [], "new": []}
    rows = []
    for i, side in enumerate(ORDER * times):
        log(f"run {i + 1}/{len(ORDER) * times}: {side}")
        run = execute(
            cfgmod.load(paths[side], [*overrides, f"out_dir={out_dir}", f"name=regress-{i + 1}-{side}"]),
            log=lambda *a: None,
        )
        runs[side].append(run)
        rows.append({"run": i + 1, "side": side, "folder": str(run.path), "wall_s": run.meta.get("wall_s")})
    a, b = pooled(runs["base"]), pooled(runs["new"])
    across = changed(a, b, [c for c in SETTINGS if c != "kind"])  # what the two configs set apart is compared
    return guard(a, b, threshold_frac, allow_other_machine=True, across=across), pd.DataFrame(rows)
