"""Page-cache state of a dataset's files: set it (evict, warm), check it, and see it in I/O.

"Is training I/O-bound?" has two answers for file datasets: one with the files
in the kernel's page cache (a second epoch on a machine with enough RAM) and one
with them on the device (first epoch, or a dataset larger than RAM). A profile
that does not control and record which one it measured is not reproducible.

* :func:`evict` / :func:`warm` set the state per file, without root.
* :func:`resident_fraction` checks it (``mincore``), :class:`IoProbe` shows what
  the kernel actually fetched from the block device during a measurement.
* :func:`fits_in_page_cache` says which state a real run would be in.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import mmap
import os
import stat
import time
from pathlib import Path
from typing import Iterable

import numpy as np
import psutil

from pipeprof import env
from pipeprof.data.sources.base import file_kind

_CHUNK = 1 << 30  # mincore window: bounds the residency vector to 256 KiB per GiB mapped


def _files(paths) -> list[str]:
    """Expand ``paths`` (one path or many; folders recursively) to a list of regular files."""
    if isinstance(paths, (str, os.PathLike)):
        paths = [paths]
    out = []
    for p in paths:
        if os.path.isdir(p):
            out += sorted(str(f) for f in Path(p).rglob("*") if f.is_file())
        else:
            out.append(str(p))
    return out


def _open(path: str) -> int | None:
    """A read-only descriptor of the regular file ``path``, or None when it cannot be opened (a dangling
    link, no permission) or is not a regular file (a FIFO, whose blocking open would wait for a writer
    forever; a device; a chain of links, which the sources do not follow): the trial reading it counts it
    as a bad sample; its cache state does not matter."""
    if file_kind(path) is not None:
        return None
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK)
    except OSError:
        return None
    if not stat.S_ISREG(os.fstat(fd).st_mode):
        os.close(fd)
        return None
    return fd


# ---------------------------------------------------------------------------
# Setting the state


def evict(paths, flush: bool = False) -> dict:
    """Ask the kernel to drop the files' pages from the page cache (``POSIX_FADV_DONTNEED``).

    Needs no root and touches only these files. Dirty pages are not dropped, so a
    file written moments ago needs ``flush=True`` (fdatasync first); files that are
    only read never need it.
    """
    files, total = _files(paths), 0
    for path in files:
        if (fd := _open(path)) is None:
            continue
        try:
            if flush:
                os.fdatasync(fd)
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
            total += os.fstat(fd).st_size
        finally:
            os.close(fd)
    return {"files": len(files), "bytes": total, "method": "fadvise"}


def drop_all_caches() -> None:
    """Drop the whole machine's clean page cache (root only). Affects every process: only on request."""
    os.sync()  # dirty pages cannot be dropped; write them out first
    try:
        with open("/proc/sys/vm/drop_caches", "w") as f:
            f.write("1\n")
    except OSError as exc:  # EACCES without root, EROFS in most containers
        raise PermissionError(
            f"cannot drop the page cache ({exc.strerror or exc}): writing /proc/sys/vm/drop_caches "
            "needs root outside a container; evict() drops just the dataset's files without it"
        ) from exc


def can_drop_all_caches(path: str = "/proc/sys/vm/drop_caches") -> tuple[bool, str]:
    """Whether :func:`drop_all_caches` can work here, checked without dropping anything: (ok, why not)."""
    if not os.path.exists(path):
        return False, f"{path} does not exist (not Linux?)"
    if not os.access(path, os.W_OK):
        return False, f"no write access to {path} (needs root)"
    if os.statvfs(os.path.dirname(path)).f_flag & os.ST_RDONLY:
        return False, f"{path} is on a read-only mount (as in most containers)"
    return True, "ok"


def warm(paths) -> dict:
    """Read every byte of the files once so they are in the page cache (if they fit)."""
    files, total, t0 = _files(paths), 0, time.perf_counter()
    buf = bytearray(1 << 20)  # one reusable buffer: warming should not allocate per read
    for path in files:
        if (fd := _open(path)) is None:
            continue
        with open(fd, "rb", buffering=0) as f:
            while n := f.readinto(buf):
                total += n
    return {"files": len(files), "bytes": total, "seconds": time.perf_counter() - t0}


# ---------------------------------------------------------------------------
# Checking the state


def _libc():
    """libc with mmap/mincore/munmap typed for ctypes, or None (not Linux/BSD-like)."""
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or None, use_errno=True)
        libc.mincore  # noqa: B018 - AttributeError where the platform has none
    except (OSError, AttributeError):
        return None
    libc.mmap.restype = ctypes.c_void_p
    libc.mmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_int, ctypes.c_int, ctypes.c_long]
    libc.munmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t]
    libc.mincore.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.POINTER(ctypes.c_ubyte)]
    return libc


