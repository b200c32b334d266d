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

    def total_bytes(self) -> int:
        return sum(self.nbytes(i) for i in range(len(self)))

    def describe(self) -> dict:
        """Plain-JSON description recorded with each trial."""
        return {"source": self.kind, "samples": len(self), "total_mb": self.total_bytes() / 1e6,
                "emulated": self.emulated}
