"""The GPU path on a user's own Dataset (``watch --tune``'s ``gpu_pipeline``): its workers read the files'
bytes only, handed over packed as one uint8 tensor a batch (:func:`collate_bytes`), and the training process
decodes them (nvJPEG) and runs the dataset's transform on the GPU by ``data.gpu_augment.GpuPipeline``, its steps
mapped to that pipeline's table (:data:`TO_TABLE`, :func:`gpu_transforms`).

The dataset is read by ``data.user_pipeline`` (its transform, its files); this module only adds the mapping, the
bytes' dataset and the step on the device, and returns a ``user_pipeline.UserVariant``.

To map another torchvision transform to the GPU: a function ``fn(t) -> dict`` (albumentations' stored form of
the counterpart ``gpu_augment.TORCHVISION`` knows) in :data:`TO_TABLE` under the class name.
"""

from __future__ import annotations

from typing import Any, Callable, Optional

import torch

from .gpu_augment import channels
from .user_pipeline import (
    CONVERSIONS,
    JPEG,
    Files,
    UserVariant,
    conversion_scale,
    family,
    files_of,
    said,
    step_name,
    steps_of,
    subset_aware,
    transform_of,
)

# ---- the transform's steps in the GPU pipeline's table ------------------------------------------


def _size(size) -> list[int]:
    return [int(size), int(size)] if isinstance(size, int) else [int(s) for s in (list(size) * 2)[:2]]


def _interp(t) -> int:
    return _code(getattr(t, "interpolation", "bilinear"))


def _code(mode) -> int:
    """An interpolation mode (InterpolationMode.BILINEAR / 'bilinear') as the table's code (OpenCV's numbering)."""
    if isinstance(mode, int) and mode in (0, 2, 3):  # PIL's Image.NEAREST, BILINEAR, BICUBIC
        return {0: 0, 2: 1, 3: 2}[mode]
    mode = str(mode).lower()
    for code, name in INTERPOLATIONS.items():
        if name in mode:
            return code
    # lanczos, box, hamming: the GPU's resize has none of them, and a silent bilinear would time another pipeline
    raise LookupError(f"interpolation {mode.rsplit('.', 1)[-1]} has no GPU counterpart (nearest, bilinear, bicubic)")


INTERPOLATIONS = {0: "nearest", 1: "bilinear", 2: "bicubic"}


def _bounds(v, centre: float = 1.0) -> list[float]:
    if v is None:
        return [centre, centre]
    return [float(v[0]), float(v[1])] if isinstance(v, (list, tuple)) else [centre - float(v), centre + float(v)]


def _rrc(t) -> dict:
    """torchvision's RandomResizedCrop, or timm's RandomResizedCropAndInterpolation (the same crop drawn the same
    way, its interpolation one mode or, with ``interpolation='random'``, one of several drawn per image: then
    :func:`_drawn`'s one for every image)."""
    drawn = _drawn(t)
    return {
        "__class_fullname__": "RandomResizedCrop",
        "size": _size(t.size),
        "scale": list(t.scale),
        "ratio": list(t.ratio),
        "interpolation": drawn[0] if drawn else _interp(t),
    }


def _drawn(t) -> Optional[tuple[int, str]]:
    """(the code, the words) where a crop draws its interpolation per image (timm's ``interpolation='random'``:
    bilinear or bicubic): the GPU's crop resizes the whole batch in one mode, bilinear where it is among those
    drawn (the one the batched crop runs; any other runs image by image), else the first; None for one mode."""
    modes = getattr(t, "interpolation", None)
    if not isinstance(modes, (list, tuple)) or not modes:
        return None
    codes = [_code(m) for m in modes]
    code = 1 if 1 in codes else codes[0]
    names = " or ".join(INTERPOLATIONS[c] for c in codes)
    return code, (
        f"interpolation='random' (each image's drawn: {names}) -> {INTERPOLATIONS[code]} for every image"
        + (" (the one the GPU's crop runs on the whole batch)" if code == 1 else "")
    )


def _center(t) -> dict:
    h, w = _size(t.size)
    return {"__class_fullname__": "CenterCrop", "height": h, "width": w}


def _resize(t) -> dict:
    size = t.size if isinstance(t.size, (list, tuple)) else [t.size]
    if len(size) == 1:  # the shorter side to that size, torchvision's rounding of the longer
        if getattr(t, "max_size", None) is not None:
            raise LookupError(f"Resize with max_size={t.max_size} (the longer side capped) has no GPU counterpart")
        return {
            "__class_fullname__": "SmallestMaxSize",
            "max_size": int(size[0]),
            "interpolation": _interp(t),
            "long_side": "floor",
        }
    return {"__class_fullname__": "Resize", "height": int(size[0]), "width": int(size[1]), "interpolation": _interp(t)}


def _crop(t) -> dict:
    """torchvision's RandomCrop without padding (with it, torchvision pads each side by the shortfall, not the
    table's centred padding)."""
    if getattr(t, "padding", None) or getattr(t, "pad_if_needed", False):
        raise LookupError("RandomCrop with padding or pad_if_needed has no GPU counterpart (only the plain crop maps)")
    h, w = _size(t.size)
    return {"__class_fullname__": "RandomCrop", "height": h, "width": w}


def _jitter(t) -> dict:
    return {
        "__class_fullname__": "ColorJitter",
        "brightness": _bounds(t.brightness),
        "contrast": _bounds(t.contrast),
        "saturation": _bounds(t.saturation),
        "hue": _bounds(t.hue, 0.0),
    }


