"""The run folder of a watch (kind ``watch``): rows per loader and rank, the step, the pause's points.

``trials.parquet`` holds, per loader (its construction site) and rank, an ``end_to_end`` row of the
watched window; per loader a ``gpu_ceiling`` row, the step's own rate in the loop; with ``--tune`` a
``cpu_pipeline`` row per worker count the pause measured. The monitor's columns are those of the
rows' windows; the training process's and the loader's workers' CPU are that rank's and that
loader's own (``procs``). ``batches.parquet`` keeps every batch as sent (raw samples; the rows are
derived from them), ``timeline.parquet`` the monitor. run.json says how the watch ended, what the
job raised, each loader's settings and site, and the analysis: the same ``analysis.analyse`` that
reads a sweep (``answer``).
"""

from __future__ import annotations

import time

import pandas as pd

from pipeprof._version import __version__
from pipeprof.measure.monitors import block_interval, summarize
from pipeprof.results import Run, new_run_dir
from pipeprof.schema import SCHEMA_VERSION

from .records import STEP_REGION, WATCH_REGION, loader_identity, loader_row, step_row, warmup_batches, windows

TUNE_REGION = "next() on a copy of the user's loader alone, during the pause (as cpu_pipeline)"
HANDOFF_REGION = (
    "next() on a copy of the user's loader alone over one real sample built once and returned for every index, "
    "during the pause (as the handoff trial: collate, hand-over, pinning, no read, decode or augment)"
)
TUNE_KEYS = ("model", "precision", "mode", "preset", "loader", "batch_size", "pin_memory", "prefetch_factor", "site")


def _in(df: pd.DataFrame, spans: list[tuple[float, float]]) -> pd.DataFrame:
    if df.empty or not spans:
        return df.iloc[0:0]
    t = df["t_s"]
    keep = pd.Series(False, index=df.index)
    for a, b in spans:
        keep |= (t >= a) & (t <= b)
    return df[keep]


def cpu_columns(procs, spans, main: set, workers: set) -> dict:
    """The rank's training process and the loader's workers: mean CPU % and its 95% interval (blocks)."""
    out = {}
    for name, pids in (("main_cpu_pct", main), ("workers_cpu_pct", workers)):
        values = [100 * c for c in procs.cores(pids, spans)] if pids else []
        out[f"{name}_mean"] = sum(values) / len(values) if values else (0.0 if not pids else None)
        out |= block_interval(pd.DataFrame({name: values}), name)
    return out


def monitor_columns(timeline: pd.DataFrame, trial: str, spans: list) -> dict:
    sub = _in(timeline[timeline["trial_id"] == trial] if "trial_id" in timeline else timeline, spans)
    found = summarize(sub, trial)
    # the monitor's own process is the watch, not a training process: its per-process columns and those built
    # from them (memory, the run's cores) are not the job's; the job's come from its process tree (procs)
    return {k: v for k, v in found.items() if not k.startswith(("main_", "workers_", "rss_", "run_cores"))}


def windows_end(session):
    """Where the loaders' last windows may run to (``records.windows``' ``end``): the watch's end where it cut a
    running loop (its window, a signal) or the job failed (an exception, an exit status not 0: a stall before it
    is the rate the loop got); None where the job ended by itself: its loop had ended, and what ran after its
    last batch (its teardown, the interpreter's exit, the watch's drain) is not the loop's time (a 0.8 s
    Accelerate loop read 362 samples/s against its own clock's 700, its last window run on to the job's exit)."""
    if session.ended_by == "command exited" and session.exit_status == 0 and not session.store.exceptions:
        return None
    return session.t_end


def loader_rows(session, label: str, loader: dict) -> list[dict]:
    """The end_to_end rows of one loader (one per rank) and its step row."""
    store, rows, per_rank = session.store, [], {}
    s = loader.get("settings", {})
    skip, end = warmup_batches(s), windows_end(session)
    for cid in sorted({c for c, lab in store.batches if lab == label}, key=store.rank):
        batches = [b for b in store.batches[(cid, label)] if b.t_ret <= session.t_end]
        proc = store.procs.get(cid, {})
        ident = loader_identity(label, loader, store.rank(cid), int(proc.get("world", 1)), batches)
        wins = windows(batches, session.o.window_s, s.get("num_workers") or 1, skip, s.get("batch_size") or 1, end)
        row = loader_row(ident, wins, len(batches), skip, session.ci_target)
        spans = [seg for w in wins for seg in w.segments]  # each pass's own time: not what ran between
        row |= monitor_columns(session.timeline, "watch", spans) | cpu_columns(
            session.procs, spans, {proc.get("pid")}, store.workers.get((cid, label), set())
        )
        rows.append(row | {"pid": proc.get("pid")})
        per_rank[store.rank(cid)] = wins
    ok = [r for r in rows if r["status"] == "ok" and r["num_workers"] > 0 and r.get("main_cpu_pct_mean") is not None]
    step = step_row(rows[0], per_rank, None, session.ci_target) if rows else None
    if step is not None and ok:  # the training process's CPU per sample, at the step's own rate
        same = [r for r in ok if r.get("rank") == step["rank"]] or ok  # the rank whose step this is
        step["main_cpu_pct_mean"] = same[0]["main_cpu_pct_mean"] / same[0]["samples_per_s"] * step["samples_per_s"]
        step["main_cpu_pct_basis"] = (
            f"derived, not measured alone: rank {same[0].get('rank')}'s measured CPU per "
            "sample in the watched loop, times the step's own rate"
        )
    return rows + ([step] if step else [])


