"""The run folder: what a sweep leaves behind, and how to read it back.

``out/<run-id>/``
  - ``trials.parquet``   one row per trial: its settings, status/error, metrics (units in names)
  - ``timeline.parquet`` monitor samples, each tagged with its trial and phase
  - ``ranks.parquet``    N-GPU trials only: one row per rank (its rate, data wait, CPUs, CPU use)
  - ``run.json``         schema version, resolved config, machine snapshot, versions, timed regions, analysis
                         (its ``groups``: each an ``answer.Answer`` in memory, its flat dict on disk)
  - ``summary.md``       the console table as markdown

Trials are rewritten after every trial, so an interrupted or crashed sweep keeps everything
it measured. Every file is written whole or not at all: to a temporary name in the same folder
(``<file>.<pid>.tmp``), synced, then renamed over the old one; a ``.tmp`` whose writer is no
longer running is stale and is removed when the folder is opened (:func:`clean_stale`).
"""

from __future__ import annotations

import errno
import json
import os
import shutil
import time
from dataclasses import dataclass, field
from pathlib import Path

import pandas as pd

from ._version import __version__
from .answer import Answer
from .config import ConfigError
from .schema import SCHEMA_VERSION

TRIALS, TIMELINE, META, SUMMARY = "trials.parquet", "timeline.parquet", "run.json", "summary.md"
RANKS = "ranks.parquet"
RESERVE_BYTES = 1 << 20  # room kept back for run.json's last write on a full disk


class DiskFull(RuntimeError):
    """A run-folder write found no space left: what was saved before stays whole; the message says
    how much room is needed (the CLI exits 2 with it)."""

    def __init__(self, path: Path, partial_bytes: int):
        folder = path.parent
        free = shutil.disk_usage(folder).free
        held = sum(f.stat().st_size for f in folder.iterdir() if f.is_file())
        # a table is rewritten whole next to its old copy: room for both, and for the files to grow
        need = max(2 * max(partial_bytes, path.stat().st_size if path.exists() else 0), 1 << 20)
        super().__init__(
            f"disk full writing {path.name} in {folder}: {free / 1e6:.1f} MB free on its "
            f"filesystem, the run folder holds {held / 1e6:.1f} MB; free at least {need / 1e6:.1f} MB "
            f"more and finish it with --resume {folder}"
        )


class SchemaError(ValueError):
    """A run folder written by a newer pipeprof: its fields may mean something else, so nothing is shown."""


def check_out_dir(out_dir: str | Path) -> None:
    """Create ``out_dir`` and write and remove a probe file in it, before anything is measured; a
    ConfigError naming ``out_dir`` says why it cannot hold run folders."""
    path = Path(out_dir)
    probe = path / f".pipeprof-probe-{os.getpid()}"
    try:
        path.mkdir(parents=True, exist_ok=True)
        probe.write_bytes(b"probe")
        probe.unlink()
    except OSError as exc:
        where = f" ({exc.filename})" if exc.filename and Path(exc.filename) != path else ""
        hint = {
            FileExistsError: "a file, not a folder, has that name",
            NotADirectoryError: "a file stands where a folder of its path should be",
            PermissionError: "no permission to write there",
        }.get(type(exc), exc.strerror or str(exc))
        raise ConfigError(
            f"out_dir: {out_dir} cannot hold run folders: {hint}{where} [{type(exc).__name__}: {exc.strerror or exc}]"
        ) from None


def new_run_dir(out_dir: str | Path, name: str) -> Path:
    """``out_dir/<name>-YYYYmmdd-HHMMSS[-k]``, created, and this caller's alone: runs started in the same
    second (separate processes, other machines on a shared filesystem) each get their own. mkdir is the
    claim: it creates or fails atomically (EEXIST on NFS too), so a folder another run made first is
    never shared; testing ``exists()`` first would leave a gap between the test and the mkdir."""
    base = Path(out_dir) / f"{name}-{time.strftime('%Y%m%d-%H%M%S')}"
    base.parent.mkdir(parents=True, exist_ok=True)
    path, k = base, 1
    while True:
        try:
            path.mkdir()
            return path
        except FileExistsError:
            path, k = Path(f"{base}-{k}"), k + 1


