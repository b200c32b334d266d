"""Files on any mounted filesystem (local disk, NFS, FUSE), in ImageFolder layout."""
from __future__ import annotations

import os
from pathlib import Path

from .base import Source, SourceError

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


class FileSource(Source):
    kind = "files"

    def __init__(self, root: str | os.PathLike):
        self.root = str(root)
        self.paths, self.labels, self.classes = scan_image_folder(root)
        self._sizes = [os.stat(p).st_size for p in self.paths]

    def __len__(self) -> int:
        return len(self.paths)

    def read(self, index: int) -> bytes:
        try:
            with open(self.paths[index], "rb") as f:
                return f.read()
        except OSError as exc:
            raise SourceError(f"cannot read {self.paths[index]}: {exc}") from exc

    def label(self, index: int) -> int:
        return self.labels[index]

    def nbytes(self, index: int) -> int:
        return self._sizes[index]

    def total_bytes(self) -> int:
        return sum(self._sizes)

    def describe(self) -> dict:
        return {**super().describe(), "location": self.root}
