"""Model zoo by name: torchvision's, timm's (``timm:NAME``), or an import path.

Models are built with random weights: nothing is downloaded, and the speed of a
step does not depend on the weights' values. To add a torchvision model, add its
name and native input size to ``TORCHVISION``; any ``package.module:function``
returning an ``nn.Module`` works without registration.
"""

from __future__ import annotations

import importlib
from typing import Callable

# name -> native input side in pixels (the augmentation crop is set to it)
TORCHVISION: dict[str, int] = {
    "resnet18": 224,
    "resnet34": 224,
    "resnet50": 224,
    "resnet101": 224,
    "efficientnet_b0": 224,
    "vgg16": 224,
    "alexnet": 224,
    "googlenet": 224,
    "inception_v3": 299,
    "mobilenet_v3_large": 224,
    "mobilenet_v3_small": 224,
    "convnext_tiny": 224,
    "vit_b_16": 224,
}
TIMM_PREFIX = "timm:"
USER_PREFIX = "user:"  # an nn.Module handed to profile(): built from the object, not imported


def is_import_path(name: str) -> bool:
    """True for ``package.module:function`` (not a ``timm:`` or ``user:`` name)."""
    return ":" in name and not name.startswith((TIMM_PREFIX, USER_PREFIX))


def is_known(name: str) -> bool:
    """True for a registered torchvision name, a ``timm:`` name or an import path."""
    return name in TORCHVISION or name.startswith(TIMM_PREFIX) or ":" in name


def input_size(name: str) -> int:
    """Native square input side of the model, in pixels (224 unless known otherwise)."""
    if name.startswith(TIMM_PREFIX):
        return _timm_input_size(name[len(TIMM_PREFIX) :])
    return TORCHVISION.get(name, 224)


def build(name: str, num_classes: int = 1000):
    """Return a freshly initialised ``nn.Module`` for ``name``."""
    if name.startswith(TIMM_PREFIX):
        import timm

        return timm.create_model(name[len(TIMM_PREFIX) :], pretrained=False, num_classes=num_classes)
    if name in TORCHVISION:
        import torchvision.models as tvm

        kwargs = {"weights": None, "num_classes": num_classes}
        if name in ("googlenet", "inception_v3"):
            # their default weight init runs scipy's truncnorm for minutes; speed does not care
            kwargs["init_weights"] = False
        return getattr(tvm, name)(**kwargs)
    return load_callable(name)()


def load_callable(path: str) -> Callable:
    """Import ``package.module:attribute`` and return the attribute (ValueError when it does not import
    or is not callable). Importing runs the module's code: config import paths name the user's own code."""
    module_name, _, attr = path.partition(":")
    if not module_name or not attr:
        raise ValueError(f"expected 'package.module:function', got {path!r}")
    try:
        found = getattr(importlib.import_module(module_name), attr)
    except Exception as exc:  # ImportError, AttributeError, or whatever the module raises on import
        raise ValueError(f"cannot import {path!r}: {type(exc).__name__}: {exc}") from exc
    if not callable(found):
        raise ValueError(f"{path!r} is a {type(found).__name__}, not a function or class")
    return found


def _timm_input_size(name: str) -> int:
    try:
        import timm

        cfg = timm.get_pretrained_cfg(name)
        return int(cfg.input_size[-1]) if cfg and cfg.input_size else 224
    except Exception:  # timm absent or name unknown: build() will say so
        return 224
