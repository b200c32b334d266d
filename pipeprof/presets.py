"""Augmentation preset names → YAML files, without importing albumentations.

Presets live in the repository's ``augmentations/`` folder, which an installed wheel carries
as ``pipeprof/augmentations/`` (pyproject.toml maps it there); the ``PIPEPROF_PRESETS``
environment variable points elsewhere. A user can also point at any YAML written by
``albumentations.save``. Config validation resolves names here, so checking a config
does not load albumentations and OpenCV; ``augment`` loads the pipeline itself.
"""

from __future__ import annotations

import os
from pathlib import Path


def _shipped() -> Path:
    """The presets pipeprof ships: inside the package when installed from a wheel, else the checkout's own."""
    here = Path(__file__).resolve().parent
    installed, checkout = here / "augmentations", here.parent / "augmentations"
    return installed if installed.is_dir() or not checkout.is_dir() else checkout


PRESET_DIR = Path(os.environ.get("PIPEPROF_PRESETS") or _shipped())


def available() -> list[str]:
    """Names of the presets shipped in the preset folder."""
    return sorted(p.stem for p in PRESET_DIR.glob("*.yaml"))


def preset_path(name: str) -> Path:
    """Resolve a preset name or a YAML path; ValueError names the available presets."""
    candidate = Path(name)
    if candidate.suffix in (".yaml", ".yml") and candidate.is_file():
        return candidate
    shipped = PRESET_DIR / f"{name}.yaml"
    if shipped.is_file():
        return shipped
    raise ValueError(
        f"unknown augmentation preset {name!r}; available: {', '.join(available())} "
        "or a path to an albumentations YAML file"
    )
