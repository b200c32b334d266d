"""Encoded samples held in RAM: takes storage out of the measurement."""

from __future__ import annotations

import psutil

from .base import Source, SourceError


def _read_or_error(inner: Source, index: int):
    """Sample ``index``'s bytes, or the SourceError reading it raised (an unreadable file, a FIFO): held in
    its place, so the sample is a bad one in every trial instead of the source failing to open."""
    try:
        return inner.read(index)
    except SourceError as exc:
        return exc.with_traceback(None)  # the message is what a trial shows; the frames would only hold memory


class MemorySource(Source):
    kind = "memory"

    def __init__(self, inner: Source, max_fraction: float = 0.5):
        need = inner.total_bytes()
        avail = psutil.virtual_memory().available
        if need > max_fraction * avail:
            raise SourceError(
                f"memory source: dataset is {need / 1e9:.1f} GB, more than "
                f"{max_fraction:.0%} of the {avail / 1e9:.1f} GB available"
            )
        # shared copy-on-write with forked workers: a read bumps only the refcount in
        # each object's header, so a worker copies one page per sample, not the payload
        self._blobs = [_read_or_error(inner, i) for i in range(len(inner))]
        self._labels = [inner.label(i) for i in range(len(inner))]
        self._where = [inner.where(i) for i in range(len(inner))]
        self.location = inner.describe().get("location")

    def __len__(self) -> int:
        return len(self._blobs)

    def read(self, index: int) -> bytes:
        blob = self._blobs[index]
        if isinstance(blob, SourceError):  # each read of it fails, as it would from the files
            raise blob
        return blob

    def label(self, index: int) -> int:
        return self._labels[index]

    def where(self, index: int) -> str:
        return self._where[index]

    def nbytes(self, index: int) -> int:
        blob = self._blobs[index]
        return 0 if isinstance(blob, SourceError) else len(blob)

    def describe(self) -> dict:
        return {**super().describe(), "location": self.location}
