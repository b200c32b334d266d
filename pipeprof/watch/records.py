"""What the watched processes sent, and the trial-like rows made from it.

:class:`Store` keeps every message by connection (one per watched process): the process (pid, rank),
its loaders (label, site, settings), every batch (``Batch``: the call and return of ``next()`` on
the host clock, samples, the CUDA step after it), worker pids, exceptions and the pause's points.

:func:`windows` cuts one loader's batches in one process into steady-state windows like a trial's: the first
pass's first ``workers × prefetch_factor + 2`` batches are warm-up (the workers made them before anyone
waited: timed, they give rates above the physical limit); a later pass starts at the call for its first batch,
so the re-start of the workers falls inside the window, as it does in the user's training (counted,
``loader_restarts``); a window is at least ``window_s`` and a whole round of the workers, and never spans two
passes (what runs between them, a validation loop, is not this loader's), except where passes are shorter than
half a window: those are joined whole, the time between them left out. :func:`loader_row` makes an
``end_to_end`` row of them (the windows' samples over their time pooled, with the ratio estimator's 95%
interval, the data-wait share per window and its interval) and :func:`step_row` a step-ceiling row (kind
``gpu_ceiling``): the step's own rate in the real loop, batch / step time.
"""

from __future__ import annotations

import statistics
from collections import defaultdict
from typing import NamedTuple, Optional

import numpy as np

from pipeprof.measure.windows import instability, summarize_rates
from pipeprof.stats import pooled_rate_ci95, share_ci95

STEP_REGION = (
    "the user's step in the real loop: from a next() return to the next call of the same loader "
    "(on CUDA the device's time between events recorded on the current stream at those points)"
)
WATCH_REGION = (
    "the user's loop: next() and the step, windows from the returns of next(); warm-up and the "
    "time between passes excluded, worker re-starts of later passes included; the rate is the windows' "
    "samples over their time pooled, its interval the ratio estimator's"
)

# the pause's messages that name worker processes it started: the curve's (per count) and the actions' sides'
WORKER_KINDS = ("tune_workers", "tune_side_workers")


class Batch(NamedTuple):
    pass_no: int
    t_call: float
    t_ret: float
    samples: Optional[int]
    grad: bool
    gpu_s: Optional[float]  # the device's time for the step after this batch (CUDA), else None


class Win(NamedTuple):
    """Consecutive batches of one pass: from ``t_start`` (the previous return, or the pass's first call) to
    the last return; each batch with the host step before it (None for a pass's first batch). A window of
    several short passes (:func:`windows`) leaves out the time between them (``gap_s``)."""

    t_start: float
    items: list  # (Batch, host step seconds before it or None)
    batch_size: int
    gap_s: float = 0.0  # between the passes a window of short passes joins: not this loader's time
    # the window's wall time past its last batch (the loader's last window: to the window's end or the watch's):
    # a loop that stalls after its last batch got that time too (10 batches in 2 s and none in the next 8 s of a
    # 10 s window read 73 samples/s counted first to last batch, for a loop that got about 16/s)
    until: Optional[float] = None

    @property
    def span_s(self) -> float:
        return self.t_end - self.t_start - self.gap_s

    @property
    def segments(self) -> list[tuple[float, float]]:
        """(start, end) of each pass the window holds (one, but for a window of short passes)."""
        out: list[list] = []  # [pass, start, end]
        for b, _ in self.items:
            if out and b.pass_no == out[-1][0]:
                out[-1][2] = b.t_ret
            else:
                out.append([b.pass_no, self.t_start if not out else b.t_call, b.t_ret])
        if out and self.until is not None:
            out[-1][2] = max(out[-1][2], self.until)
        return [(a, z) for _, a, z in out]

    @property
    def t_end(self) -> float:
        last = self.items[-1][0].t_ret
        return last if self.until is None else max(last, self.until)

    @property
    def samples(self) -> int:
        return sum(b.samples or self.batch_size for b, _ in self.items)

    @property
    def wait_s(self) -> float:
        return sum(b.t_ret - b.t_call for b, _ in self.items)

    @property
    def steps(self) -> list[float]:
        return [s for _, s in self.items if s is not None]

    @property
    def gpu(self) -> list[float]:
        return [b.gpu_s for b, _ in self.items if b.gpu_s is not None]

    @property
    def rate(self) -> float:
        return self.samples / self.span_s


