"""A preset on the GPU (``augment.device: cuda``): nvJPEG decode through ``torchvision.io.decode_jpeg``
and the preset's albumentations transforms as their torchvision.transforms.v2 counterparts.

Workers then only read bytes; the training process decodes a whole batch in one call and augments it
on the step's device. Transforms whose randomness is per sample but whose arithmetic is the same for
every image (flips, colour, noise, normalisation) run on the stacked batch with per-sample parameters;
geometric ones that draw a different region or matrix per image (crops, affine, blur) run per sample
in a Python loop, as the hand-written probe in ANCHORS.md did.

The device is a parameter: the same pipeline runs on CPU tensors (``decode_jpeg`` decodes on the CPU
too), which is how the CPU tests check shapes, dtypes and normalisation.

To map another albumentations transform: write ``fn(params) -> Op`` below and add it to
:data:`TORCHVISION` under albumentations' class name. A preset naming a transform without an entry
is refused before anything runs (:class:`NoCounterpart`, a ConfigError: exit 2).
"""
from __future__ import annotations

import math
from typing import Callable, NamedTuple, Optional

import torch

from pipeprof.config import ConfigError

# albumentations stores OpenCV's interpolation flags; v2 takes its own enum
def _F():
    """torchvision's v2 functional API, imported when a GPU pipeline runs: importing it pulls in
    torch._dynamo (about a second per process), which no CPU pipeline needs."""
    from torchvision.transforms.v2 import functional

    return functional


def _interp(code):
    """albumentations' interpolation code as torchvision's mode (OpenCV's numbering)."""
    from torchvision.transforms.v2 import InterpolationMode as M

    return {0: M.NEAREST, 1: M.BILINEAR, 2: M.BICUBIC, 3: M.BILINEAR, 4: M.BICUBIC}.get(code, M.BILINEAR)


class NoCounterpart(ConfigError):
    """A preset transform that the GPU pipeline cannot run: named, with the ones it can."""


class Op(NamedTuple):
    """One transform of the GPU pipeline. ``one(img, g)`` changes one CHW image; ``batch(x, g)``, when
    given, the stacked batch NCHW at once (per-sample randomness drawn inside)."""

    name: str
    one: Optional[Callable] = None
    batch: Optional[Callable] = None


def _draw(g: torch.Generator, n: int = 1) -> torch.Tensor:
    """n uniform numbers in [0, 1) from the pipeline's host generator (parameters are drawn on the host)."""
    return torch.rand(n, generator=g)


def _between(g: torch.Generator, lo: float, hi: float) -> float:
    return lo + (hi - lo) * float(_draw(g))


def _chosen(x: torch.Tensor, p: float, g: torch.Generator) -> torch.Tensor:
    """A per-sample mask on ``x``'s device: True where a transform of probability ``p`` applies."""
    return (_draw(g, x.shape[0]) < p).to(x.device).view(-1, 1, 1, 1)


# ---- geometry: per sample -------------------------------------------------------------------

def _rrc_box(h: int, w: int, scale, ratio, g: torch.Generator) -> tuple[int, int, int, int]:
    """(top, left, height, width) as torchvision's RandomResizedCrop draws it: 10 tries at a random area
    and log-uniform aspect ratio, else the centre crop at the ratio's nearest bound."""
    area = h * w
    for _ in range(10):
        target = area * _between(g, *scale)
        aspect = math.exp(_between(g, math.log(ratio[0]), math.log(ratio[1])))
        cw, ch = int(round(math.sqrt(target * aspect))), int(round(math.sqrt(target / aspect)))
        if 0 < cw <= w and 0 < ch <= h:
            return int(_draw(g) * (h - ch + 1)), int(_draw(g) * (w - cw + 1)), ch, cw
    in_ratio = w / h
    cw, ch = (w, int(round(w / min(ratio)))) if in_ratio < min(ratio) else \
        ((int(round(h * max(ratio))), h) if in_ratio > max(ratio) else (w, h))
    return (h - ch) // 2, (w - cw) // 2, ch, cw


def random_resized_crop(p: dict) -> Op:
    size, interp = list(p["size"]), _interp(p.get("interpolation", 1))

    def one(img, g):
        top, left, h, w = _rrc_box(img.shape[-2], img.shape[-1], p["scale"], p["ratio"], g)
        return _F().resized_crop(img, top, left, h, w, size, interpolation=interp, antialias=True)
    return Op("RandomResizedCrop", one=one)