#: torchvision class name -> its counterpart in the GPU pipeline's table (albumentations' stored form); the
#: conversions (ToTensor, ToImage, ToDtype, PILToTensor) and Normalize are read by :func:`gpu_transforms`
TO_TABLE: dict[str, Callable[[Any], dict]] = {
    "RandomResizedCrop": _rrc,
    "RandomResizedCropAndInterpolation": _rrc,  # timm's (``timm.data.create_transform``'s training crop)
    "RandomHorizontalFlip": lambda t: {"__class_fullname__": "HorizontalFlip", "p": float(t.p)},
    "RandomVerticalFlip": lambda t: {"__class_fullname__": "VerticalFlip", "p": float(t.p)},
    "CenterCrop": _center,
    "RandomCrop": _crop,
    "Resize": _resize,
    "ColorJitter": _jitter,
}


MAPPED = [*TO_TABLE, "Normalize", *CONVERSIONS]


def gpu_transforms(transform) -> tuple[Optional[list[dict]], str]:
    """(the GPU pipeline's transforms, the mapping in words) or (None, why not)."""
    fam = family(transform)
    if fam == "albumentations":
        import albumentations as A

        stored = A.to_dict(transform)["transform"]["transforms"]
        from .gpu_augment import TORCHVISION

        missing = [t["__class_fullname__"].rsplit(".", 1)[-1] for t in stored]
        missing = [n for n in missing if n not in TORCHVISION]
        if missing:
            return None, f"transform `{missing[0]}` has no GPU counterpart (mapped: {', '.join(TORCHVISION)})"
        return stored, " -> ".join(t["__class_fullname__"].rsplit(".", 1)[-1] for t in stored) + " (same names)"
    if fam != "torchvision":
        return None, "the dataset's transform is not a torchvision or albumentations Compose"
    out, words, scale = [], [], 1.0
    for t in steps_of(transform):
        name = step_name(t)
        if name in CONVERSIONS:
            before, scale = scale, conversion_scale(t, scale)
            what = "(decoded as uint8 CHW)" if scale == before else "(its scale in Normalize)"
            words.append(f"{said(t)} -> {what}")
        elif name == "Normalize":
            out.append(
                {
                    "__class_fullname__": "Normalize",
                    "mean": channels(t.mean),
                    "std": channels(t.std),
                    "max_pixel_value": scale,
                }
            )
            words.append("Normalize -> Normalize")
            scale = None  # normalised: nothing left to scale
        elif name in TO_TABLE:
            try:
                out.append(TO_TABLE[name](t))
            except LookupError as exc:
                return None, f"transform `{name}`: {exc}"
            drawn = _drawn(t)
            words.append(f"{name} -> {out[-1]['__class_fullname__']}" + (f", {drawn[1]}" if drawn else ""))
        else:
            return (
                None,
                f"transform `{name}` has no GPU counterpart (mapped: {', '.join(MAPPED)})",
            )
    if scale not in (None, 1.0):  # ToTensor without Normalize: floats in [0, 1]
        out.append({"__class_fullname__": "Normalize", "mean": [0.0] * 3, "std": [1.0] * 3, "max_pixel_value": scale})
    return out, "; ".join(words)


# ---- the bytes' hand-off and the step on the device ---------------------------------------------


class FileBytes(torch.utils.data.Dataset):
    """The files of a DatasetFolder's ``samples`` as raw bytes (uint8 tensors) and their targets."""

    def __init__(self, samples: list, target_transform=None):
        self.samples, self.target_transform = samples, target_transform

    def __len__(self) -> int:
        return len(self.samples)

    def __getitem__(self, i):
        path, target = self.samples[i]
        with open(path, "rb") as f:
            data = torch.frombuffer(bytearray(f.read()), dtype=torch.uint8)
        return data, self.target_transform(target) if self.target_transform is not None else target


def collate_bytes(batch: list) -> tuple[dict, torch.Tensor]:
    """A batch of (bytes, target) as (``data.encoded.packed``: the bytes as one tensor, the targets stacked): a
    worker hands each tensor over through a shared-memory segment and a file descriptor of its own, and the
    pin-memory thread pins each, so a list of them cost more than decoding the batch on the GPU."""
    from .encoded import packed

    return packed([b for b, _ in batch]), torch.as_tensor([t for _, t in batch])


@subset_aware
def gpu_pipeline(dataset, seed: int = 0, files: Optional[Files] = None) -> UserVariant:
    files, why = (files, None) if files is not None else files_of(dataset)
    if files is None:
        raise ValueError(why)
    if not all(str(p).endswith(JPEG) for p, _ in files.samples[:64]):
        raise ValueError("its files are not all JPEGs (the GPU decoder reads JPEG)")
    if files.form == "bgr":
        raise ValueError(
            "its transform is handed BGR images (OpenCV's order, not converted to RGB): the GPU decoder gives RGB"
        )
    transforms, words = gpu_transforms(transform_of(dataset))
    if transforms is None:
        raise ValueError(words)
    from .encoded import unpacked
    from .gpu_augment import GpuPipeline

    pipes: dict = {}

    def on_device(packed: dict, device) -> torch.Tensor:
        key = str(device)
        if key not in pipes:
            pipes[key] = GpuPipeline(transforms, device, seed, preset="the dataset's transform")
        return pipes[key](unpacked(packed))

    target_transform = getattr(dataset, "target_transform", None) if files.folder else None  # else: as returned
    return UserVariant(FileBytes(files.samples, target_transform), collate_bytes, on_device, transforms)