class Store:
    """Every message of the watched processes, by connection id."""

    def __init__(self):
        self.procs: dict[int, dict] = {}
        self.loaders: dict[str, dict] = {}
        self.batches: dict[tuple[int, str], list[Batch]] = defaultdict(list)
        self.workers: dict[tuple[int, str], set] = defaultdict(set)
        self.exceptions: list[dict] = []
        self.tune: list[dict] = []  # the pause's messages, in order
        self.closed: set[int] = set()
        self.tune_pids: set[int] = set()

    def add(self, cid: int, msg: dict) -> None:
        kind = msg.get("k")
        if kind == "hello":
            self.procs[cid] = msg
        elif kind == "loader":
            self.loaders.setdefault(msg["label"], msg)
        elif kind == "loader_rebuilt":  # a framework's re-creation of the user's loader: the first, kept beside it
            self.loaders[msg["label"]].setdefault("rebuilt", {k: msg.get(k) for k in ("library_site", "site")})
        elif kind == "b":
            for label, p, t_call, t_ret, n, grad, gpu in msg["d"]:
                self.batches[(cid, label)].append(Batch(p, t_call, t_ret, n, grad, gpu))
        elif kind == "workers":
            self.workers[(cid, msg["label"])].update(msg["pids"])
        elif kind == "exc":
            self.exceptions.append(msg | {"rank": self.procs.get(cid, {}).get("rank")})
        elif kind == "closed":
            self.closed.add(cid)
        elif kind and kind.startswith("tune"):
            self.tune.append(msg | {"cid": cid})
            if kind in WORKER_KINDS:  # the pause's own workers are the job's too, not other processes
                self.tune_pids.update(msg["pids"])

    def rank(self, cid: int) -> int:
        return int(self.procs.get(cid, {}).get("rank", 0))

    def pids(self) -> set[int]:
        """Every process of the job the hook has told us about: training processes and their workers."""
        return (
            {p["pid"] for p in self.procs.values()} | {pid for s in self.workers.values() for pid in s} | self.tune_pids
        )

    def parents(self) -> dict[int, int]:
        """Each worker's training process (worker pid -> its pid): the loaders' workers and the pause's own."""
        out: dict[int, int] = {}
        for (cid, _), pids in self.workers.items():
            out |= dict.fromkeys(pids, self.procs.get(cid, {}).get("pid"))
        for m in self.tune:
            if m.get("k") in WORKER_KINDS:
                out |= dict.fromkeys(m["pids"], self.procs.get(m["cid"], {}).get("pid"))
        return {w: p for w, p in out.items() if p is not None}

    def first_batch_t(self) -> Optional[float]:
        calls = [b[0].t_call for b in self.batches.values() if b]
        return min(calls) if calls else None

    def ranks(self, label: str) -> int:
        """The job's ranks that ran the loader: distinct ranks, not connections (a restarted rank connects again
        under its old rank)."""
        return len({self.rank(cid) for cid, lab in self.batches if lab == label}) or 1

    def main_loader(self) -> Optional[tuple[int, str]]:
        """The training loop's loader (the one with the most batches over the job's processes) in its lowest rank's
        process: under torchrun the ranks run one loop each, and rank 0 is the one tuned, whichever of them has
        taken a few batches more."""
        if not self.batches:
            return None
        total: dict = defaultdict(int)
        for (_, label), batches in self.batches.items():
            total[label] += len(batches)
        label = max(total, key=total.get)
        # a process that has ended (a restarted rank's old connection) cannot be paused: the live ones first
        return min((k for k in self.batches if k[1] == label), key=lambda k: (k[0] in self.closed, self.rank(k[0])))


def warmup_batches(settings: dict) -> int:
    """Batches the workers had made before anyone waited (their prefetch depth), plus a margin of 2."""
    workers = settings.get("num_workers") or 0
    return workers * (settings.get("prefetch_factor") or 2 if workers else 0) + 2


