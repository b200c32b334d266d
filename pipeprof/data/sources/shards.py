"""Tar shards in the WebDataset layout: ``<key>.<image ext>`` + ``<key>.cls`` per sample.

Large datasets are often stored as a few hundred ~100 MB tar files instead of a
million small files: object stores and network filesystems serve big sequential
reads far better than many small random ones. Profiling that layout needs a
source that reads it the way a real loader does.

The layout is WebDataset's, so shards users already have are read as they are:
those written by ``webdataset.TarWriter``/``ShardWriter`` and those of ``pipeprof
pack``. A member's key ends at the first dot of its base name (``sample000001.jpg``
→ key ``sample000001``, extension ``jpg``); a sample is the image (``jpg``, ``jpeg``,
``png``, ``webp``, ...) and the label of one key: ``cls`` (a text integer) or, without
one, ``json`` (an integer, or an object with an integer ``label``, ``cls`` or
``class``). WebDataset's metadata members (``__...__``) and keys without an image
are skipped, as WebDataset skips them.

The shards are indexed once, at construction, with :mod:`tarfile` (headers only,
plus the few bytes of each label); that index gives ``len``, ``label``, ``nbytes``
and the shard of each sample without reading any image. Two readers then fetch
the bytes of a sample:

``reader="pipeprof"`` (default)
    one ``os.pread`` at the member's data offset: random access costs one syscall,
    and ``shard_order`` lets a loader read each shard front to back.

``reader="webdataset"``
    the ``webdataset`` library's own tar iteration and grouping of members into
    samples (``tar_file_expander`` then ``group_by_keys``, the stages a
    ``wds.WebDataset([shard], shardshuffle=False)`` pipeline runs on an opened
    shard). That reading is sequential only: a tar stream has no index, so a
    per-index ``read(i)`` is not natural. Each process therefore keeps a cursor per
    shard (an open file and a live webdataset iterator), and ``read(i)`` takes the
    cursor's next sample when ``i`` is the sample after the last one read from that
    shard, which is how the :class:`~pipeprof.data.dataset.ShardSampler` asks for
    them (each worker reads its shards front to back). Any other read (a new pass,
    a worker handed the second half of a shard, random access) opens a new cursor
    at that sample's first tar header, so it never reads the members before it;
    random access works but costs a file open per read. The samples' bytes and
    keys are checked against the index. This reader needs each sample's members
    next to each other, as WebDataset does; shards where they are not are refused
    at construction.
"""

from __future__ import annotations

import glob
import io
import json
import os
import random
import re
import tarfile
from pathlib import Path
from typing import NamedTuple

from .base import Source, SourceError, file_kind, read_regular
from .files import IMAGE_SUFFIXES, scan_image_folder

SHARD_NAME = "shard-{:06d}.tar"
LABEL_EXT = "cls"  # what pack_folder writes, and what wins when a sample also has a json
LABEL_EXTS = (LABEL_EXT, "json")  # in order of preference
READERS = ("pipeprof", "webdataset")
_IMAGE_EXTS = {s.lstrip(".") for s in IMAGE_SUFFIXES}
_JSON_LABEL_FIELDS = ("label", "cls", "class")
_META = re.compile(r"__[^/]*__($|/)")  # webdataset's skip_meta: never part of a sample
MAX_OPEN_SHARDS = 64  # per process: bounds file descriptors (and webdataset cursors) with thousands of shards


def _expand_braces(pattern: str) -> list[str]:
    """WebDataset's ``shard-{000000..000009}.tar`` range notation (one range)."""
    m = re.search(r"\{(\d+)\.\.(\d+)\}", pattern)
    if not m:
        return [pattern]
    lo, hi, width = int(m[1]), int(m[2]), len(m[1])
    return [pattern[: m.start()] + f"{k:0{width}d}" + pattern[m.end() :] for k in range(lo, hi + 1)]


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


class Member(NamedTuple):
    """One sample of a shard, as the index holds it."""

    name: str  # the image member's name
    offset: int  # where the image's bytes start
    size: int  # how many bytes the image has
    label: int
    start: int  # where the sample's first tar header starts (a tar stream can begin there)


def _label_text(tf: tarfile.TarFile, member: tarfile.TarInfo) -> str:
    return tf.extractfile(member).read().decode("utf-8").strip()


