"""Which trials failed, and whether the run still has an answer: pure, over the rows.

The answer (the worker count, the verdict) rests on the end-to-end trials; a run without any planned
(``trials`` naming isolated kinds only) answers with each kind it measured. When every trial of a kind
the answer needs failed, there is no answer: :func:`failures` says so with the cause they share (the
first line of their errors, numbers aside, the most common first), which becomes the answer's first line
and run.json's status ``failed: <cause>``. When only some failed, it says which, and what the answer
rests on. The failed rows stay in trials.parquet with their errors.
"""

from __future__ import annotations

import re
from collections import Counter
from typing import Optional

import pandas as pd

from pipeprof.schema import TrialKind

CAUSE_CHARS = 300  # a cause is a line of a status and a sentence: the head of the error, not its stack


# where a DataLoader worker met the error (sweep.error_text appends it): not part of the cause
WORKER_SUFFIX = re.compile(r"\s*\(caught \w+ in dataloader worker process \d+\)$", re.IGNORECASE)


def cause_of(error) -> str:
    """The first line of a trial's error (sweep.error_text leads with the cause), without where a worker met
    it, shortened."""
    text = str(error).strip() if isinstance(error, str) and error.strip() else "no error recorded"
    line = WORKER_SUFFIX.sub("", text.splitlines()[0])
    return line if len(line) <= CAUSE_CHARS else line[: CAUSE_CHARS - 1] + "…"


def _causes(rows: pd.DataFrame) -> list[tuple[str, int]]:
    """(cause, trials) of the failed ``rows``, the most common first; causes that differ only in their numbers
    (sizes, indices, worker ids) count as one, named by its first instance."""
    first: dict[str, str] = {}
    counts: Counter = Counter()
    for status, error in zip(rows["status"], rows.get("error", pd.Series([None] * len(rows), index=rows.index))):
        cause = cause_of(error) if status in ("error", "failed") else f"{status}: {cause_of(error)}"
        key = re.sub(r"\d+", "#", cause)
        first.setdefault(key, cause)
        counts[key] += 1
    return [(first[k], n) for k, n in counts.most_common()]


def _where(rows: pd.DataFrame) -> str:
    """The worker counts (or batch sizes, for a step trial) of ``rows``, for a sentence."""
    if "num_workers" in rows and rows["num_workers"].notna().any():
        counts = sorted({int(w) for w in rows["num_workers"].dropna()})
        return f"at {', '.join(map(str, counts))} worker{'' if counts == [1] else 's'}"
    sizes = sorted({int(b) for b in rows["batch_size"].dropna()}) if "batch_size" in rows else []
    return f"at batch {', '.join(map(str, sizes))}" if sizes else ""


def needed_kinds(trials: pd.DataFrame) -> list[str]:
    """The kinds the answer rests on: end_to_end when it was planned, else every kind the run has."""
    kinds = list(dict.fromkeys(trials["kind"])) if "kind" in trials else []
    return [TrialKind.END_TO_END.value] if TrialKind.END_TO_END.value in kinds else kinds


def failures(trials: pd.DataFrame) -> dict:
    """``no_answer``: why there is none (None: there is one); ``cause``: the cause for the run's status;
    ``failed``: per kind with failures, how many of how many and their causes; ``rests_on``: a sentence when
    some trials failed and an answer stands on the others (None otherwise)."""
    if trials.empty or "status" not in trials:
        return {
            "no_answer": "no trial ran" if trials.empty else None,
            "cause": "no trial ran" if trials.empty else None,
            "failed": [],
            "rests_on": None,
        }
    failed = []
    for kind, rows in trials.groupby("kind", sort=False):
        bad = rows[rows["status"] != "ok"]
        if len(bad):
            failed.append(
                {
                    "kind": kind,
                    "failed": int(len(bad)),
                    "of": int(len(rows)),
                    "where": _where(bad),
                    "causes": [{"cause": c, "trials": n} for c, n in _causes(bad)],
                }
            )
    dead = [f for f in failed if f["kind"] in needed_kinds(trials) and f["failed"] == f["of"]]
    if dead:
        f = dead[0]
        cause = f["causes"][0]["cause"]
        others = sum(c["trials"] for c in f["causes"][1:])
        share = "all" if not others else str(f["failed"] - others)
        text = (
            f"no answer: every {f['kind']} trial failed ({f['failed']} of {f['of']}), {share} with {cause}"
            + (f"; {others} with other causes" if others else "")
            + "; the failed rows and their errors "
            "are in the run folder's trials.parquet"
        )
        return {"no_answer": text, "cause": cause, "failed": failed, "rests_on": None}
    return {"no_answer": None, "cause": None, "failed": failed, "rests_on": _rests_on(trials, failed)}


def _rests_on(trials: pd.DataFrame, failed: list) -> Optional[str]:
    """Which trials failed and what the answer rests on instead, one sentence; None when none failed."""
    if not failed:
        return None
    which = "; ".join(
        f"{f['failed']} of {f['of']} {f['kind']} {f['where']} ({f['causes'][0]['cause']}"
        f"{'' if len(f['causes']) == 1 else ', and other causes'})"
        for f in failed
    )
    ok = trials[(trials["status"] == "ok") & trials["kind"].isin(needed_kinds(trials))]
    kinds = ", ".join(dict.fromkeys(ok["kind"]))
    return f"trials failed: {which}; the answer rests on the {len(ok)} {kinds} trials that ran ({_where(ok)})"
