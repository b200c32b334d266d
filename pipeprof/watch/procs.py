"""CPU of each process of the watched job, by pid, for the rows' per-rank and per-loader figures.

The monitor (``measure.monitors.Monitor``) samples the machine and sums the job's processes; a row of
``pipeprof watch`` needs one training process (its rank) and one loader's workers. The hook names
those pids (``hello``, ``workers``); this table reads their CPU time (``psutil``'s ``cpu_times``, no
process-list scan) at each tick of the parent's loop and keeps, per interval, the cores each used.
"""

from __future__ import annotations

from typing import Iterable, NamedTuple, Optional

import psutil


class Sample(NamedTuple):
    t_s: float  # end of the interval (perf_counter, the hook's clock)
    pid: int
    cores: float  # CPU cores busy over the interval (1.0: one core)


class ProcTable:
    """Per-pid CPU cores over the parent's ticks.

    A worker read at two ticks gives the cores it used between them. A loader without persistent workers starts
    new ones each pass, and a short pass's workers end between two ticks (half a second apart): what they used
    after their last read is in their training process's reaped children's time (``children_user`` +
    ``children_system``; the DataLoader joins its workers), so each tick reads that too for the processes that
    are not workers, and gives the part no read of the workers saw to the workers of that process that ended
    since the last tick."""

    def __init__(self):
        self.samples: list[Sample] = []
        self._last: dict[int, tuple[float, float, psutil.Process]] = {}  # pid -> (t, cpu s, process)
        self._reaped: dict[int, tuple[float, float]] = {}  # training pid -> (t, its reaped children's cpu s)
        self._ended: set[int] = set()
        self._t: Optional[float] = None  # the previous tick

    def tick(self, pids: Iterable[int], now: float, parents: Optional[dict[int, int]] = None) -> None:
        """Read the ``pids``' CPU at ``now``; ``parents``: worker pid -> the training process that started it
        (the others in ``pids`` are training processes)."""
        parents = parents or {}
        ended: dict[int, list[tuple[int, float]]] = {}  # training pid -> [(worker, cpu s its reads saw)]
        trainers = []  # (pid, its cpu_times): their reaped time is read once every worker's end is known
        for pid in pids:
            if pid in self._ended:
                continue
            entry = self._last.get(pid)
            try:
                proc = entry[2] if entry else psutil.Process(pid)
                times = proc.cpu_times()
            except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess):
                self._last.pop(pid, None)
                self._ended.add(pid)
                if pid in parents:
                    ended.setdefault(parents[pid], []).append((pid, entry[1] if entry else 0.0))
                continue
            cpu = times.user + times.system
            if entry and now > entry[0]:
                self.samples.append(Sample(now, pid, (cpu - entry[1]) / (now - entry[0])))
            elif entry is None and pid in parents and self._t is not None and now > self._t:
                # a worker first read: started since the last tick (the hook names a pass's workers as it starts)
                self.samples.append(Sample(now, pid, cpu / (now - self._t)))
            self._last[pid] = (now, cpu, proc)
            if pid not in parents:
                trainers.append((pid, times))
        for pid, times in trainers:
            self._read_reaped(pid, times, now, ended.get(pid, []))
        self._t = now

    def _read_reaped(self, pid: int, times, now: float, ended: list[tuple[int, float]]) -> None:
        """The CPU that ``pid``'s workers which ended since the last tick used after their last read."""
        reaped = times.children_user + times.children_system
        before = self._reaped.get(pid)
        self._reaped[pid] = (now, reaped)
        if before is None or not ended or now <= before[0]:
            return
        unseen = max(0.0, reaped - before[1] - sum(cpu for _, cpu in ended))
        for worker, _ in ended:  # split evenly: which of them used it is not known
            self.samples.append(Sample(now, worker, unseen / len(ended) / (now - before[0])))

    def cores(self, pids: set[int], spans: list[tuple[float, float]]) -> list[float]:
        """Per tick inside ``spans``, the cores the ``pids`` used together (ticks where none was sampled
        are left out)."""
        by_t: dict[float, float] = {}
        for s in self.samples:
            if s.pid in pids and any(a <= s.t_s <= b for a, b in spans):
                by_t[s.t_s] = by_t.get(s.t_s, 0.0) + s.cores
        return [by_t[t] for t in sorted(by_t)]

    def mean_pct(self, pids: set[int], spans: list[tuple[float, float]]) -> Optional[float]:
        values = self.cores(pids, spans)
        return 100 * sum(values) / len(values) if values else None