def _atomic(path: Path, write) -> None:
    """``write(tmp)`` then rename ``tmp`` over ``path``: a reader (or a crash) sees the old file or the
    new one, never half of one. A write that fails (a full disk) removes its ``tmp`` and keeps the old file."""
    tmp = path.with_name(f"{path.name}.{os.getpid()}.tmp")  # the pid tells a live writer's file from a stale one
    try:
        write(tmp)
        with open(tmp, "rb") as f:  # on disk before the rename: a power cut cannot leave an empty file
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except OSError as exc:
        partial = tmp.stat().st_size if tmp.exists() else 0
        tmp.unlink(missing_ok=True)
        if exc.errno in (errno.ENOSPC, errno.EDQUOT):
            raise DiskFull(path, partial) from None
        raise
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise


def clean_stale(path: str | Path) -> list[str]:
    """Remove the ``.tmp`` files of writers that are no longer running (a run killed mid-write); returns
    their names. A live writer's file (its pid still running) is left alone."""
    removed = []
    for tmp in Path(path).glob("*.tmp"):
        pid = tmp.suffixes[-2].lstrip(".") if len(tmp.suffixes) >= 2 else ""
        if pid.isdigit() and is_running(int(pid)):
            continue
        try:
            tmp.unlink()
            removed.append(tmp.name)
        except OSError:  # a read-only folder: the report still reads the complete files
            pass
    return removed


def is_running(pid: int) -> bool:
    """A process ``pid`` exists on this machine."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # another user's process: alive
        return True
    return True


def frame(rows: list[dict]) -> pd.DataFrame:
    """Rows → DataFrame with numbers kept numeric (None → NaN only in numeric columns)."""
    df = pd.DataFrame(rows)
    for col in df.columns:
        if (
            df[col].dtype == object
            and df[col].map(lambda v: v is None or isinstance(v, (int, float))).all()
            and df[col].notna().any()
            and not df[col].map(lambda v: isinstance(v, bool)).any()
        ):
            df[col] = pd.to_numeric(df[col])
    return df


@dataclass
class Run:
    """A run folder in memory."""

    path: Path
    meta: dict = field(default_factory=dict)
    trials: pd.DataFrame = field(default_factory=pd.DataFrame)
    timeline: pd.DataFrame = field(default_factory=pd.DataFrame)
    ranks: pd.DataFrame = field(default_factory=pd.DataFrame)  # N-GPU trials: a row per rank
    problems: list[str] = field(default_factory=list)  # files missing or unreadable when loaded, each named

    def unfinished(self) -> str | None:
        """A sentence when the run did not finish (status running or interrupted), with the trials done of
        those planned; None for a finished run."""
        status = self.meta.get("status")
        if status not in ("running", "interrupted"):
            return None
        why = (
            "it was interrupted"
            if status == "interrupted"
            else "its process stopped without finishing — killed, crashed, or still running"
        )
        planned = self.meta.get("trials_planned")
        of = f" of {planned} planned" if planned else " (an adaptive search: the number planned grows as it goes)"
        analysed = "" if "analysis" in self.meta else "; no analysis was saved: the trials are shown as measured"
        return f"the run did not finish (status '{status}': {why}): {len(self.trials)} trials done{of}{analysed}"

    def reserve(self, size: int = RESERVE_BYTES) -> None:
        """Hold ``size`` bytes in the folder (a ``.tmp`` named for this process: a killed run's is cleaned
        like any stale one), given back by :meth:`release_reserve` so a run that fills the disk can still
        write its final status."""
        try:
            with open(self._reserve_path(), "wb") as f:
                f.write(b"\0" * size)
                os.fsync(f.fileno())
        except OSError as exc:
            self.release_reserve()
            if exc.errno in (errno.ENOSPC, errno.EDQUOT):
                raise DiskFull(self._reserve_path(), size) from None
            raise

    def release_reserve(self) -> None:
        self._reserve_path().unlink(missing_ok=True)

    def _reserve_path(self) -> Path:
        return self.path / f".reserve.{os.getpid()}.tmp"

    def save_meta(self) -> None:
        _atomic(self.path / META, lambda p: p.write_text(json.dumps(self.meta, indent=2, default=_jsonable)))

    def save_trials(self, rows: list[dict]) -> None:
        """The trial rows; an N-GPU trial's ``ranks`` go to their own table, keyed by trial_id."""
        ranks = [r | {"trial_id": row["trial_id"]} for row in rows for r in row.get("ranks") or []]
        self.trials = frame([{k: v for k, v in row.items() if k != "ranks"} for row in rows])
        _atomic(self.path / TRIALS, lambda p: self.trials.to_parquet(p, index=False))
        self.ranks = frame(ranks)
        if ranks:
            _atomic(self.path / RANKS, lambda p: self.ranks.to_parquet(p, index=False))
        else:  # a resumed run whose N-GPU rows were all run again without ranks: none stale
            (self.path / RANKS).unlink(missing_ok=True)

    def save_timeline(self, timeline: pd.DataFrame) -> None:
        self.timeline = timeline
        _atomic(self.path / TIMELINE, lambda p: timeline.to_parquet(p, index=False))

    def save_summary(self, markdown: str) -> None:
        _atomic(self.path / SUMMARY, lambda p: p.write_text(markdown))