def _read_label(tf: tarfile.TarFile, member: tarfile.TarInfo, shard: str) -> int:
    ext = _split_name(member.name)[1]
    try:
        if ext != "json":
            return int(_label_text(tf, member))
        value = json.loads(_label_text(tf, member))
        if isinstance(value, dict):
            value = next((value[f] for f in _JSON_LABEL_FIELDS if f in value), None)
        if isinstance(value, int) and not isinstance(value, bool):
            return value
        raise ValueError("no integer label")
    except (ValueError, UnicodeDecodeError) as exc:
        what = (
            "an integer or an object with an integer " + ", ".join(repr(f) for f in _JSON_LABEL_FIELDS)
            if ext == "json"
            else "an integer label"
        )
        raise SourceError(f"{shard}: member {member.name} is not {what}") from exc


def _index_members(tf: tarfile.TarFile, shard: str, file_size: int, webdataset_layout: bool = False) -> list[Member]:
    """One :class:`Member` per sample, in file order; with ``webdataset_layout`` the members
    of each sample must be adjacent (webdataset groups consecutive members by key)."""
    samples, misplaced = _group_by_key(tf, shard, file_size)
    # A tar ends with two zero blocks; without them members may be missing after a
    # cut at a member boundary, which tarfile would otherwise take as a clean end.
    if tf.offset + 2 * tarfile.BLOCKSIZE > file_size:
        last = tf.members[-1].name if tf.members else "(none)"
        raise SourceError(f"truncated shard {shard}: no end-of-archive marker after member {last}")
    if webdataset_layout and misplaced is not None:
        raise SourceError(
            f"{shard}: member {misplaced} is not next to the other members of its sample; "
            f"the webdataset reader needs each sample's files adjacent (re-pack with pipeprof pack)"
        )
    return _labelled_members(tf, shard, samples)


def _group_by_key(tf: tarfile.TarFile, shard: str, file_size: int) -> tuple[dict[str, dict], str | None]:
    """Each sample's first image and labels by key, and the first member away from its sample's others."""
    samples: dict[str, dict] = {}  # key -> {"start", "image", "labels"}; dicts keep file order
    last_key, misplaced = None, None
    for m in tf:
        if not m.isfile():
            continue
        if m.offset_data + m.size > file_size:
            raise SourceError(
                f"truncated shard {shard}: member {m.name} needs bytes up to "
                f"{m.offset_data + m.size}, the file has {file_size}"
            )
        key, ext = _split_name(m.name)
        if not ext or not key.rpartition("/")[2] or _META.match(m.name):
            continue  # webdataset takes no sample from these either
        entry = samples.get(key)
        if entry is None:
            entry = samples[key] = {"start": m.offset, "image": None, "labels": {}, "exts": set()}
        elif (key != last_key or ext in entry["exts"]) and misplaced is None:
            misplaced = m.name  # comes back after another key, or twice: webdataset would split the sample
        entry["exts"].add(ext)
        last_key = key
        if ext in _IMAGE_EXTS:
            if entry["image"] is None:
                entry["image"] = m
        elif ext in LABEL_EXTS:
            entry["labels"].setdefault(ext, m)
    return samples, misplaced


def _labelled_members(tf: tarfile.TarFile, shard: str, samples: dict[str, dict]) -> list[Member]:
    """The samples with an image, in the images' file order; each must have a label."""
    with_image = sorted((e for e in samples.values() if e["image"] is not None), key=lambda e: e["image"].offset)
    missing = [e["image"].name for e in with_image if not e["labels"]]
    if missing:
        raise SourceError(
            f"{shard}: member {missing[0]} has no "
            f"{' or '.join('.' + x for x in LABEL_EXTS)} label ({len(missing)} such samples)"
        )
    out = []
    for e in with_image:
        label_member = next(e["labels"][x] for x in LABEL_EXTS if x in e["labels"])
        img = e["image"]
        out.append(Member(img.name, img.offset_data, img.size, _read_label(tf, label_member, shard), e["start"]))
    return out


def index_shard(path: str, webdataset_layout: bool = False) -> list[Member]:
    """Index one uncompressed tar shard; SourceError names the shard and member on damage.

    ``webdataset_layout``: also refuse a shard whose samples' members are not adjacent.
    """
    try:
        size = os.path.getsize(path)
        # "r:" = uncompressed only: pread at a data offset is meaningless inside gzip
        with tarfile.open(path, "r:") as tf:
            return _index_members(tf, path, size, webdataset_layout)
    except SourceError:
        raise
    except tarfile.TarError as exc:
        raise SourceError(f"{path} is not an uncompressed tar shard: {exc}") from exc
    except OSError as exc:
        raise SourceError(f"cannot read shard {path}: {exc}") from exc


