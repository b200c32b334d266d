"""Pre-flight scan of a dataset's files: which cannot be read or are not whole images, before any
measurement (``pipeprof check-data DIR``, and before a sweep of a folder dataset).

Fast, without decoding pixels: Pillow reads each file's header (its size in pixels) and checks
its structure (``verify``: PNG chunk checksums, for instance). Pillow's verify does not notice a
JPEG cut short, so a JPEG must also hold its end-of-image marker near its end (entropy-coded data
cannot contain that marker, so a file cut anywhere in its pixels lacks it). The decoders in
``decode`` remain the judge during a trial; this scan lists what they would refuse.

Each path's type is read before anything opens it (``sources.base.file_kind``): a FIFO, socket, device
or directory named like an image is listed as unreadable, with what it is, and never opened (a FIFO's
open would wait for a writer forever).
"""

from __future__ import annotations

import os
import time
import warnings
from typing import NamedTuple, Optional

from pipeprof.data.sources.base import file_kind
from pipeprof.data.sources.files import read_file_list, scan_image_folder

JPEG_END = b"\xff\xd9"
TAIL_BYTES = 1024  # where the end marker must be: after it, some writers pad a little


class CheckResult(NamedTuple):
    """What a scan found: ``unreadable`` (path, reason) and ``large`` (path, pixels) over ``max_pixels``."""

    files: int  # files in the dataset
    checked: int  # of them, how many were scanned (an evenly spread subset when limited)
    unreadable: list
    large: list
    max_pixels: int
    seconds: float
    misnamed: list = []  # (path, format) of a readable image whose name says another format (a PNG named .jpg)

    def summary(self, examples: int = 20) -> dict:
        """Plain JSON for run.json: the counts and the first ``examples`` of each list."""
        return {
            "files": self.files,
            "checked": self.checked,
            "unreadable": len(self.unreadable),
            "unreadable_first": [f"{p}: {why}" for p, why in self.unreadable[:examples]],
            "large": len(self.large),
            "large_first": [f"{p} ({px / 1e6:.0f} MP)" for p, px in self.large[:examples]],
            "max_pixels": self.max_pixels,
            "seconds": self.seconds,
            "misnamed": len(self.misnamed),
            "misnamed_first": [f"{p}: {fmt} named {os.path.splitext(p)[1]}" for p, fmt in self.misnamed[:examples]],
        }

    def lines(self) -> list[str]:
        """What was found, one line each, for a log or the console."""
        head = (
            f"checked {self.checked} of {self.files} files in {self.seconds:.1f} s: "
            f"{len(self.unreadable)} unreadable, {len(self.large)} above {self.max_pixels / 1e6:g} MP"
            + (f", {len(self.misnamed)} named as another format" if self.misnamed else "")
        )
        return (
            [head]
            + [f"  unreadable: {p}: {why}" for p, why in self.unreadable]
            + [f"  large: {p} ({px / 1e6:.0f} MP)" for p, px in self.large]
            + [
                f"  misnamed: {p}: {fmt} named {os.path.splitext(p)[1]} (JPEG-only decoders such as nvJPEG refuse it)"
                for p, fmt in self.misnamed
            ]
        )


# what a file's name says it holds, for the formats a name commonly claims (Pillow's format names)
CLAIMED = {".jpg": "JPEG", ".jpeg": "JPEG", ".png": "PNG", ".webp": "WEBP", ".bmp": "BMP", ".tif": "TIFF"}


def misnamed(path: str, fmt: Optional[str]) -> Optional[str]:
    """The format ``fmt`` that Pillow read from the file's bytes where its name claims another, else None."""
    claimed = CLAIMED.get(os.path.splitext(path)[1].lower())
    return fmt if claimed and fmt and fmt != claimed else None


def check_file(path: str) -> tuple[Optional[str], Optional[int]]:
    """(why the file is not a readable image or None, its pixels or None) from its header."""
    why, pixels, _ = check_file_format(path)
    return why, pixels


def check_file_format(path: str) -> tuple[Optional[str], Optional[int], Optional[str]]:
    """:func:`check_file`'s (why, pixels) and the format Pillow read from the bytes (None when unreadable)."""
    from PIL import Image

    kind = file_kind(path)
    if kind is not None:
        return kind, None, None
    try:
        with warnings.catch_warnings():
            # a large image is reported by its size, not by Pillow's warning; one over twice Pillow's
            # limit raises DecompressionBombError, which the decoder would raise too: unreadable
            warnings.simplefilter("ignore", Image.DecompressionBombWarning)
            with Image.open(path) as img:
                width, height, fmt = img.width, img.height, img.format
                img.verify()
        if fmt == "JPEG" and not _jpeg_ends(path):
            return f"no JPEG end marker in its last {TAIL_BYTES} bytes: the file is truncated", width * height, fmt
        return None, width * height, fmt
    except Exception as exc:  # Pillow raises many types (and OSError for a file it cannot open)
        return f"{type(exc).__name__}: {exc}", None, None


def _jpeg_ends(path: str) -> bool:
    with open(path, "rb") as f:
        f.seek(max(0, os.fstat(f.fileno()).st_size - TAIL_BYTES))
        return JPEG_END in f.read()


def spread(paths: list, limit: Optional[int]) -> list:
    """Up to ``limit`` of ``paths``, evenly spread over the list (every class of a sorted tree)."""
    if limit is None or len(paths) <= limit:
        return list(paths)
    step = len(paths) / limit
    return [paths[int(k * step)] for k in range(limit)]


def check_paths(paths: list, limit: Optional[int] = None, max_pixels: int = 50_000_000) -> CheckResult:
    """Scan up to ``limit`` of ``paths`` (all when None)."""
    t0 = time.perf_counter()
    chosen = spread(paths, limit)
    unreadable, large, wrong = [], [], []
    for path in chosen:
        why, pixels, fmt = check_file_format(path)
        if why is not None:
            unreadable.append((path, why))
        elif misnamed(path, fmt):
            wrong.append((path, fmt))
        if pixels is not None and pixels > max_pixels:
            large.append((path, pixels))
    return CheckResult(len(paths), len(chosen), unreadable, large, max_pixels, time.perf_counter() - t0, wrong)


def dataset_paths(root: str | os.PathLike) -> list[str]:
    """The files of an ImageFolder tree or a ``path label`` list (SourceError names what is missing)."""
    return read_file_list(root)[0] if os.path.isfile(root) else scan_image_folder(root)[0]
