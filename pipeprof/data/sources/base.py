"""The Source interface shared by every storage kind, and the check every local path gets before a
reader opens it (:func:`file_kind`, :func:`read_regular`): opening a FIFO blocks until a writer comes,
a device may never end, a directory cannot be read, so only regular files are read."""

from __future__ import annotations

import os
import stat
from abc import ABC, abstractmethod
from typing import Optional

#: what a path that is not a regular file is, in messages (by ``stat.S_IFMT``)
KINDS = {
    stat.S_IFIFO: "a FIFO (named pipe)",
    stat.S_IFSOCK: "a socket",
    stat.S_IFCHR: "a character device",
    stat.S_IFBLK: "a block device",
    stat.S_IFDIR: "a directory",
    stat.S_IFLNK: "a symbolic link",
}


class SourceError(IOError):
    """A source cannot be opened or a sample cannot be read; the message says which."""


class Source(ABC):
    """Map-style access to encoded samples: ``read(i)`` returns the bytes of sample i.

    Instances are pickled into DataLoader workers, so open handles (sockets, tar
    files) must be created lazily in the worker, never in ``__init__``.
    """

    kind: str = "?"
    emulated: bool = False  # True when the storage's speed is imposed, not native

    @abstractmethod
    def __len__(self) -> int: ...

    @abstractmethod
    def read(self, index: int) -> bytes: ...

    @abstractmethod
    def label(self, index: int) -> int: ...

    @abstractmethod
    def nbytes(self, index: int) -> int:
        """Encoded size of sample ``index`` without reading it."""

    def where(self, index: int) -> str:
        """Where sample ``index`` comes from (its file, shard member or URL), for messages."""
        return f"{self.kind} sample {index}"

    def total_bytes(self) -> int:
        return sum(self.nbytes(i) for i in range(len(self)))

    def files(self) -> list[str] | None:
        """Local files holding the samples, whose page-cache state a trial sets and checks;
        None when the data does not sit in local files (RAM, network objects)."""
        return None

    def describe(self) -> dict:
        """Plain-JSON description recorded with each trial."""
        return {
            "source": self.kind,
            "samples": len(self),
            "total_mb": self.total_bytes() / 1e6,
            "emulated": self.emulated,
        }


def parse_index(text: str, where: str) -> list[tuple[str, int, int | None]]:
    """(path, label, size or None) per ``path label [size]`` line; ``#`` starts a comment line.

    The format of a ``files`` file list and of a ``url`` source's index.
    """
    entries = []
    for n, line in enumerate(text.splitlines(), 1):
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        parts = line.split()
        try:
            if len(parts) == 2:
                entries.append((parts[0], int(parts[1]), None))
            elif len(parts) == 3:
                entries.append((parts[0], int(parts[1]), int(parts[2])))
            else:
                raise ValueError("expected 2 or 3 columns")
        except ValueError as exc:
            raise SourceError(f"{where} line {n}: expected 'path label [size]', got {line!r} ({exc})") from exc
    if not entries:
        raise SourceError(f"{where} lists no objects")
    return entries


def _kind_of(mode: int) -> Optional[str]:
    return None if stat.S_ISREG(mode) else KINDS.get(stat.S_IFMT(mode), "not a regular file")


def file_kind(path: str | os.PathLike) -> Optional[str]:
    """None when ``path`` is a regular file, else why it is not one, for a bad sample's reason. A symbolic
    link is followed once: one to a regular file counts as that file; one to another link, to anything
    else, or to nothing is not read (a chain of links is where loops and surprises live)."""
    try:
        st = os.lstat(path)
    except OSError as exc:
        return f"{exc.strerror or exc}"
    kind = _kind_of(st.st_mode)
    if not stat.S_ISLNK(st.st_mode):
        return None if kind is None else f"{kind}, not a regular file"
    target = os.path.join(os.path.dirname(path), os.readlink(path))
    try:
        inner = _kind_of(os.lstat(target).st_mode)
    except OSError as exc:  # a dangling link
        return f"a symbolic link to {target}: {exc.strerror or exc}"
    return None if inner is None else f"a symbolic link to {inner} ({target}), not a regular file"


def read_regular(path: str) -> bytes:
    """The bytes of the regular file ``path``; SourceError naming what it is otherwise. Checked before
    the read and again on the open descriptor (non-blocking, so a FIFO put there since cannot hang it)."""
    why = file_kind(path)
    if why is not None:
        raise SourceError(f"cannot read {path}: {why}")
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK)
    except OSError as exc:
        raise SourceError(f"cannot read {path}: {exc}") from exc
    with open(fd, "rb") as f:
        kind = _kind_of(os.fstat(fd).st_mode)
        if kind is not None:
            raise SourceError(f"cannot read {path}: {kind}, not a regular file")
        try:
            return f.read()
        except OSError as exc:
            raise SourceError(f"cannot read {path}: {exc}") from exc
