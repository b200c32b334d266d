"""The Source interface shared by every storage kind."""
from __future__ import annotations

from abc import ABC, abstractmethod


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
        return {"source": self.kind, "samples": len(self), "total_mb": self.total_bytes() / 1e6,
                "emulated": self.emulated}


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
            raise SourceError(f"{where} line {n}: expected 'path label [size]', "
                              f"got {line!r} ({exc})") from exc
    if not entries:
        raise SourceError(f"{where} lists no objects")
    return entries