def tune_rows(session, ident: dict) -> list[dict]:
    """One cpu_pipeline row per worker count the pause measured (its last measurement: the search measures a
    count again where the curve's per-worker rate rose, ``watch.tune.search``), and the pause's handoff row."""
    msgs, rows = session.store.tune, []
    last = {int(m["workers"]): m for m in msgs if m.get("k") == "tune_point"}
    points = [m for m in msgs if m.get("k") == "tune_point" and last.get(int(m["workers"])) is m]
    handoffs = [m for m in msgs if m.get("k") == "tune_handoff"][-1:]
    for m in points + handoffs:
        w, stats = int(m["workers"]), m.get("stats") or {}
        handoff = m.get("k") == "tune_handoff"
        tag = f"tune handoff w{w}" if handoff else f"tune w{w}"
        pids = {p for t in msgs if t.get("k") == "tune_workers" and t.get("workers") == w for p in t["pids"]}
        spans = [(stats["t_measure_start_s"], stats["t_measure_end_s"])] if stats else []
        main = {session.store.procs.get(m["cid"], {}).get("pid")}
        keep = {k: ident.get(k) for k in TUNE_KEYS}
        rows.append(
            keep
            | stats
            | {
                "kind": "handoff" if handoff else "cpu_pipeline",
                "trial_id": f"tune {ident['loader']} {'handoff ' if handoff else ''}w{w}",
                "num_workers": w,
                "status": "failed" if m.get("error") else "ok",
                "error": m.get("error"),
                "timed_region": HANDOFF_REGION if handoff else TUNE_REGION,
                "rank": session.store.rank(m["cid"]),
            }
            | monitor_columns(session.timeline, tag, spans)
            | cpu_columns(session.procs, spans, main, pids)
        )
    return rows


def build_rows(session) -> list[dict]:
    rows = []
    for label, loader in session.store.loaders.items():
        found = loader_rows(session, label, loader)
        rows += found
        if session.tuned == label and found:
            rows += tune_rows(session, found[0])
    return rows


def meta(session, status: str, analysis: dict, machine: dict) -> dict:
    o = session.o
    return {
        "schema_version": SCHEMA_VERSION,
        "pipeprof_version": __version__,
        "kind": "watch",
        "status": status,
        "ended_by": session.ended_by,
        "command": o.command,
        "exit_status": session.exit_status,
        "job_wall_s": session.job_wall_s,
        "started": session.started,
        "finished": time.time(),
        "window": {"seconds": o.seconds, "steps": o.steps, "window_s": o.window_s, "watched_s": session.watched_s()},
        "config": {"device": session.device(), "measure": {"window_s": o.window_s, "redraws": o.redraws}},
        "machine": machine,
        "loaders": session.store.loaders,
        "processes": list(session.store.procs.values()),
        "exceptions": session.store.exceptions,
        "tune": session.tune_result,
        "timed_regions": {
            "end_to_end": WATCH_REGION,
            "gpu_ceiling": STEP_REGION,
            "cpu_pipeline": TUNE_REGION,
            "job_wall_s": "the job's command, Popen to exit, on the watch's clock (polled every 0.1 s)",
            "window.watched_s": "the job's first batch to the window's end (--seconds, --steps, "
            "or the job's exit as the watch saw it)",
            "tune.paused_s": "inside the job: the pause's start at a step boundary to the loop's "
            "resumption, on the job's clock",
        },
        "analysis": analysis,
    }


def write(session, status: str, analysis: dict, rows: list[dict], machine: dict) -> Run:
    run = Run(new_run_dir(session.o.out_dir, "watch"))
    run.meta = meta(session, status, analysis, machine)
    run.save_trials(rows)
    run.save_timeline(session.timeline)
    batches = [
        {"rank": session.store.rank(cid), "loader": label, **b._asdict()}
        for (cid, label), bs in session.store.batches.items()
        for b in bs
    ]
    pd.DataFrame(batches).to_parquet(run.path / "batches.parquet", index=False)
    run.save_meta()
    return run
