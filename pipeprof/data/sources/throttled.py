"""Emulated slower storage: any source, capped in bandwidth and read rate, plus latency.

"Would this pipeline keep up on network storage at 200 MB/s?" can be answered
on a laptop by imposing that speed on a fast source. The caps model one shared
device, so they hold for all DataLoader workers *together*: the limiter's state
lives in shared memory created here and inherited by the workers, not in each
worker's copy of the object (which would give N workers N times the bandwidth).

The limiter is a token bucket in reservation form (GCRA): a shared "device busy
until" time per cap. A read reserves its transfer time ``bytes / bandwidth``
after the previous reservations, so the caps hold exactly over any interval;
there is no burst allowance, because a disk does not deliver faster than its
bandwidth after an idle spell. Waiting is ``time.sleep``: an emulated device
must not burn the CPU time the pipeline under test needs.
"""

from __future__ import annotations

import math
import multiprocessing
import time

from .base import Source

_BW, _OPS = 0, 1  # slots of the shared state: the time each cap's "device" is busy until


def _check_limit(name: str, value, allow_zero: bool = False):
    """ValueError naming the argument unless ``value`` is None or a finite number > 0 (>= 0)."""
    if value is None:
        return None
    ok = isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)
    if not ok or value < 0 or (value == 0 and not allow_zero):
        bound = ">= 0" if allow_zero else "> 0"
        raise ValueError(f"{name} must be a finite number {bound}, got {name}={value!r}")
    return float(value)


class ThrottledSource(Source):
    kind = "throttled"
    emulated = True

    def __init__(self, inner: Source, mb_s: float | None = None, latency_ms: float = 0.0, reads_s: float | None = None):
        if not isinstance(inner, Source):
            raise TypeError(f"inner must be a Source, got {type(inner).__name__}")
        self.inner = inner
        self.mb_s = _check_limit("mb_s", mb_s)
        self.latency_ms = _check_limit("latency_ms", latency_ms, allow_zero=True)
        self.reads_s = _check_limit("reads_s", reads_s)
        # Shared memory + lock, inherited by forked workers (and passed to spawned ones):
        # every process reserves against the same clock. time.monotonic is system-wide.
        self._busy_until = multiprocessing.Array("d", [0.0, 0.0], lock=True)

    def _reserve(self, nbytes: int, now: float) -> float:
        """Reserve this read's share of each cap; return the time it may complete."""
        ready = now + self.latency_ms / 1e3  # latency overlaps between concurrent reads
        done = ready
        with self._busy_until.get_lock():
            state = self._busy_until.get_obj()
            if self.mb_s is not None:
                state[_BW] = max(state[_BW], ready) + nbytes / (self.mb_s * 1e6)
                done = max(done, state[_BW])
            if self.reads_s is not None:
                state[_OPS] = max(state[_OPS], ready) + 1.0 / self.reads_s
                done = max(done, state[_OPS])
        return done

    def read(self, index: int) -> bytes:
        done = self._reserve(self.inner.nbytes(index), time.monotonic())
        # The inner read runs inside the reserved time: the emulated device is as
        # slow as the cap or the real storage, whichever is slower, not their sum.
        data = self.inner.read(index)
        wait = done - time.monotonic()
        if wait > 0:
            time.sleep(wait)
        return data

    def __len__(self) -> int:
        return len(self.inner)

    def label(self, index: int) -> int:
        return self.inner.label(index)

    def where(self, index: int) -> str:
        return self.inner.where(index)

    def nbytes(self, index: int) -> int:
        return self.inner.nbytes(index)

    def total_bytes(self) -> int:
        return self.inner.total_bytes()

    def files(self) -> list[str] | None:
        return self.inner.files()

    # the access pattern is the inner source's: a throttled shard set is still read shard by shard
    @property
    def sequential(self) -> bool:
        return bool(getattr(self.inner, "sequential", False))

    def shard_order(self, seed: int, epoch: int) -> list[int]:
        return self.inner.shard_order(seed, epoch)

    def shard_of(self, index: int) -> int:
        return self.inner.shard_of(index)

    def describe(self) -> dict:
        return {
            **super().describe(),
            "emulated": True,
            "mb_s": self.mb_s,
            "latency_ms": self.latency_ms,
            "reads_s": self.reads_s,
            "inner": self.inner.describe(),
        }
