"""Tar shards in the WebDataset layout: ``<key>.jpg`` + ``<key>.cls`` per sample.

Large datasets are often stored as a few hundred ~100 MB tar files instead of a
million small files: object stores and network filesystems serve big sequential
reads far better than many small random ones. Profiling that layout needs a
source that reads it the way a real loader does.

The shards are indexed once, at construction, with :mod:`tarfile` (headers
only, plus the few bytes of each ``.cls``); afterwards ``read(i)`` is a single
``os.pread`` at the member's data offset, so random access costs one syscall and
``shard_order`` lets a loader read each shard front to back instead.
"""
from __future__ import annotations

import glob
import io
import os
import random
import re
import tarfile
from pathlib import Path

from .base import Source, SourceError
from .files import IMAGE_SUFFIXES, scan_image_folder

SHARD_NAME = "shard-{:06d}.tar"
LABEL_EXT = "cls"
_IMAGE_EXTS = {s.lstrip(".") for s in IMAGE_SUFFIXES}
MAX_OPEN_SHARDS = 64  # per process: bounds file descriptors with thousands of shards


def _expand_braces(pattern: str) -> list[str]:
    """WebDataset's ``shard-{000000..000009}.tar`` range notation (one range)."""
    m = re.search(r"\{(\d+)\.\.(\d+)\}", pattern)
    if not m:
        return [pattern]
    lo, hi, width = int(m[1]), int(m[2]), len(m[1])
    return [pattern[:m.start()] + f"{k:0{width}d}" + pattern[m.end():] for k in range(lo, hi + 1)]


def shard_paths(pattern_or_dir: str | os.PathLike) -> list[str]:
    """Shard files named by a folder (all ``*.tar`` in it), a glob, a brace range or one file."""
    spec = str(pattern_or_dir)
    if os.path.isdir(spec):
        paths = sorted(glob.glob(os.path.join(glob.escape(spec), "*.tar")))
    elif any(c in spec for c in "*?[{"):
        paths = sorted(p for pat in _expand_braces(spec) for p in glob.glob(pat))
    else:
        paths = [spec] if os.path.isfile(spec) else []
    if not paths:
        raise SourceError(f"no tar shards found at {spec}")
    return paths


def _split_name(name: str) -> tuple[str, str]:
    """WebDataset convention: the key ends at the first dot of the base name."""
    folder, _, base = name.rpartition("/")
    stem, _, ext = base.partition(".")
    return (f"{folder}/{stem}" if folder else stem), ext.lower()


def _read_label(tf: tarfile.TarFile, member: tarfile.TarInfo, shard: str) -> int:
    try:
        return int(tf.extractfile(member).read().decode("ascii").strip())
    except (ValueError, UnicodeDecodeError) as exc:
        raise SourceError(f"{shard}: member {member.name} is not an integer label") from exc


def _index_members(tf: tarfile.TarFile, shard: str, file_size: int) -> list[tuple[str, int, int, int]]:
    """(image member name, data offset, size, label) per sample, in file order."""
    images: dict[str, tarfile.TarInfo] = {}  # key -> image member; dicts keep file order
    labels: dict[str, int] = {}
    for m in tf:
        if not m.isfile():
            continue
        if m.offset_data + m.size > file_size:
            raise SourceError(f"truncated shard {shard}: member {m.name} needs bytes up to "
                              f"{m.offset_data + m.size}, the file has {file_size}")
        key, ext = _split_name(m.name)
        if ext in _IMAGE_EXTS:
            images.setdefault(key, m)
        elif ext == LABEL_EXT:
            labels[key] = _read_label(tf, m, shard)
    # A tar ends with two zero blocks; without them members may be missing after a
    # cut at a member boundary, which tarfile would otherwise take as a clean end.
    if tf.offset + 2 * tarfile.BLOCKSIZE > file_size:
        last = tf.members[-1].name if tf.members else "(none)"
        raise SourceError(f"truncated shard {shard}: no end-of-archive marker after member {last}")
    missing = [m.name for k, m in images.items() if k not in labels]
    if missing:
        raise SourceError(f"{shard}: member {missing[0]} has no .{LABEL_EXT} label "
                          f"({len(missing)} such samples)")
    return [(m.name, m.offset_data, m.size, labels[k]) for k, m in images.items()]


def index_shard(path: str) -> list[tuple[str, int, int, int]]:
    """Index one uncompressed tar shard; SourceError names the shard and member on damage."""
    try:
        size = os.path.getsize(path)
        # "r:" = uncompressed only: pread at a data offset is meaningless inside gzip
        with tarfile.open(path, "r:") as tf:
            return _index_members(tf, path, size)
    except SourceError:
        raise
    except tarfile.TarError as exc:
        raise SourceError(f"{path} is not an uncompressed tar shard: {exc}") from exc
    except OSError as exc:
        raise SourceError(f"cannot read shard {path}: {exc}") from exc


