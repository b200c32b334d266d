"""The run folder: what a sweep leaves behind, and how to read it back.

``out/<run-id>/``
  - ``trials.parquet``   one row per trial: its settings, status/error, metrics (units in names)
  - ``timeline.parquet`` monitor samples, each tagged with its trial and phase
  - ``run.json``         schema version, resolved config, machine snapshot, versions, timed regions, analysis
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

from ._version import __version__
from .schema import SCHEMA_VERSION

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
    """Read a run folder; raises FileNotFoundError naming what is missing, ValueError naming the file
    that cannot be read or the schema it needs. A run of an older schema is upgraded in memory
    (never on disk) to what this version's renderers read; see :func:`upgrade`."""
    path = Path(path)
    if not (path / META).is_file():
        raise FileNotFoundError(f"{path} is not a pipeprof run folder (no {META})")
    try:
        meta = json.loads((path / META).read_text())
    except ValueError as exc:
        raise ValueError(f"{path / META}: not valid JSON ({exc})") from None
    if not isinstance(meta, dict):
        raise ValueError(f"{path / META}: expected a JSON object, got {type(meta).__name__}")
    version = meta.get("schema_version", 1)
    if version > SCHEMA_VERSION:
        raise ValueError(f"{path} was written with run-folder schema {version}; this pipeprof "
                         f"({__version__}) reads schema {SCHEMA_VERSION} and older: upgrade pipeprof to report it")
    run = Run(path, meta)
    if (path / TRIALS).is_file():
        run.trials = pd.read_parquet(path / TRIALS)
    if (path / TIMELINE).is_file():
        run.timeline = pd.read_parquet(path / TIMELINE)
    if version < SCHEMA_VERSION:
        run.meta = upgrade(meta, run.trials)
    return run


def upgrade(meta: dict, trials: pd.DataFrame) -> dict:
    """Schema 1 → 2, from what the older run stored (its analysis is kept, not recomputed): its
    verdict rows become the curve rows (``gpu_bound`` renamed ``step_bound``), beside the trials'
    stored CV, utilisation and memory; its epoch estimates move into the analysis."""
    meta = dict(meta)
    analysis = dict(meta.get("analysis") or {})
    rows = pd.DataFrame(analysis.get("verdicts", [])).rename(
        columns={"gpu_bound_samples_per_s": "step_bound_samples_per_s"})
    extra = ["trial_id", "samples_per_s_cv", "cpu_util_pct_mean", "pss_mb_steady", "status", "unstable",
             "unstable_reason", "cache_note", "emulated"]
    if len(rows) and "trial_id" in trials:
        rows = rows.merge(trials[[c for c in extra if c in trials]], on="trial_id", how="left")
    analysis["curves"] = rows.astype(object).where(rows.notna(), None).to_dict("records")
    analysis.setdefault("epochs", (meta.get("storage") or {}).get("epochs", []))
    meta |= {"analysis": analysis, "schema_version": SCHEMA_VERSION,
             "upgraded_from_schema": meta.get("schema_version", 1)}
    return meta
