"""The watch's per-process CPU table (``watch.procs.ProcTable``) on real processes of known CPU: a worker that
ends between two reads still has its CPU, from its training process's reaped children's time."""

import os
import subprocess
import sys
import time

import pytest

from pipeprof.watch.procs import ProcTable

TICKS = 2 * 0.01
BURN = "import time\nt = time.process_time()\nwhile time.process_time() - t < {s}:\n    pass\n"


def _child(seconds: float) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-S", "-c", BURN.format(s=seconds)])


def _used(table: ProcTable, pid: int, t0: float, t1: float) -> float:
    """CPU seconds the table gives ``pid`` between ``t0`` and ``t1``: each sample's cores over its own interval."""
    out, last = 0.0, t0
    for s in sorted((s for s in table.samples if s.pid == pid), key=lambda s: s.t_s):
        out += s.cores * (s.t_s - last)
        last = s.t_s
    return out


@pytest.mark.one_core
def test_a_worker_that_ends_between_two_reads_keeps_its_cpu():
    me, table = os.getpid(), ProcTable()
    t0 = time.perf_counter()
    table.tick([me], t0)  # the training process (this one): its reaped children's time so far
    never_read = _child(0.3)
    never_read.wait()  # it starts, burns 0.3 s of CPU and is reaped before any tick reads it
    t1 = time.perf_counter()
    table.tick([me, never_read.pid], t1, {never_read.pid: me})
    # the burn (less two clock ticks: user and system time are each counted in 10 ms), plus an interpreter's start
    assert 0.3 - TICKS <= _used(table, never_read.pid, t0, t1) < 1.3
    # one read alive, then ended: the part after its read is the reaped time less what the read saw
    read_once = _child(0.6)
    time.sleep(0.2)
    t2 = time.perf_counter()
    both = {read_once.pid: me, never_read.pid: me}  # the ended worker named again, as the watch names all each tick
    table.tick([me, read_once.pid, never_read.pid], t2, both)
    read_once.wait()
    t3 = time.perf_counter()
    table.tick([me, read_once.pid, never_read.pid], t3, both)
    assert 0.6 - TICKS <= _used(table, read_once.pid, t1, t3) < 1.6
    assert _used(table, never_read.pid, t1, t3) == 0.0  # an ended worker is given its CPU once
