"""The run folder: what a sweep leaves behind, and how to read it back.

``out/<run-id>/``
  - ``trials.parquet``   one row per trial: its settings, status/error, metrics (units in names)
  - ``timeline.parquet`` monitor samples, each tagged with its trial and phase
  - ``run.json``         resolved config, machine snapshot, versions, timed regions, analysis
  - ``summary.md``       the console table as markdown

Trials are rewritten after every trial (atomically), so an interrupted or crashed
sweep keeps everything it measured.
"""
from __future__ import annotations

import json
import os
import time
from dataclasses import dataclass, field
from pathlib import Path

import pandas as pd

TRIALS, TIMELINE, META, SUMMARY = "trials.parquet", "timeline.parquet", "run.json", "summary.md"


def new_run_dir(out_dir: str | Path, name: str) -> Path:
    """``out_dir/<name>-YYYYmmdd-HHMMSS[-k]``, created."""
    base = Path(out_dir) / f"{name}-{time.strftime('%Y%m%d-%H%M%S')}"
    path, k = base, 1
    while path.exists():
        path, k = Path(f"{base}-{k}"), k + 1
    path.mkdir(parents=True)
    return path


def _atomic(path: Path, write) -> None:
    tmp = path.with_name(path.name + ".tmp")
    write(tmp)
    os.replace(tmp, path)


def frame(rows: list[dict]) -> pd.DataFrame:
    """Rows → DataFrame with numbers kept numeric (None → NaN only in numeric columns)."""
    df = pd.DataFrame(rows)
    for col in df.columns:
        if df[col].dtype == object and df[col].map(lambda v: v is None or isinstance(v, (int, float))).all() \
                and df[col].notna().any() and not df[col].map(lambda v: isinstance(v, bool)).any():
            df[col] = pd.to_numeric(df[col])
    return df


@dataclass
class Run:
    """A run folder in memory."""

    path: Path
    meta: dict = field(default_factory=dict)
    trials: pd.DataFrame = field(default_factory=pd.DataFrame)
    timeline: pd.DataFrame = field(default_factory=pd.DataFrame)

    def save_meta(self) -> None:
        _atomic(self.path / META, lambda p: p.write_text(json.dumps(self.meta, indent=2, default=str)))

    def save_trials(self, rows: list[dict]) -> None:
        self.trials = frame(rows)
        _atomic(self.path / TRIALS, lambda p: self.trials.to_parquet(p, index=False))

    def save_timeline(self, timeline: pd.DataFrame) -> None:
        self.timeline = timeline
        _atomic(self.path / TIMELINE, lambda p: timeline.to_parquet(p, index=False))

    def save_summary(self, markdown: str) -> None:
        _atomic(self.path / SUMMARY, lambda p: p.write_text(markdown))


def load_run(path: str | Path) -> Run:
    """Read a run folder written by a sweep; raises FileNotFoundError naming what is missing."""
    path = Path(path)
    if not (path / META).is_file():
        raise FileNotFoundError(f"{path} is not a pipeprof run folder (no {META})")
    run = Run(path, json.loads((path / META).read_text()))
    if (path / TRIALS).is_file():
        run.trials = pd.read_parquet(path / TRIALS)
    if (path / TIMELINE).is_file():
        run.timeline = pd.read_parquet(path / TIMELINE)
    return run