def _jsonable(obj):
    """run.json's encoder for what JSON has no type for: an answer as its stored dict, anything else as text."""
    return obj.to_dict() if isinstance(obj, Answer) else str(obj)


def load_run(path: str | Path, partial: bool = False) -> Run:
    """Read a run folder; raises FileNotFoundError naming what is missing, ValueError naming the file
    that cannot be read or the schema it needs. A run of an older schema is upgraded in memory
    (never on disk) to what this version's renderers read; see :func:`upgrade`.

    A table that is missing where the run's status says it should exist, or that cannot be read, is
    listed in ``run.problems`` (naming the file) and left empty. With ``partial`` an unreadable run.json
    is listed there too, so a report shows what the tables hold. Stale ``.tmp`` files are removed.
    """
    path = Path(path)
    if not (path / META).is_file() and not (partial and (path / TRIALS).is_file()):
        raise FileNotFoundError(f"{path} is not a pipeprof run folder (no {META})")
    clean_stale(path)
    run = Run(path)
    try:
        run.meta = _read_meta(path / META)
    except SchemaError:
        raise
    except (OSError, ValueError) as exc:
        if not partial:
            raise
        run.problems.append(f"{exc}: the configuration, machine and analysis it holds are not shown")
    finished = run.meta.get("status") not in ("running", None)
    run.trials = _read_table(path / TRIALS, finished, run.problems, "no trial table: no measurements are shown")
    run.timeline = _read_table(path / TIMELINE, finished, run.problems, "no monitor timeline")
    run.ranks = _read_table(path / RANKS, False, run.problems, "no per-rank rows")
    if run.meta:
        run.meta = upgrade(run.meta, run.trials)  # this schema's too: its answers are read as Answers
    return run


def _read_meta(file: Path) -> dict:
    if not file.is_file():
        raise FileNotFoundError(f"{file}: missing")
    try:
        meta = json.loads(file.read_text())
    except ValueError as exc:
        raise ValueError(f"{file}: not valid JSON ({exc})") from None
    if not isinstance(meta, dict):
        raise ValueError(f"{file}: expected a JSON object, got {type(meta).__name__}")
    version = meta.get("schema_version", 1)
    if version > SCHEMA_VERSION:  # never a partial report: the fields may mean something else
        raise SchemaError(
            f"{file.parent} was written with run-folder schema {version}; this pipeprof "
            f"({__version__}) reads schema {SCHEMA_VERSION} and older: upgrade pipeprof to report it"
        )
    for key in _OBJECT_FIELDS:  # a hand-edited or foreign run.json: named here, not an AttributeError later
        if key in meta and not isinstance(meta[key], dict):
            got = "null" if meta[key] is None else type(meta[key]).__name__
            raise ValueError(f'{file}: the field "{key}" is {got}, expected a JSON object')
    return meta


