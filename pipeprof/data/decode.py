"""JPEG (or any image) bytes → RGB ``uint8`` HWC arrays, with Pillow or OpenCV.

Both return 8-bit RGB, whatever the file holds (16-bit, grey, CMYK, palette, alpha), so the
same albumentations pipeline follows either; OpenCV's BGR→RGB conversion is counted as part
of its decode because a pipeline needs it. Alpha is dropped, not composited, by both.
"""

from __future__ import annotations

import io
import re

import numpy as np

DECODERS = ("pil", "cv2")


class DecodeError(ValueError):
    """The bytes of one sample are not a readable image."""


# Pillow's modes for more than 8 bits per grey pixel ('I': 32-bit, what older Pillow gives a 16-bit PNG)
_WIDE_GREY = ("I;16", "I;16B", "I;16L", "I;16N", "I")


def _rgb8(img) -> np.ndarray:
    if img.mode in _WIDE_GREY:
        # convert("RGB") clips these at 255 (a 16-bit image comes out almost white); keep the high
        # byte instead, as OpenCV's IMREAD_COLOR does, so both decoders agree
        grey = (np.clip(np.asarray(img, dtype=np.int64), 0, 65535) >> 8).astype(np.uint8)
        return np.repeat(grey[:, :, None], 3, axis=2)
    return np.asarray(img.convert("RGB"))


def decode_pil(data: bytes) -> np.ndarray:
    from PIL import Image

    try:
        with Image.open(io.BytesIO(data)) as img:
            return _rgb8(img)
    except Exception as exc:  # Pillow raises several types for corrupt data
        # its message names the in-memory buffer ('<_io.BytesIO object at 0x…>'): the caller names the file
        why = re.sub(r" ?<_io\.BytesIO object at 0x[0-9a-fA-F]+>", "", str(exc))
        raise DecodeError(f"Pillow cannot decode {len(data)} bytes: {why}") from exc


def decode_cv2(data: bytes) -> np.ndarray:
    import cv2

    try:
        img = cv2.imdecode(np.frombuffer(data, np.uint8), cv2.IMREAD_COLOR)
    except cv2.error as exc:  # OpenCV 5 raises on an empty buffer where 4.x returned None: a bad sample either way
        raise DecodeError(f"OpenCV cannot decode {len(data)} bytes: {str(exc).strip().splitlines()[-1]}") from exc
    if img is None:
        raise DecodeError(f"OpenCV cannot decode {len(data)} bytes")
    return cv2.cvtColor(img, cv2.COLOR_BGR2RGB)


def get_decoder(name: str):
    """Return the decode function called ``name`` (one of DECODERS)."""
    table = {"pil": decode_pil, "cv2": decode_cv2}
    if name not in table:
        raise ValueError(f"unknown decoder {name!r}; allowed: {', '.join(DECODERS)}")
    return table[name]
