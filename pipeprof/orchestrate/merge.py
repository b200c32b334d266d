"""``pipeprof merge``: the run folders of a multi-machine job's nodes joined into one.

Each node of a job (``distributed.nnodes > 1``) runs the same trials and records the ranks it ran
(``ranks.parquet``); its N-GPU rows count only those ranks (``ranks_reported`` < ``gpus``). The
merged folder holds every node's ranks and each N-GPU row rebuilt from all of them by the same
function that built it (``trials.columns.combine_ranks``); one-GPU rows and the monitor timeline
are node 0's (the first folder given). The analysis is run again on the merged rows.
"""

from __future__ import annotations

import pandas as pd

from pipeprof.analysis import analyse
from pipeprof.results import Run, check_out_dir, load_run, new_run_dir
from pipeprof.trials.columns import combine_ranks

from .runner import judge

#: config fields that differ between the nodes of one job by design
NODE_FIELDS = {("distributed", "node_rank"), ("out_dir",)}


def differences(a: dict, b: dict, path: tuple = ()) -> list[str]:
    """Config fields whose values differ (dotted names), ignoring :data:`NODE_FIELDS`."""
    if path in NODE_FIELDS:
        return []
    if isinstance(a, dict) and isinstance(b, dict):
        return [d for k in sorted(set(a) | set(b)) for d in differences(a.get(k), b.get(k), (*path, k))]
    return [] if a == b else [f"{'.'.join(path)}: {a!r} vs {b!r}"]


def merge_runs(paths: list[str], out_dir: str) -> Run:
    """A new run folder in ``out_dir`` joining the nodes' folders; ValueError when their configs differ."""
    check_out_dir(out_dir)  # every writer of a run folder checks its folder first, as `run` and `watch` do
    runs = [load_run(p) for p in paths]
    first = runs[0]
    for other in runs[1:]:
        diff = differences(first.meta["config"], other.meta["config"])
        if diff:
            raise ValueError(f"{other.path} is not a node of the same job as {first.path}: " + "; ".join(diff))
    ranks = pd.concat([r.ranks for r in runs if not r.ranks.empty], ignore_index=True)
    if not ranks.empty:
        ranks = ranks.drop_duplicates(["trial_id", "rank"])
    merged = Run(new_run_dir(out_dir, f"{first.meta['config']['name']}-merged"))
    merged.meta = first.meta | {
        "merged_from": [str(r.path) for r in runs],
        "nodes": [r.meta.get("machine", {}).get("hostname") for r in runs],
        "status": _status([r.meta.get("status") for r in runs]),
    }
    merged.save_trials(_rebuild(first.trials, ranks))
    merged.save_timeline(first.timeline)
    cfg = first.meta["config"]
    merged.meta["analysis"] = analyse(
        merged.trials,
        cores=sum(r.meta["machine"]["cores"]["usable"] for r in runs),
        device=cfg["device"],
        storage=first.meta.get("storage"),
    )
    judge(merged)  # the nodes' rows together may still hold no answer: said as for one run
    merged.save_meta()
    return merged


def _rebuild(trials: pd.DataFrame, ranks: pd.DataFrame) -> list[dict]:
    """Every row as node 0 recorded it, the N-GPU ones recombined from all nodes' ranks."""
    rows = []
    for row in trials.astype(object).where(trials.notna(), None).to_dict("records"):
        mine = ranks[ranks["trial_id"] == row["trial_id"]] if not ranks.empty else ranks
        if (row.get("gpus") or 1) > 1 and len(mine):
            recs = mine.astype(object).where(mine.notna(), None).to_dict("records")
            row = row | combine_ranks(recs, int(row["gpus"])) | {"ranks": recs}
        rows.append(row)
    return rows


def _status(statuses: list) -> str:
    """The merged run is complete only when every node's run is."""
    return "complete" if all(s == "complete" for s in statuses) else next(s for s in statuses if s != "complete")