# run.json's fields that every reader takes as objects wherever they are present
_OBJECT_FIELDS = ("config", "machine")


def _read_table(file: Path, expected: bool, problems: list, lost: str) -> pd.DataFrame:
    """The parquet table, or an empty one with the reason added to ``problems`` (a file that is missing
    only counts when ``expected``: a run still running has not written its timeline yet)."""
    if not file.is_file():
        if expected:
            problems.append(f"{file}: missing: {lost}")
        return pd.DataFrame()
    try:
        return pd.read_parquet(file)
    except Exception as exc:  # pyarrow raises its own types for a truncated or foreign file
        problems.append(f"{file}: cannot be read ({type(exc).__name__}: {exc}): {lost}")
        return pd.DataFrame()


def load_measured(path: str | Path) -> Run:
    """:func:`load_run` for a reader that works on the run's trials (compare, size, merge, a regression
    check): a trial table that is missing or cannot be read is a ValueError naming the file and why,
    not an empty table that reads as a run with no trials."""
    run = load_run(path)
    lost = [p for p in run.problems if Path(p.split(":", 1)[0]).name == TRIALS]
    if lost:
        raise ValueError(lost[0])
    return run


def upgrade(meta: dict, trials: pd.DataFrame) -> dict:
    """An older run's meta as this schema reads it, one step at a time, from what the run stored (its
    analysis is kept, not recomputed); a meta of this schema is returned with its answers read.

    1 → 2: its verdict rows become the curve rows (``gpu_bound`` renamed ``step_bound``), beside the
    trials' stored CV, utilisation and memory; its epoch estimates move into the analysis.
    2 → 3: the groups' stored form is unchanged; each is read as an :class:`~pipeprof.answer.Answer`
    (keys it does not know kept in its ``extra``), as every version's are (:func:`with_answers`)."""
    version = meta.get("schema_version", 1)
    if version < 2:
        meta = _from_schema_1(meta, trials)
    meta = with_answers(meta)
    if version < SCHEMA_VERSION:
        meta = meta | {"schema_version": SCHEMA_VERSION, "upgraded_from_schema": version}
    return meta


def with_answers(meta: dict) -> dict:
    """``meta`` with its analysis's groups as :class:`~pipeprof.answer.Answer` (the stored dicts read; an
    Answer already is one); a meta without an analysis, or without groups, as it was."""
    analysis = meta.get("analysis")
    if not isinstance(analysis, dict) or "groups" not in analysis:
        return meta
    groups = [g if isinstance(g, Answer) else Answer.from_dict(g) for g in analysis["groups"] or []]
    return meta | {"analysis": analysis | {"groups": groups}}


def _from_schema_1(meta: dict, trials: pd.DataFrame) -> dict:
    """Schema 1 → 2 (see :func:`upgrade`)."""
    meta = dict(meta)
    analysis = dict(meta.get("analysis") or {})
    rows = pd.DataFrame(analysis.get("verdicts", [])).rename(
        columns={"gpu_bound_samples_per_s": "step_bound_samples_per_s"}
    )
    extra = [
        "trial_id",
        "samples_per_s_cv",
        "cpu_util_pct_mean",
        "pss_mb_steady",
        "status",
        "unstable",
        "unstable_reason",
        "cache_note",
        "emulated",
    ]
    if len(rows) and "trial_id" in trials:
        rows = rows.merge(trials[[c for c in extra if c in trials]], on="trial_id", how="left")
    analysis["curves"] = rows.astype(object).where(rows.notna(), None).to_dict("records")
    analysis.setdefault("epochs", (meta.get("storage") or {}).get("epochs", []))
    return meta | {"analysis": analysis, "schema_version": 2}
