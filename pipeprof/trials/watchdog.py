"""Every trial bounded in time, whatever hangs: the trial runs in a thread of its own while the sweep's
thread waits for it, at most the trial's time cap.

With workers a DataLoader bounds each batch itself (its ``timeout``). At 0 workers the loading runs in
the training process, where nothing can interrupt a ``__getitem__`` that blocks, and Python cannot kill
a thread. So the trial runs in a daemon thread; when the cap passes, the waiting thread takes the stuck
thread's stack (``sys._current_frames``), cuts it off from the run (:class:`Leash`) and the sweep goes on.
The stuck thread stays blocked and its loader is abandoned: should it ever wake up, its next clock read
or phase change raises :class:`Abandoned`, and its own ``finally`` closes the loader (a user loader's
workers, if it has any, are daemonic processes: they end with the run at the latest). A CUDA step that
never returns keeps its stream busy; later trials share the device with it, which their rows cannot
show, but the run ends and says which trial hung.

A signal (Ctrl-C, SIGTERM) lands in the waiting thread: the trial is cut off the same way, and given
:data:`GRACE_S` to close its loader, so the window in progress is abandoned and its workers stop.

What no thread contains is code that ends the process (``os._exit``, a crash in C). A child process per
0-worker trial would contain it, but the step would have to run there too (a forked child cannot use the
parent's CUDA context), and the measurement would change: such a run stops with status ``running``, and
``pipeprof report`` says it did not finish and how many trials were done.
"""

from __future__ import annotations

import sys
import threading
import traceback
from typing import Callable, TypeVar

T = TypeVar("T")
GRACE_S = 10.0  # after a signal: how long the trial's thread may take to end its batch and close its loader
STACK_FRAMES = 8  # the innermost frames of a stuck thread put in the row (the hung code is at the bottom)


class Abandoned(Exception):
    """Raised in a trial's thread that was cut off, at its next clock read or phase change."""


class TrialTimeout(Exception):
    """A trial that ran past its time cap; the message carries the stuck thread's stack."""


class Leash:
    """The monitor and clock as a trial's thread sees them, until :meth:`cut`: from then on the thread's
    clock reads and phase changes raise :class:`Abandoned` and its other monitor calls are dropped, so a
    thread that wakes up late neither measures on beside the next trial nor tags, pauses or follows
    anything of it. One lock orders the thread's calls and the cut."""

    def __init__(self, monitor, clock: Callable[[], float]):
        self._monitor, self._clock = monitor, clock
        self._lock, self._cut = threading.Lock(), False

    def _call(self, fn, *args, strict: bool):
        with self._lock:
            if not self._cut:
                return fn(*args)
        if strict:
            raise Abandoned("this trial was abandoned (it ran past its time cap, or the run was interrupted)")
        return None

    def clock(self) -> float:
        return self._call(self._clock, strict=True)

    def set_trial(self, trial_id, phase=None) -> None:
        self._call(self._monitor.set_trial, trial_id, phase, strict=True)

    def track_workers(self, pids) -> None:
        self._call(self._monitor.track_workers, pids, strict=False)  # called from finally blocks: never raises

    def pause(self, paused: bool) -> None:
        self._call(self._monitor.pause, paused, strict=False)

    def timeline(self, since=None):
        """The monitor's rows (a paired trial reads each side's CPU inside its own windows)."""
        return self._call(self._monitor.timeline, since, strict=True)

    def cut(self) -> None:
        """Cut the thread off, then leave the monitor as no trial holds it: sampling, untagged, no workers."""
        with self._lock:
            self._cut = True
        self._monitor.pause(False)
        self._monitor.set_trial(None)
        self._monitor.track_workers([])


def stack_of(thread: threading.Thread) -> str:
    """The innermost frames of ``thread``'s stack, outermost first, as a traceback prints them."""
    frame = sys._current_frames().get(thread.ident)
    return "".join(traceback.format_stack(frame, limit=STACK_FRAMES)) if frame is not None else "(no stack)"


def run_bounded(body: Callable[[], T], leash: Leash, limit_s: float, name: str) -> T:
    """``body()`` in a daemon thread named ``name``, waited for at most ``limit_s`` seconds: its result,
    or its exception raised here. Past the limit, :class:`TrialTimeout` with the stuck thread's stack."""
    box: dict = {}
    # waited on through an Event, not Thread.join: a join that a signal interrupts marks the thread
    # stopped while it still runs (CPython 3.11, bpo-45274's handler)
    done = threading.Event()

    def target() -> None:
        try:
            box["result"] = body()
        except BaseException as exc:  # handed to the waiting thread, which raises it there
            box["error"] = exc
        finally:
            done.set()

    thread = threading.Thread(target=target, name=name, daemon=True)
    thread.start()
    try:
        done.wait(limit_s)
    except BaseException:  # a signal while waiting: abandon the window in progress and let the loader close
        leash.cut()
        done.wait(GRACE_S)
        raise
    if not done.is_set():
        stack = stack_of(thread)
        leash.cut()
        raise TrialTimeout(
            f"the trial ran past its time cap ({limit_s:g} s) and was abandoned; its thread "
            f"stays blocked in (innermost last):\n{stack}"
        )
    if "error" in box:
        raise box["error"]
    return box["result"]