def windows(
    batches: list[Batch], window_s: float, multiple: int, skip: int, batch_size: int, end: Optional[float] = None
) -> list[Win]:
    """The steady-state windows of one loader's batches in one process (see the module docstring). A pass
    shorter than half a window (a small dataset, a fast loop) gives none of its own: consecutive such passes
    are joined, whole, into windows of at least ``window_s`` of their own time, the time between them left
    out. Before, such a loop had a window or none by how long its passes happened to run. ``end``: when the
    watch stopped (its window's end or the job's), seconds on the batches' clock: the last pass's last window
    runs to it, or to that window's own end if sooner (``Win.until``), not to its last batch."""
    out, short = [], None  # short: the short passes joined so far
    by_pass = defaultdict(list)
    for b in batches:
        by_pass[b.pass_no].append(b)
    passes = sorted(by_pass)
    for i, p in enumerate(passes):
        items = by_pass[p]
        if i == 0 and skip:
            if len(items) <= skip:
                continue
            start, prev, items = items[skip - 1].t_ret, items[skip - 1].t_ret, items[skip:]
        else:
            start, prev = items[0].t_call, None
        last = end if i == len(passes) - 1 else None
        wins = _pass_windows(items, start, prev, window_s, max(multiple, 1), batch_size, last)
        if wins:  # short passes joined so far end here, in time order: a window if half of one, else left out
            out += ([short] if short is not None and short.span_s >= window_s / 2 else []) + wins
            short = None
            continue
        whole = Win(start, _with_steps(items, prev), batch_size, until=_until(start, items, window_s, last))
        short = (
            whole
            if short is None
            else Win(short.t_start, short.items + whole.items, batch_size, short.gap_s + start - short.t_end)
        )
        if short.span_s >= window_s:
            out.append(short)
            short = None
    if short is not None and short.span_s >= window_s / 2:
        out.append(short)
    return out


def _with_steps(items: list[Batch], prev: Optional[float]) -> list:
    """Each batch with the host step before it: from the previous return (``prev`` for the first)."""
    out = []
    for b in items:
        out.append((b, None if prev is None else b.t_call - prev))
        prev = b.t_ret
    return out


def _until(start: float, items: list, window_s: float, end: Optional[float]) -> Optional[float]:
    """Where a window that began at ``start`` and holds the watch's last batches ends: at ``end`` (the watch's
    end), or at its own end (``start + window_s``) if sooner; None where it is not the last or ends at a batch."""
    if end is None or not items:
        return None
    stop = min(end, start + window_s)
    return stop if stop > items[-1].t_ret else None


def _pass_windows(
    items: list[Batch],
    start: float,
    prev: Optional[float],
    window_s: float,
    multiple: int,
    batch_size: int,
    end: Optional[float] = None,
) -> list[Win]:
    """One pass's windows; a short tail joins the pass's last window (or is one, at half a window). ``end``: the
    watch's end where this is the last pass (:func:`_until`)."""
    wins, acc = [], []
    for b, step in _with_steps(items, prev):
        acc.append((b, step))
        if b.t_ret - start >= window_s and len(acc) % multiple == 0:
            wins.append(Win(start, acc, batch_size))
            start, acc = b.t_ret, []
    until = _until(start, items, window_s, end)  # the time past the last batch, in the window it falls in
    if acc and wins:
        last = wins.pop()
        wins.append(Win(last.t_start, last.items + acc, batch_size, until=until))
    elif acc and max(acc[-1][0].t_ret, until or 0.0) - start >= window_s / 2:
        wins.append(Win(start, acc, batch_size, until=until))
    elif wins and until is not None:  # the last window ended at a batch; the stall after it is its time too
        wins[-1] = wins[-1]._replace(until=until)
    return wins


# ---- rows ----------------------------------------------------------------------------------------

GROUP = {"model": "user step", "precision": "as run"}  # a watched loop names no model or precision


def _ms(values: list[float], q: float) -> Optional[float]:
    return float(np.percentile(values, q) * 1e3) if values else None


def _mode(batches: list[Batch]) -> str:
    """'train' when most batches were taken with autograd on, else 'inference' (a validation loop)."""
    return "train" if sum(b.grad for b in batches) >= len(batches) / 2 else "inference"


def loader_identity(label: str, loader: dict, rank: int, world: int, batches: list[Batch]) -> dict:
    """The settings columns of a watched loader's rows: what it is and where it was built."""
    s = loader.get("settings", {})
    return GROUP | {
        "mode": _mode(batches) if batches else "train",
        "preset": label,
        "loader": label,
        "batch_size": s.get("batch_size"),
        "num_workers": s.get("num_workers") or 0,
        "pin_memory": s.get("pin_memory"),
        "prefetch_factor": s.get("prefetch_factor"),
        "persistent_workers": s.get("persistent_workers"),
        "dataset": s.get("dataset"),
        "sampler": s.get("sampler"),
        "collate_fn": s.get("collate_fn"),
        "site": loader.get("site"),
        "site_path": loader.get("path"),
        "site_line": loader.get("line"),
        "rank": rank,
        "world_size": world,
    }