class ShardSource(Source):
    kind = "shards"
    sequential = True  # reading shard by shard (``shard_order``) is the intended access pattern

    def __init__(self, pattern_or_dir: str | os.PathLike):
        self.location = str(pattern_or_dir)
        self.shards = shard_paths(pattern_or_dir)
        self._shard, self._names, self._offsets, self._sizes, self._labels = [], [], [], [], []
        self._starts = [0]  # samples of shard s are range(_starts[s], _starts[s + 1])
        for s, path in enumerate(self.shards):
            for name, offset, size, label in index_shard(path):
                self._shard.append(s)
                self._names.append(name)
                self._offsets.append(offset)
                self._sizes.append(size)
                self._labels.append(label)
            self._starts.append(len(self._shard))
        if not self._shard:
            raise SourceError(f"no samples (<key>.jpg + <key>.cls) in the shards at {self.location}")
        self._pid, self._fds = None, {}

    # -- per-process file handles ------------------------------------------

    def __getstate__(self):
        # file descriptors are meaningless in another process: the copy opens its own
        return {**self.__dict__, "_pid": None, "_fds": {}}

    def _fd(self, shard: int) -> int:
        if self._pid != os.getpid():  # forked worker: the parent's cache is not ours to use
            self._pid, self._fds = os.getpid(), {}
        fd = self._fds.get(shard)
        if fd is None:
            if len(self._fds) >= MAX_OPEN_SHARDS:
                os.close(self._fds.pop(next(iter(self._fds))))  # oldest opened
            fd = self._fds[shard] = os.open(self.shards[shard], os.O_RDONLY)
        return fd

    def close(self) -> None:
        """Close this process's shard handles (reads reopen them)."""
        if self._pid == os.getpid():
            for fd in self._fds.values():
                os.close(fd)
        self._fds = {}

    def __del__(self):
        try:
            self.close()
        except Exception:  # interpreter shutdown: os may already be gone
            pass

    # -- Source interface ----------------------------------------------------

    def __len__(self) -> int:
        return len(self._shard)

    def read(self, index: int) -> bytes:
        shard, size = self._shard[index], self._sizes[index]
        try:
            data = os.pread(self._fd(shard), size, self._offsets[index])
        except OSError as exc:
            raise SourceError(f"cannot read {self._names[index]} from {self.shards[shard]}: {exc}") from exc
        if len(data) != size:
            raise SourceError(f"{self.shards[shard]}: member {self._names[index]} is cut short "
                              f"({len(data)} of {size} bytes); the shard changed after indexing")
        return data

    def label(self, index: int) -> int:
        return self._labels[index]

    def nbytes(self, index: int) -> int:
        return self._sizes[index]

    def files(self) -> list[str]:
        return list(self.shards)

    def shard_of(self, index: int) -> int:
        """Position in :attr:`shards` of the shard holding sample ``index``."""
        return self._shard[index]

    def shard_order(self, seed: int, epoch: int) -> list[int]:
        """Every index once: shards in an order shuffled by ``seed + epoch``, members in file order."""
        order = list(range(len(self.shards)))
        random.Random(seed + epoch).shuffle(order)
        return [i for s in order for i in range(self._starts[s], self._starts[s + 1])]

    def describe(self) -> dict:
        return {**super().describe(), "location": self.location, "shards": len(self.shards)}


# ---------------------------------------------------------------------------
# Packing an ImageFolder tree into shards


def _add_member(tf: tarfile.TarFile, name: str, data: bytes) -> None:
    info = tarfile.TarInfo(name)
    info.size, info.mode, info.mtime = len(data), 0o644, 0  # fixed mtime: reproducible shards
    tf.addfile(info, io.BytesIO(data))


def _groups(paths: list[str], limit: int) -> list[list[int]]:
    """Split positions into consecutive groups of about ``limit`` bytes (at least one sample each)."""
    groups, current, size = [], [], 0
    for k, p in enumerate(paths):
        n = os.path.getsize(p)
        if current and size + n > limit:
            groups.append(current)
            current, size = [], 0
        current.append(k)
        size += n
    return groups + [current] if current else groups


def pack_folder(src_dir: str | os.PathLike, dst_dir: str | os.PathLike, shard_size_mb: float = 100.0,
                seed: int = 0, overwrite: bool = False) -> dict:
    """Pack an ImageFolder tree into ``dst_dir/shard-000000.tar`` ... of ~``shard_size_mb`` (1e6 B) each.

    Samples are shuffled with ``seed`` so every shard mixes classes (a loader that
    reads shard by shard would otherwise see one class at a time). Keys are
    sequence numbers: file stems may repeat across classes or contain dots.
    """
    if not shard_size_mb > 0:
        raise ValueError(f"shard_size_mb must be > 0, got shard_size_mb={shard_size_mb}")
    paths, labels, _ = scan_image_folder(src_dir)
    dst = Path(dst_dir)
    dst.mkdir(parents=True, exist_ok=True)
    stale = sorted(dst.glob("shard-*.tar"))
    if stale and not overwrite:
        raise FileExistsError(f"{dst} already holds {len(stale)} shards; pass overwrite=True to replace them")
    for p in stale:  # leftovers of a larger packing would silently add samples
        p.unlink()
    order = list(range(len(paths)))
    random.Random(seed).shuffle(order)
    paths, labels = [paths[k] for k in order], [labels[k] for k in order]
    groups = _groups(paths, int(shard_size_mb * 1e6))
    total = 0
    for s, group in enumerate(groups):
        out = dst / SHARD_NAME.format(s)
        with tarfile.open(out, "w") as tf:
            for k in group:
                ext = Path(paths[k]).suffix.lower()
                _add_member(tf, f"{k:09d}{ext}", Path(paths[k]).read_bytes())
                _add_member(tf, f"{k:09d}.{LABEL_EXT}", str(labels[k]).encode("ascii"))
        total += out.stat().st_size
    return {"shards": len(groups), "samples": len(paths), "total_mb": total / 1e6}
