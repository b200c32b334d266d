"""Augmentation preset names → YAML files, without importing albumentations.

Presets live in the repository's ``augmentations/`` folder (override with the
``PIPEPROF_PRESETS`` environment variable); a user can also point at any YAML written
by ``albumentations.save``. Config validation resolves names here, so checking a config
does not load albumentations and OpenCV; ``augment`` loads the pipeline itself.
"""
from __future__ import annotations

import os
from pathlib import Path

PRESET_DIR = Path(os.environ.get("PIPEPROF_PRESETS", Path(__file__).resolve().parents[1] / "augmentations"))


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
    raise ValueError(f"unknown augmentation preset {name!r}; available: {', '.join(available())} "
                     "or a path to an albumentations YAML file")