def loader_row(ident: dict, wins: list[Win], seen: int, skip: int, ci_target: float) -> dict:
    """An ``end_to_end`` row of one loader in one process (see the module docstring)."""
    row = {
        "kind": "end_to_end",
        "trial_id": f"watch {ident['loader']} rank {ident['rank']}",
        **ident,
        "timed_region": WATCH_REGION,
        "watched_batches": seen,
        "warmup_batches": skip,
    }
    if not wins:
        return row | {
            "status": "failed",
            "samples_per_s": None,
            "error": f"{seen} batches seen, {skip} of them warm-up: no steady-state window (watch longer)",
        }
    spans = [w.span_s for w in wins]
    shares = [w.wait_s / s for w, s in zip(wins, spans)]
    steps = [s for w in wins for s in w.steps]
    gpu = [g for w in wins for g in w.gpu]
    waits = [b.t_ret - b.t_call for w in wins for b, _ in w.items]
    lo, hi = share_ci95(shares)  # a share: within [0, 1]
    busy = sum(gpu) if gpu else sum(steps)
    # the loop's rate is its samples over its time, as its own clock reads it: windows differ in length and a
    # pass's first (its workers' restart, where they are not persistent) is slow, so their median would overstate
    # it and fall outside the mean's interval (docs/measured.md, "watch --tune on scripts outside the tests")
    rate, rate_lo, rate_hi = pooled_rate_ci95([w.samples for w in wins], spans)
    half = (rate_hi - rate_lo) / 2 / rate if rate_lo is not None else None
    reason = instability([w.rate for w in wins], 3, ci_target, half)  # judged on the interval reported
    return (
        row
        | summarize_rates([w.rate for w in wins])
        | {
            "samples_per_s": rate,
            "samples_per_s_ci95_low": rate_lo,
            "samples_per_s_ci95_high": rate_hi,
            "status": "ok",
            "error": None,
            "window_rates": [w.rate for w in wins],
            "windows": len(wins),
            "batches_measured": sum(len(w.items) for w in wins),
            "samples_measured": sum(w.samples for w in wins),
            "measured_s": sum(spans),
            "t_measure_start_s": wins[0].t_start,
            "t_measure_end_s": wins[-1].t_end,
            "data_wait_frac": sum(w.wait_s for w in wins) / sum(spans),
            "window_data_wait": shares,
            "data_wait_frac_ci95_low": lo,
            "data_wait_frac_ci95_high": hi,
            "data_wait_ms_p50": _ms(waits, 50),
            "data_wait_ms_p95": _ms(waits, 95),
            "compute_ms_p50": _ms(gpu or steps, 50),
            "compute_ms_p95": _ms(gpu or steps, 95),
            "host_step_ms_p50": _ms(steps, 50),
            "device_busy_frac": busy / sum(spans) if busy else None,
            "loader_restarts": len({b.pass_no for w in wins for b, _ in w.items}) - 1,
            "unstable": reason is not None,
            "unstable_reason": reason,
        }
    )


def step_rates(wins: list[Win]) -> list[float]:
    """Per window, the step's own rate: samples over the step time (CUDA events where there are any)."""
    out = []
    for w in wins:
        if w.gpu:
            per = [(b.samples or w.batch_size, b.gpu_s) for b, _ in w.items if b.gpu_s is not None]
        else:
            per = [(b.samples or w.batch_size, s) for b, s in w.items if s is not None]
        total = sum(s for _, s in per)
        if per and total > 0:
            out.append(sum(n for n, _ in per) / total)
    return out


def step_row(
    ident: dict, per_rank: dict[int, list[Win]], main_cpu_pct: Optional[float], ci_target: float = 0.05
) -> Optional[dict]:
    """The step ceiling of one loader's loop as watched (kind ``gpu_ceiling``): the fastest rank's, since in
    DDP the other ranks' steps include waiting in the all-reduce for it. None without two windows' steps."""
    rates = {r: step_rates(w) for r, w in per_rank.items()}
    rates = {r: v for r, v in rates.items() if v}
    if not rates:
        return None
    rank = max(rates, key=lambda r: statistics.median(rates[r]))
    reason = instability(rates[rank], 3, ci_target)  # judged like every other row's windows
    keep = {k: ident[k] for k in ("model", "precision", "mode", "preset", "loader", "batch_size", "site", "world_size")}
    return (
        keep
        | summarize_rates(rates[rank])
        | {
            "kind": "gpu_ceiling",
            "trial_id": f"watch step after {ident['loader']}",
            "status": "ok",
            "error": None,
            "num_workers": 0,
            "rank": rank,
            "window_rates": rates[rank],
            "windows": len(rates[rank]),
            "timed_region": STEP_REGION,
            "main_cpu_pct_mean": main_cpu_pct,
            "unstable": reason is not None,
            "unstable_reason": reason,
        }
    )
