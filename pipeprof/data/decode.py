"""JPEG (or any image) bytes → RGB ``uint8`` HWC arrays, with Pillow or OpenCV.

Both return RGB so the same albumentations pipeline follows either; OpenCV's
BGR→RGB conversion is counted as part of its decode because a pipeline needs it.
"""
from __future__ import annotations

import io

import numpy as np

DECODERS = ("pil", "cv2")


class DecodeError(ValueError):
    """The bytes of one sample are not a readable image."""


def decode_pil(data: bytes) -> np.ndarray:
    from PIL import Image

    try:
        with Image.open(io.BytesIO(data)) as img:
            return np.asarray(img.convert("RGB"))
    except Exception as exc:  # Pillow raises several types for corrupt data
        raise DecodeError(f"Pillow cannot decode {len(data)} bytes: {exc}") from exc


def decode_cv2(data: bytes) -> np.ndarray:
    import cv2

    img = cv2.imdecode(np.frombuffer(data, np.uint8), cv2.IMREAD_COLOR)
    if img is None:
        raise DecodeError(f"OpenCV cannot decode {len(data)} bytes")
    return cv2.cvtColor(img, cv2.COLOR_BGR2RGB)


def get_decoder(name: str):
    """Return the decode function called ``name`` (one of DECODERS)."""
    table = {"pil": decode_pil, "cv2": decode_cv2}
    if name not in table:
        raise ValueError(f"unknown decoder {name!r}; allowed: {', '.join(DECODERS)}")
    return table[name]
