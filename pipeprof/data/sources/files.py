"""Files on any mounted filesystem (local disk, NFS, FUSE): an ImageFolder tree or a file list.

A file list is a text file of ``path label`` lines (``#`` comments allowed; paths
relative to the list's folder or absolute), the same format as a ``url`` index.

Every path named like an image stays in the list, whatever it is: one that is not a regular file (a
FIFO, a socket, a device, a directory named ``x.jpg``) is never opened (``base.read_regular``), so each
read of it fails as a bad sample, counted and named like an unreadable image.
"""

from __future__ import annotations

import os
from pathlib import Path

from .base import Source, SourceError, parse_index, read_regular

IMAGE_SUFFIXES = (".jpg", ".jpeg", ".png", ".bmp", ".webp", ".tif", ".tiff")


def scan_image_folder(root: str | os.PathLike) -> tuple[list[str], list[int], list[str]]:
    """(paths, labels, class names) of ``root/<class>/<image>``, sorted like torchvision's ImageFolder."""
    root = Path(root)
    if not root.is_dir():
        raise SourceError(f"dataset folder not found: {root}")
    classes = sorted(d.name for d in root.iterdir() if d.is_dir())
    paths, labels = [], []
    for label, name in enumerate(classes):
        files = sorted(f for f in (root / name).iterdir() if f.suffix.lower() in IMAGE_SUFFIXES)
        paths += [str(f) for f in files]
        labels += [label] * len(files)
    if not paths:
        raise SourceError(f"no images in {root}: expected class folders of {', '.join(IMAGE_SUFFIXES)} files")
    return paths, labels, classes


def read_file_list(list_path: str | os.PathLike) -> tuple[list[str], list[int]]:
    """(paths, labels) of a ``path label`` list; SourceError names the list and a missing file."""
    list_path = Path(list_path)
    try:
        text = list_path.read_text()
    except (OSError, UnicodeDecodeError) as exc:
        raise SourceError(f"cannot read file list {list_path}: {exc}") from exc
    entries = parse_index(text, str(list_path))
    paths = [str(p if os.path.isabs(p) else list_path.parent / p) for p, _, _ in entries]
    # a listed path that exists but is not a regular file is kept: reading it fails as a bad sample
    missing = [p for p in paths if not os.path.exists(p)]
    if missing:
        raise SourceError(f"{list_path}: {len(missing)} listed file(s) not found, first {missing[0]}")
    return paths, [label for _, label, _ in entries]


def _size(path: str) -> int:
    try:
        return os.stat(path).st_size
    except OSError:
        return 0


class FileSource(Source):
    kind = "files"

    def __init__(self, root: str | os.PathLike):
        """``root``: an ImageFolder tree, or a file list (see the module docstring)."""
        self.root = str(root)
        if os.path.isfile(root):
            self.paths, self.labels = read_file_list(root)
            self.classes = sorted(set(self.labels))
        else:
            self.paths, self.labels, self.classes = scan_image_folder(root)
        # a file that cannot be stat'ed (a dangling link) stays in: reading it fails as one bad sample
        self._sizes = [_size(p) for p in self.paths]

    def __len__(self) -> int:
        return len(self.paths)

    def read(self, index: int) -> bytes:
        return read_regular(self.paths[index])

    def label(self, index: int) -> int:
        return self.labels[index]

    def where(self, index: int) -> str:
        return self.paths[index]

    def nbytes(self, index: int) -> int:
        return self._sizes[index]

    def files(self) -> list[str]:
        return list(self.paths)

    def describe(self) -> dict:
        return {**super().describe(), "location": self.root}
