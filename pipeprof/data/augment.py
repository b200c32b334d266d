"""Augmentation presets: albumentations pipelines stored in its own YAML serialisation.

Preset names resolve in ``presets`` (no albumentations import there). To add a
preset, build the ``A.Compose`` and ``A.save(compose, "augmentations/NAME.yaml",
data_format="yaml")``.
"""

from __future__ import annotations

import albumentations as A  # pipeprof/__init__ has switched its update check off before this import

from pipeprof.config import ConfigError
from pipeprof.presets import preset_path

# keys albumentations uses for output size: rewritten when a model wants another input side
_SIZE_KEYS = ("height", "width")


def _load(path) -> A.Compose:
    """The pipeline albumentations reads from ``path``; ConfigError naming the file and albumentations'
    reason when it cannot (malformed YAML, no 'transform' key, a transform it does not know)."""

    def refuse(why: str) -> ConfigError:
        return ConfigError(f"augment.preset: {path}: albumentations {A.__version__} cannot load it: {why}")

    try:
        compose = A.load(str(path), data_format="yaml")
    except KeyError as exc:  # albumentations' own lookups: the top-level key, then each transform's name
        key = exc.args[0] if exc.args else None
        raise refuse(
            "no 'transform' key (albumentations.save writes one)"
            if key == "transform"
            else f"KeyError {key!r}: no transform of that name (or a key it needs is missing)"
        ) from None
    except Exception as exc:  # yaml's parser errors, a file that is not a mapping
        raise refuse(f"{type(exc).__name__}: {exc}") from None
    if not isinstance(compose, A.Compose):
        raise refuse(f"expected a Compose of transforms, got a {type(compose).__name__}")
    return compose


def load_preset(name: str, size: int | None = None) -> A.Compose:
    """Load a preset; with ``size``, crops/resizes produce ``size``×``size`` images."""
    compose = _load(preset_path(name))
    if size is None:
        return compose
    spec = A.to_dict(compose)
    _resize_spec(spec["transform"], size)
    return A.from_dict(spec)


def _resize_spec(node: dict, size: int) -> None:
    # Inception wants 299 px: the same preset must then crop to 299, not 224
    if "size" in node and isinstance(node["size"], (list, tuple)) and len(node["size"]) == 2:
        node["size"] = [size, size]
    if all(k in node for k in _SIZE_KEYS) and node.get("__class_fullname__") != "Compose":
        node["height"] = node["width"] = size
    for child in node.get("transforms", []) or []:
        _resize_spec(child, size)


def stage_names(compose: A.Compose) -> list[str]:
    """Top-level transform class names, made unique (``Affine``, ``Affine#2``)."""
    names, seen = [], {}
    for t in compose.transforms:
        base = type(t).__name__
        seen[base] = seen.get(base, 0) + 1
        names.append(base if seen[base] == 1 else f"{base}#{seen[base]}")
    return names


def output_dtype(compose: A.Compose) -> str:
    """'uint8' when the preset leaves normalisation to the GPU, else the float dtype it emits."""
    import numpy as np
    import torch

    out = compose(image=np.zeros((375, 500, 3), np.uint8))["image"]
    return str(torch.as_tensor(out).dtype).removeprefix("torch.")