class _WdsCursor:
    """webdataset's reading of one shard, positioned before sample ``pos`` of the index.

    The file is opened as ``wds.WebDataset`` opens a local shard (``open(path, "rb")``) and
    read by the stages that pipeline runs next, ``tar_file_expander`` and ``group_by_keys``;
    the pipeline's node and worker splitting and shard shuffling are left out (the sampler
    already gave this worker its shard, in its order). The stream starts at the first tar
    header of sample ``pos`` (a tar stream may start at any header; 0 for the shard's first
    sample), and the cursor owns the file, so it is closed when the cursor is.
    """

    def __init__(self, path: str, pos: int, start: int):
        from webdataset.tariterators import group_by_keys, tar_file_expander

        self.path, self.pos = path, pos
        self._file = open(path, "rb")
        try:
            self._file.seek(start if pos else 0)
            self._samples = group_by_keys(tar_file_expander([{"url": path, "stream": self._file}]))
        except BaseException:
            self._file.close()
            raise

    def next_sample(self, key: str) -> dict:
        """The next sample, which must be ``key``'s (samples without an image in between are passed)."""
        try:
            for sample in self._samples:
                if sample.get("__key__") == key:
                    self.pos += 1
                    return sample
        except (OSError, ValueError, tarfile.TarError) as exc:  # ValueError: webdataset's duplicate member
            self.pos = -1
            raise SourceError(f"webdataset cannot read sample {key} from {self.path}: {exc}") from exc
        self.pos = -1
        raise SourceError(f"webdataset found no sample {key} in {self.path}; the shard changed after indexing")

    def close(self) -> None:
        self._samples.close()
        self._file.close()


class ShardSource(Source):
    kind = "shards"
    sequential = True  # reading shard by shard (``shard_order``) is the intended access pattern

    def __init__(self, pattern_or_dir: str | os.PathLike, reader: str = "pipeprof"):
        if reader not in READERS:
            raise ValueError(f"unknown shard reader {reader!r}; allowed: {', '.join(READERS)}")
        if reader == "webdataset":
            try:  # imported here, before any fork, so DataLoader workers inherit the module
                import webdataset  # noqa: F401
            except ImportError as exc:
                raise SourceError(f"reader 'webdataset' needs the webdataset package: {exc}") from exc
        self.location, self.reader = str(pattern_or_dir), reader
        kinds = {p: file_kind(p) for p in shard_paths(pattern_or_dir)}
        # a shard that is not a regular file (a FIFO named x.tar) is never opened: skipped, and named
        self.skipped = [(p, why) for p, why in kinds.items() if why is not None]
        self.shards = [p for p, why in kinds.items() if why is None]
        self._shard, self._names, self._offsets, self._sizes, self._labels = [], [], [], [], []
        self._heads = []  # where each sample's first tar header starts (webdataset reader)
        self._starts = [0]  # samples of shard s are range(_starts[s], _starts[s + 1])
        for s, path in enumerate(self.shards):
            for member in index_shard(path, webdataset_layout=reader == "webdataset"):
                self._shard.append(s)
                self._names.append(member.name)
                self._offsets.append(member.offset)
                self._sizes.append(member.size)
                self._labels.append(member.label)
                self._heads.append(member.start)
            self._starts.append(len(self._shard))
        if not self._shard:
            raise SourceError(f"no samples (<key>.jpg + <key>.cls) in the shards at {self.location}")
        self._pid, self._fds, self._cursors = None, {}, {}

    # -- per-process file handles and webdataset cursors ---------------------

    def __getstate__(self):
        # file descriptors and live iterators are meaningless in another process: the copy opens its own
        return {**self.__dict__, "_pid": None, "_fds": {}, "_cursors": {}}

    def _own(self) -> None:
        if self._pid != os.getpid():  # forked worker: the parent's handles are not ours to use
            self._pid, self._fds, self._cursors = os.getpid(), {}, {}

    def _fd(self, shard: int) -> int:
        self._own()
        fd = self._fds.get(shard)
        if fd is None:
            if len(self._fds) >= MAX_OPEN_SHARDS:
                os.close(self._fds.pop(next(iter(self._fds))))  # oldest opened
            fd = self._fds[shard] = os.open(self.shards[shard], os.O_RDONLY)
        return fd

    def _cursor(self, shard: int, pos: int, start: int) -> _WdsCursor:
        """This process's cursor on ``shard`` that yields sample ``pos`` next (a new one when none does)."""
        self._own()
        cursor = self._cursors.pop(shard, None)
        if cursor is not None and cursor.pos != pos:
            cursor.close()
            cursor = None
        if cursor is None:
            if len(self._cursors) >= MAX_OPEN_SHARDS:
                self._cursors.pop(next(iter(self._cursors))).close()  # least recently read
            try:
                cursor = _WdsCursor(self.shards[shard], pos, start)
            except OSError as exc:
                raise SourceError(f"cannot open shard {self.shards[shard]}: {exc}") from exc
        self._cursors[shard] = cursor  # (re)inserted last: the most recently read
        return cursor

    def close(self) -> None:
        """Close this process's shard handles and cursors (reads reopen them)."""
        if self._pid == os.getpid():
            for fd in self._fds.values():
                os.close(fd)
            for cursor in self._cursors.values():
                cursor.close()
        self._fds, self._cursors = {}, {}

    def __del__(self):
        try:
            self.close()
        except Exception:  # interpreter shutdown: os may already be gone
            pass

    # -- Source interface ----------------------------------------------------

    def __len__(self) -> int:
        return len(self._shard)

    def read(self, index: int) -> bytes:
        if self.reader == "webdataset":
            return self._read_webdataset(index)
        shard, size = self._shard[index], self._sizes[index]
        try:
            data = os.pread(self._fd(shard), size, self._offsets[index])
        except OSError as exc:
            raise SourceError(f"cannot read {self._names[index]} from {self.shards[shard]}: {exc}") from exc
        if len(data) != size:
            raise SourceError(
                f"{self.shards[shard]}: member {self._names[index]} is cut short "
                f"({len(data)} of {size} bytes); the shard changed after indexing"
            )
        return data

    def _read_webdataset(self, index: int) -> bytes:
        shard = self._shard[index]
        key, ext = _split_name(self._names[index])
        cursor = self._cursor(shard, index - self._starts[shard], self._heads[index])
        try:
            data = cursor.next_sample(key).get(ext)
        except SourceError:
            self._cursors.pop(shard, None)
            cursor.close()
            raise
        if data is None or len(data) != self._sizes[index]:
            got = "no such member" if data is None else f"{len(data)} of {self._sizes[index]} bytes"
            raise SourceError(
                f"{self.shards[shard]}: webdataset read member {self._names[index]} as {got}; "
                f"the shard changed after indexing"
            )
        return bytes(data)

    def label(self, index: int) -> int:
        return self._labels[index]

    def where(self, index: int) -> str:
        return f"{self.shards[self._shard[index]]}:{self._names[index]}"

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
        skipped = {"skipped": [f"{p}: {why}" for p, why in self.skipped]} if self.skipped else {}
        return {
            **super().describe(),
            "location": self.location,
            "shards": len(self.shards),
            "reader": self.reader,
            **skipped,
        }


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