def _resident_pages(libc, fd: int, size: int) -> int | None:
    """Pages of one open file in the page cache, or None if it cannot be mapped/queried."""
    page, resident = mmap.PAGESIZE, 0
    for offset in range(0, size, _CHUNK):  # _CHUNK is a multiple of the page size
        length = min(_CHUNK, size - offset)
        # Our own mmap (not Python's): mapping without touching pages faults nothing in
        addr = libc.mmap(None, length, mmap.PROT_READ, mmap.MAP_SHARED, fd, offset)
        if addr is None or addr == ctypes.c_void_p(-1).value:
            return None
        try:
            vec = (ctypes.c_ubyte * ((length + page - 1) // page))()
            if libc.mincore(addr, length, vec) != 0:
                return None
            resident += int(np.count_nonzero(np.frombuffer(vec, np.uint8) & 1))
        finally:
            libc.munmap(addr, length)
    return resident


def resident_fraction(paths) -> float | None:
    """Fraction of the files' pages now in the page cache (``mincore``).

    None where that cannot be told: no ``mincore`` (not Linux), a file that
    cannot be mapped (some FUSE/network filesystems), or no bytes at all.
    """
    libc = _libc()
    if libc is None:
        return None
    page, total, resident = mmap.PAGESIZE, 0, 0
    for path in _files(paths):
        if (fd := _open(path)) is None:
            continue
        try:
            size = os.fstat(fd).st_size
            if size == 0:
                continue
            pages = _resident_pages(libc, fd, size)
        finally:
            os.close(fd)
        if pages is None:
            return None
        total += (size + page - 1) // page
        resident += pages
    return resident / total if total else None


# ---------------------------------------------------------------------------
# Seeing it in the I/O counters


class IoProbe:
    """Bytes read from the block device vs. bytes read at all, for a set of processes.

    ``read_bytes`` (``/proc/PID/io``) counts what the kernel fetched from the
    device for the process; ``read_chars`` counts every byte ``read()`` returned,
    page-cache hits included. Their ratio over a measurement is the fraction of
    the data that really came from the disk.

    Stop the probe **before** shutting the DataLoader workers down: a process's
    counters vanish with it, and an exited worker's reads are lost (listed in
    ``lost``). Caveats: ``read_chars`` also counts pipes and
    sockets (a network source makes the ratio meaningless), and readahead or
    ``mmap`` reads can push the ratio above 1 (clamped; the raw deltas stay in
    ``read_bytes`` / ``read_chars``).
    """

    def __init__(self, pids: Iterable[int] | None = None):
        self.pids = list(pids) if pids is not None else [os.getpid()]
        self._start: dict[int, tuple[int, int]] = {}
        self.read_bytes = self.read_chars = 0
        self.lost: list[int] = []

    @staticmethod
    def _counters(pid: int) -> tuple[int, int] | None:
        try:
            io = psutil.Process(pid).io_counters()
        except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess, AttributeError):
            return None  # AttributeError: platforms without io_counters (macOS)
        return io.read_bytes, getattr(io, "read_chars", io.read_bytes)

    def start(self) -> IoProbe:
        self._start = {pid: c for pid in self.pids if (c := self._counters(pid)) is not None}
        return self

    def stop(self) -> dict:
        """Sum the deltas since start over the processes still alive."""
        self.read_bytes = self.read_chars = 0
        self.lost = []
        for pid, (b0, c0) in self._start.items():
            now = self._counters(pid)
            if now is None:
                self.lost.append(pid)
                continue
            self.read_bytes += now[0] - b0
            self.read_chars += now[1] - c0
        return {
            "read_bytes": self.read_bytes,
            "read_chars": self.read_chars,
            "disk_fraction": self.disk_fraction(),
            "lost_pids": list(self.lost),
        }

    def disk_fraction(self) -> float | None:
        """Δread_bytes / Δread_chars, clamped to 1; None when nothing was read."""
        if self.read_chars <= 0:
            return None
        return min(1.0, self.read_bytes / self.read_chars)

    def __enter__(self) -> IoProbe:
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()


# ---------------------------------------------------------------------------
# Will it fit?


def cgroup_memory_limit() -> int | None:
    """Tightest memory limit of this process's cgroups (v1 or v2), or None if unlimited/unknown.

    The page cache a process fills is charged to its cgroup, so a container's
    limit, not the host's free memory, bounds how much of a dataset stays cached.
    """
    try:
        return env.cgroup_memory_limit_bytes()  # one reader of cgroup files for the whole tool
    except (OSError, ValueError):
        return None


def fits_in_page_cache(total_bytes: int, usable: float = 0.8) -> dict:
    """Whether a dataset of ``total_bytes`` can stay in the page cache during training.

    Room = memory available without swapping (psutil; includes reclaimable cache),
    capped by the cgroup limit. Only ``usable`` of it counts: the training process,
    workers and pinned buffers need memory too, and the kernel evicts before it is full.
    """
    if not 0 < usable <= 1:
        raise ValueError(f"usable must be in (0, 1], got usable={usable}")
    available = psutil.virtual_memory().available
    limit = cgroup_memory_limit()
    room = min(available, limit) if limit is not None else available
    fits = total_bytes <= usable * room
    return {
        "fits": fits,
        "total_bytes": int(total_bytes),
        "available_bytes": int(available),
        "cgroup_limit_bytes": limit,
        "room_bytes": int(room),
        "usable": usable,
        "reason": (
            f"{total_bytes / 1e9:.2f} GB {'fits in' if fits else 'exceeds'} {usable:.0%} of "
            f"{room / 1e9:.1f} GB of memory available for the page cache"
            + (" (cgroup limit)" if limit is not None and limit < available else "")
        ),
    }
