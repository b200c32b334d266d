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
    """Per-pid CPU cores over the parent's ticks."""

    def __init__(self):
        self.samples: list[Sample] = []
        self._last: dict[int, tuple[float, float, psutil.Process]] = {}  # pid -> (t, cpu s, process)

    def tick(self, pids: Iterable[int], now: float) -> None:
        for pid in pids:
            entry = self._last.get(pid)
            try:
                proc = entry[2] if entry else psutil.Process(pid)
                cpu = sum(proc.cpu_times()[:2])
            except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess):
                self._last.pop(pid, None)
                continue
            if entry and now > entry[0]:
                self.samples.append(Sample(now, pid, (cpu - entry[1]) / (now - entry[0])))
            self._last[pid] = (now, cpu, proc)

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