def pack_folder(
    src_dir: str | os.PathLike,
    dst_dir: str | os.PathLike,
    shard_size_mb: float = 100.0,
    seed: int = 0,
    overwrite: bool = False,
) -> dict:
    """Pack an ImageFolder tree into ``dst_dir/shard-000000.tar`` ... of ~``shard_size_mb`` (1e6 B) each.

    Samples are shuffled with ``seed`` so every shard mixes classes (a loader that
    reads shard by shard would otherwise see one class at a time). Keys are
    sequence numbers: file stems may repeat across classes or contain dots.
    Each sample is ``<key>.<image ext>`` then ``<key>.cls``, adjacent: the WebDataset
    layout, which ``webdataset.WebDataset`` reads as it is (``.decode("pil").to_tuple("jpg", "cls")``).
    """
    if not shard_size_mb > 0:
        raise ValueError(f"shard_size_mb must be > 0, got shard_size_mb={shard_size_mb}")
    found, labels, _ = scan_image_folder(src_dir)
    # what is not a regular file (a FIFO, a directory named x.jpg) is left out, and named in the answer
    kinds = [file_kind(p) for p in found]
    skipped = [f"{p}: {why}" for p, why in zip(found, kinds) if why is not None]
    paths = [p for p, why in zip(found, kinds) if why is None]
    labels = [label for label, why in zip(labels, kinds) if why is None]
    if not paths:
        raise SourceError(f"no regular image files in {src_dir}; first of what is there: {skipped[0]}")
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
                _add_member(tf, f"{k:09d}{ext}", read_regular(paths[k]))
                _add_member(tf, f"{k:09d}.{LABEL_EXT}", str(labels[k]).encode("ascii"))
        total += out.stat().st_size
    return {"shards": len(groups), "samples": len(paths), "total_mb": total / 1e6, "skipped": skipped}