def random_crop(p: dict) -> Op:
    h, w = int(p["height"]), int(p["width"])

    def one(img, g):
        ih, iw = img.shape[-2:]
        if p.get("pad_if_needed") and (ih < h or iw < w):  # centred padding with the fill, as albumentations
            dh, dw = max(h - ih, 0), max(w - iw, 0)
            img = _F().pad(img, [dw // 2, dh // 2, dw - dw // 2, dh - dh // 2], fill=p.get("fill", 0))
            ih, iw = img.shape[-2:]
        top, left = int(_draw(g) * (ih - h + 1)), int(_draw(g) * (iw - w + 1))
        return _F().crop(img, top, left, h, w)
    return Op("RandomCrop", one=one)


def center_crop(p: dict) -> Op:
    h, w = int(p["height"]), int(p["width"])

    def one(img, g):  # albumentations floors an odd margin's half; v2's center_crop rounds it
        return _F().crop(img, (img.shape[-2] - h) // 2, (img.shape[-1] - w) // 2, h, w)
    return Op("CenterCrop", one=one)


def resize(p: dict) -> Op:
    size, interp = [int(p["height"]), int(p["width"])], _interp(p.get("interpolation", 1))
    return Op("Resize", one=lambda img, g: _F().resize(img, size, interpolation=interp, antialias=True))


def affine(p: dict) -> Op:
    """Albumentations' Affine (rotate, x/y scale, shear, translate as a share of the side, zero fill) as
    v2's affine with one drawn scale: torchvision scales both axes alike (keep_ratio-like)."""
    def one(img, g):
        h, w = img.shape[-2:]
        move = p.get("translate_percent") or {"x": (0, 0), "y": (0, 0)}
        tx, ty = (_between(g, *move[k]) for k in ("x", "y"))
        scale = _between(g, *p["scale"]["x"])
        shear = [_between(g, *p["shear"]["x"]), _between(g, *p["shear"]["y"])]
        return _F().affine(img, angle=_between(g, *p["rotate"]), translate=[round(tx * w), round(ty * h)],
                        scale=scale, shear=shear, interpolation=_interp(p.get("interpolation", 1)),
                        fill=p.get("fill", 0))
    return Op("Affine", one=_sometimes(one, p["p"]))


def gaussian_blur(p: dict) -> Op:
    lo, hi = (int(k) for k in p["blur_limit"])
    odd = [k for k in range(max(lo, 3), hi + 1) if k % 2] or [3]

    def one(img, g):
        k = odd[min(int(_draw(g) * len(odd)), len(odd) - 1)]
        sigma = _between(g, *p["sigma_limit"])
        return _F().gaussian_blur(img, [k, k], [sigma, sigma])
    return Op("GaussianBlur", one=_sometimes(one, p["p"]))


def _sometimes(fn: Callable, prob: float) -> Callable:
    """``fn`` with probability ``prob`` per sample, else the image unchanged (albumentations' ``p``)."""
    return lambda img, g: fn(img, g) if float(_draw(g)) < prob else img


# ---- pixels: on the stacked batch, per-sample parameters ------------------------------------

def horizontal_flip(p: dict) -> Op:
    return Op("HorizontalFlip", batch=lambda x, g: torch.where(_chosen(x, p["p"], g), x.flip(-1), x))


def vertical_flip(p: dict) -> Op:
    return Op("VerticalFlip", batch=lambda x, g: torch.where(_chosen(x, p["p"], g), x.flip(-2), x))


def _factors(x: torch.Tensor, bounds, g: torch.Generator, centre: float = 1.0) -> torch.Tensor:
    lo, hi = bounds
    return (lo + (hi - lo) * _draw(g, x.shape[0])).to(x.device).view(-1, 1, 1, 1) if (lo, hi) != (centre, centre) \
        else None


def _blend(a: torch.Tensor, b: torch.Tensor, ratio: torch.Tensor) -> torch.Tensor:
    """torchvision's blend (ratio * a + (1 - ratio) * b, clamped to [0, 1]) with a ratio per sample."""
    return (ratio * a + (1 - ratio) * b).clamp_(0, 1)


def color_jitter(p: dict) -> Op:
    """Brightness, contrast, saturation and hue factors drawn per sample, applied in that order to the
    whole batch at once (albumentations shuffles the order per call; the cost is the same)."""
    def batch(x, g):
        y = x.float() / 255 if x.dtype == torch.uint8 else x.clone()
        if (b := _factors(y, p["brightness"], g)) is not None:
            y = _blend(y, torch.zeros_like(y), b)
        if (c := _factors(y, p["contrast"], g)) is not None:
            y = _blend(y, _F().rgb_to_grayscale(y).mean(dim=(-3, -2, -1), keepdim=True), c)
        if (s := _factors(y, p["saturation"], g)) is not None:
            y = _blend(y, _F().rgb_to_grayscale(y), s)
        if (h := _factors(y, p["hue"], g, centre=0.0)) is not None:
            y = _shift_hue(y, h.view(-1, 1, 1))
        y = torch.where(_chosen(x, p["p"], g), y, x.float() / 255 if x.dtype == torch.uint8 else x)
        return (y * 255).round_().to(torch.uint8) if x.dtype == torch.uint8 else y
    return Op("ColorJitter", batch=batch)


def _shift_hue(y: torch.Tensor, shift: torch.Tensor) -> torch.Tensor:
    """Hue rotated by ``shift`` (a share of the circle) per sample, through torchvision's own HSV
    conversion, which takes a batch."""
    from torchvision.transforms.v2.functional._color import _hsv_to_rgb, _rgb_to_hsv

    hsv = _rgb_to_hsv(y)
    hue = (hsv[:, 0] + shift) % 1.0
    return _hsv_to_rgb(torch.stack([hue, hsv[:, 1], hsv[:, 2]], dim=1))


def gauss_noise(p: dict) -> Op:
    """Zero-mean noise whose standard deviation (a share of the pixel range) is drawn per sample."""
    def batch(x, g):
        lo, hi = p["std_range"]
        std = (lo + (hi - lo) * _draw(g, x.shape[0])).to(x.device).view(-1, 1, 1, 1)
        std = std * (255 if x.dtype == torch.uint8 else 1)
        noisy = x.float() + torch.randn(x.shape, device=x.device) * std
        noisy = noisy.clamp_(0, 255).round_().to(torch.uint8) if x.dtype == torch.uint8 else noisy
        return torch.where(_chosen(x, p["p"], g), noisy, x)
    return Op("GaussNoise", batch=batch)


def normalize(p: dict) -> Op:
    if p.get("normalization", "standard") != "standard":
        raise NoCounterpart(f"augment.device: cuda: Normalize with normalization={p['normalization']!r} has no "
                            "counterpart here (only 'standard': (x / max_pixel_value - mean) / std)")
    scale, mean, std = float(p.get("max_pixel_value", 255.0)), list(p["mean"]), list(p["std"])
    return Op("Normalize", batch=lambda x, g: _F().normalize(x.float() / scale, mean, std))


def to_tensor(p: dict) -> Op:
    return Op("ToTensorV2")  # decode_jpeg already gives CHW tensors


#: albumentations class name -> builder of its GPU counterpart from the transform's stored parameters
TORCHVISION: dict[str, Callable[[dict], Op]] = {
    "RandomResizedCrop": random_resized_crop, "RandomCrop": random_crop, "CenterCrop": center_crop,
    "Resize": resize, "Affine": affine, "GaussianBlur": gaussian_blur, "HorizontalFlip": horizontal_flip,
    "VerticalFlip": vertical_flip, "ColorJitter": color_jitter, "GaussNoise": gauss_noise, "Normalize": normalize,
    "ToTensorV2": to_tensor,
}


def ops_of(transforms: list[dict], preset: str = "the preset") -> list[Op]:
    """The GPU ops of albumentations' serialised transforms (``A.to_dict(compose)["transform"]
    ["transforms"]``); NoCounterpart naming the first one without a mapping and the ones there are."""
    ops = []
    for t in transforms:
        name = t.get("__class_fullname__", "?").rsplit(".", 1)[-1]
        if name not in TORCHVISION:
            raise NoCounterpart(f"augment.device: cuda: {preset} uses {name}, which has no torchvision counterpart in "
                                f"pipeprof's table (mapped: {', '.join(TORCHVISION)}); run this preset with "
                                "augment.device: cpu, or map the transform in pipeprof/data/gpu_augment.py")
        ops.append(TORCHVISION[name]({"p": 1.0} | t))
    return ops


class GpuPipeline:
    """Decode a batch of JPEG bytes and augment it on ``device``: ``pipe(list of uint8 byte tensors)`` ->
    NCHW tensor (float32 when the preset normalises, else uint8, as the CPU pipeline hands the step)."""

    def __init__(self, transforms: list[dict], device: str | torch.device = "cuda", seed: int = 0,
                 preset: str = "the preset"):
        self.ops = ops_of(transforms, preset)
        self.device = torch.device(device)
        self.g = torch.Generator().manual_seed(seed)

    def decode(self, encoded: list[torch.Tensor]) -> list[torch.Tensor]:
        """One call for the whole batch (nvJPEG on CUDA); RGB whatever the JPEG holds (grey, CMYK)."""
        from torchvision.io import ImageReadMode, decode_jpeg

        return decode_jpeg(list(encoded), mode=ImageReadMode.RGB, device=self.device)

    def augment(self, images: list[torch.Tensor]) -> torch.Tensor:
        """The ops in the preset's order: per sample while the images are a list, on the stacked batch
        once every image has the same shape (stacked at the first op that takes a batch)."""
        x: list | torch.Tensor = images
        for op in self.ops:
            if op.batch is not None:
                x = op.batch(self._stacked(x), self.g)
            elif op.one is not None:
                x = [op.one(img, self.g) for img in x]
        return self._stacked(x)

    @staticmethod
    def _stacked(x) -> torch.Tensor:
        if isinstance(x, torch.Tensor):
            return x
        shapes = {tuple(img.shape) for img in x}
        if len(shapes) > 1:
            raise ValueError(f"the preset leaves images of {len(shapes)} sizes where a batch is needed "
                             f"({sorted(shapes)[:3]}...): put a crop or resize to one size first")
        return torch.stack(x)

    def __call__(self, encoded: list[torch.Tensor]) -> torch.Tensor:
        return self.augment(self.decode(encoded))


def for_preset(preset: str, size: Optional[int], device: str | torch.device, seed: int = 0) -> GpuPipeline:
    """The GPU pipeline of a preset (name or YAML path), cropping to ``size`` like ``augment.load_preset``."""
    from .augment import A, load_preset

    transforms = A.to_dict(load_preset(preset, size))["transform"]["transforms"]
    return GpuPipeline(transforms, device, seed, preset=f"preset {preset!r}")
