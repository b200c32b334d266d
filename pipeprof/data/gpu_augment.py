"""A preset on the GPU (``augment.device: cuda``): nvJPEG decode through ``torchvision.io.decode_jpeg``
and the preset's albumentations transforms as their torchvision.transforms.v2 counterparts.

Workers then only read bytes; the training process decodes a whole batch in one call and augments it
on the step's device, every transform on the whole batch in a few kernel launches, its random parameters
drawn per sample on the host. Flips, colour, noise and normalisation run on the stacked batch. The
geometric ones draw a region, matrix or kernel per image and apply them all at once: RandomResizedCrop
(and Resize of images of several sizes) as one ``roi_align`` over the batch padded to its largest image
(an antialiased bilinear resize of each box; on CUDA the same arithmetic as one Triton kernel that reads the
images where they lie, ``gpu_kernels``), RandomCrop and CenterCrop as one gather, Affine as one
``affine_grid`` + ``grid_sample``, GaussianBlur as one grouped convolution per direction. Each also keeps
its per-sample form (``Op.one``, torchvision's own functional call), the reference the CPU tests compare
the batch forms against and what runs where a batch form cannot: Affine and GaussianBlur on images of
several sizes, a RandomResizedCrop or Resize that is not bilinear. ``GpuPipeline(batched=False)`` runs
the per-sample forms throughout (the benchmark's baseline: ``pipeprof bench gpu-augment``).

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
from pipeprof.schema import DEFAULT_GPU_DECODER


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
    """One transform of the GPU pipeline. ``one(img, g)`` changes one CHW image (the reference form);
    ``batch(x, g)``, when given, the stacked batch NCHW at once, per-sample randomness drawn inside: the same
    draws as ``one`` on each image in turn. ``ragged``: ``batch`` also takes a list of images of several
    sizes (crops and resizes, which leave one size)."""

    name: str
    one: Optional[Callable] = None
    batch: Optional[Callable] = None
    ragged: bool = False


def _draw(g: torch.Generator, n: int = 1) -> torch.Tensor:
    """n uniform numbers in [0, 1) from the pipeline's host generator (parameters are drawn on the host)."""
    return torch.rand(n, generator=g)


def _to(t: torch.Tensor, device) -> torch.Tensor:
    """Host parameters to the images' device without waiting for its queue (a blocking copy syncs the stream)."""
    return t.to(device, non_blocking=True)


def _fill(fill, like: torch.Tensor):
    """A fill value for ``like``'s pixels: a number as it is, one per channel as a (1, C, 1, 1) tensor on its device."""
    if isinstance(fill, (int, float)):  # an integer for integer pixels, or torch.where would promote them to float
        return fill if like.dtype.is_floating_point else int(fill)
    return _to(torch.tensor(list(fill), dtype=like.dtype).view(1, -1, 1, 1), like.device)


def _chosen(x: torch.Tensor, p: float, g: torch.Generator) -> torch.Tensor:
    """A per-sample mask on ``x``'s device: True where a transform of probability ``p`` applies."""
    return _to(_draw(g, x.shape[0]) < p, x.device).view(-1, 1, 1, 1)


# ---- geometry: parameters drawn per sample, applied per sample (one) or to the batch (batch) ----


def _uniforms(g: torch.Generator, n: int, k: int) -> torch.Tensor:
    """n rows of k uniforms in [0, 1) (float32 draws, as float64). A batch's draw is its samples' draws one
    after another (the CPU generator fills a tensor in order), so ``one`` on each image in turn and ``batch``
    on the whole batch draw the same parameters from the same seed."""
    return torch.rand(n * k, generator=g).view(n, k).double()


def _sizes(x) -> torch.Tensor:
    """(n, 2) heights and widths (int64, host) of a stacked batch or a list of CHW images."""
    if isinstance(x, torch.Tensor):
        return torch.tensor([list(x.shape[-2:])], dtype=torch.long).expand(x.shape[0], 2)
    return torch.tensor([list(img.shape[-2:]) for img in x], dtype=torch.long).view(-1, 2)


def _same_shape(x) -> bool:
    return isinstance(x, torch.Tensor) or len({tuple(img.shape) for img in x}) <= 1


class _Flat(NamedTuple):
    """Images of any sizes and memory orders as one flat tensor: image i's pixel (c, y, x) is
    ``flat[base[i] + c * stride[i, 0] + y * stride[i, 1] + x * stride[i, 2]]`` (all on the images' device)."""

    flat: torch.Tensor
    base: torch.Tensor
    stride: torch.Tensor


def _flat(images) -> _Flat:
    """One copy of the images' bytes (a stacked batch: none), each image in its own memory order (decode_jpeg
    may hand HWC memory as a CHW view). Contiguous images (nvJPEG's) take no per-image call beyond their view:
    the loop is the producer thread's host time, which the training thread waits for on the GIL."""
    if isinstance(images, torch.Tensor):
        x = images.contiguous()
        stride = _to(torch.tensor([list(x.stride()[1:])]), x.device).expand(x.shape[0], 3)
        return _Flat(x.view(-1), torch.arange(x.shape[0], device=x.device) * x.stride(0), stride)
    device = images[0].device
    if all(img.is_contiguous() for img in images):
        shapes = torch.tensor([img.shape for img in images], dtype=torch.long).view(-1, 3)
        lengths = shapes.prod(1)
        strides = torch.stack([shapes[:, 1] * shapes[:, 2], shapes[:, 2], torch.ones_like(lengths)], 1)
        flat = torch.cat([img.view(-1) for img in images])
        return _Flat(flat, _to(lengths.cumsum(0) - lengths, device), _to(strides, device))
    pieces, strides = [], []
    for img in images:  # the CPU decoder's images are HWC memory
        dense = img if img.is_contiguous() else img.permute(sorted(range(3), key=lambda d: -img.stride(d)))
        if not dense.is_contiguous():
            img = dense = img.contiguous()
        pieces.append(dense.reshape(-1))
        strides.append(list(img.stride()))
    lengths = torch.tensor([p.numel() for p in pieces])
    return _Flat(torch.cat(pieces), _to(lengths.cumsum(0) - lengths, device), _to(torch.tensor(strides), device))


def _take(
    f: _Flat, sizes: torch.Tensor, rows: torch.Tensor, cols: torch.Tensor, channels: int, fill: Optional[float] = None
) -> torch.Tensor:
    """(n, C, rows, cols): each image's pixels at its ``rows`` x ``cols`` (host int64, one row each) in one
    gather; coordinates outside an image clamp to its edge (``fill`` None: the edge repeated) or read ``fill``."""
    dev, n = f.flat.device, rows.shape[0]
    hw, rows, cols = _to(sizes, dev), _to(rows, dev), _to(cols, dev)
    ys = torch.minimum(rows.clamp(min=0), hw[:, :1] - 1) * f.stride[:, 1:2]
    xs = torch.minimum(cols.clamp(min=0), hw[:, 1:] - 1) * f.stride[:, 2:]
    cs = torch.arange(channels, device=dev).view(1, -1) * f.stride[:, :1]
    idx = (f.base.view(n, 1) + cs).view(n, -1, 1, 1) + ys.view(n, 1, -1, 1) + xs.view(n, 1, 1, -1)
    out = torch.take(f.flat, idx)
    if fill is None:
        return out
    inside = ((rows >= 0) & (rows < hw[:, :1])).view(n, 1, -1, 1) & ((cols >= 0) & (cols < hw[:, 1:])).view(n, 1, 1, -1)
    return torch.where(inside, out, _fill(fill, out))


def crops(images, tops: torch.Tensor, lefts: torch.Tensor, h: int, w: int, fill: float = 0) -> torch.Tensor:
    """Each image's ``h`` x ``w`` window at (tops[i], lefts[i]) (host int64; negative or past the edge reads
    ``fill``, as torchvision's crop pads with zeros), in one gather for the whole batch."""
    rows, cols = tops.view(-1, 1) + torch.arange(h), lefts.view(-1, 1) + torch.arange(w)
    return _take(_flat(images), _sizes(images), rows, cols, images[0].shape[-3], fill)


#: elements of the float copy that one roi_align call pads to (about 256 MiB): a batch of ImageNet-sized photos
#: goes in 2-3 calls, and one outsize image does not pad the whole batch to its size
PAD_BUDGET = 1 << 26


def _groups(sizes: torch.Tensor, channels: int, budget: int) -> list[torch.Tensor]:
    """Indices of the images, largest first, in groups whose padded copy (count x tallest x widest x channels)
    stays within ``budget`` elements (an image alone over it makes a group of its own). Plain Python numbers in
    the loop: a tensor read per image adds up to the producer's host time, which the training thread waits for."""
    hw = sizes.tolist()
    groups, group, top = [], [], (0, 0)
    for i in (sizes[:, 0] * sizes[:, 1]).argsort(descending=True, stable=True).tolist():
        h, w = hw[i]
        grown = (max(top[0], h), max(top[1], w))
        if group and (len(group) + 1) * grown[0] * grown[1] * channels > budget:
            groups.append(group)
            group, grown = [], (h, w)
        group, top = group + [i], grown
    return [torch.tensor(g) for g in groups + [group]]


def _padded(images, idx: torch.Tensor, sizes: torch.Tensor) -> torch.Tensor:
    """The images ``idx`` in one NCHW tensor of their largest height and width, each image's last row and column
    repeated into the padding: roi_align's bilinear samples reach half a pixel past a box that ends at the image's
    edge, and must see the edge there, as they do at a tensor's own edge."""
    if isinstance(images, torch.Tensor):
        return images if len(idx) == len(images) else images[_to(idx, images.device)]
    picked = [images[i] for i in idx.tolist()]
    if _same_shape(picked):
        return torch.stack(picked)
    tall, wide = sizes[idx].max(0).values.tolist()
    rows, cols = torch.arange(tall).expand(len(idx), -1), torch.arange(wide).expand(len(idx), -1)
    return _take(_flat(picked), sizes[idx], rows, cols, picked[0].shape[-3])


def resized_crops(
    images, boxes: torch.Tensor, size, budget: int = PAD_BUDGET, kernel: Optional[bool] = None
) -> torch.Tensor:
    """Each image's box (top, left, height, width; host int64) resized to ``size``, bilinear, by
    ``torchvision.ops.roi_align`` over a padded batch (one call per :func:`_groups` group). Its adaptive sampling
    (``sampling_ratio=-1``) averages ceil(box / out) bilinear samples per output pixel along each axis: an
    antialiased (box-filtered) downscale, where torchvision's resize uses a triangle filter; upscaling is plain
    bilinear with half-pixel centres in both. The outer row and column differ a little more: roi_align reads the
    image half a pixel past a box inside it, where the per-sample form crops first and stops at the box's edge.
    uint8 in, uint8 out (rounded), as the per-sample resized_crop. On CUDA with Triton the same arithmetic runs as one
    kernel reading the images where they lie (``gpu_kernels``), without the padded copy; ``kernel`` False keeps
    roi_align there (the benchmark's comparison), None takes the kernel where it runs."""
    from torchvision.ops import roi_align

    from . import gpu_kernels  # imports Triton: only where a batch is resized

    sizes, first = _sizes(images), images[0]
    if kernel is not False and gpu_kernels.usable(first.device):  # the same arithmetic in one kernel, no padded copy
        out = gpu_kernels.resized_crops(_flat(images), sizes, boxes, size, first.shape[-3])
        if out is not None:
            return out
    out = torch.empty((len(sizes), first.shape[-3], *size), dtype=first.dtype, device=first.device)
    for group in _groups(sizes, first.shape[-3], budget):
        x = _padded(images, group, sizes).float()
        b = boxes[group].float()
        rois = torch.stack(
            [torch.arange(len(group)).float(), b[:, 1], b[:, 0], b[:, 1] + b[:, 3], b[:, 0] + b[:, 2]], 1
        )
        y = roi_align(x, _to(rois, x.device), list(size), spatial_scale=1.0, sampling_ratio=-1, aligned=True)
        y = y if out.dtype.is_floating_point else y.round_().to(out.dtype)
        if len(group) == len(sizes) and bool((group == torch.arange(len(sizes))).all()):
            return y
        out[_to(group, out.device)] = y
    return out


def rrc_boxes(sizes: torch.Tensor, scale, ratio, u: torch.Tensor) -> torch.Tensor:
    """(n, 4) boxes (top, left, height, width) as torchvision's RandomResizedCrop draws them, from each sample's
    22 uniforms: 10 tries at a random area and log-uniform aspect ratio (the first that fits wins), else the
    centre crop at the ratio's nearest bound; the last two place the box."""
    h, w = sizes[:, :1].double(), sizes[:, 1:].double()
    target = h * w * (scale[0] + (scale[1] - scale[0]) * u[:, 0:20:2])
    lo, hi = math.log(ratio[0]), math.log(ratio[1])
    aspect = torch.exp(lo + (hi - lo) * u[:, 1:20:2])
    cw, ch = torch.sqrt(target * aspect).round(), torch.sqrt(target / aspect).round()
    fits = (cw > 0) & (cw <= w) & (ch > 0) & (ch <= h)
    first, found = fits.int().argmax(1, keepdim=True), fits.any(1, keepdim=True)
    in_ratio, narrow, wide = w / h, min(ratio), max(ratio)
    cw = torch.where(found, cw.gather(1, first), torch.where(in_ratio > wide, (h * wide).round(), w))
    ch = torch.where(found, ch.gather(1, first), torch.where(in_ratio < narrow, (w / narrow).round(), h))
    top = torch.where(found, (u[:, 20:21] * (h - ch + 1)).floor(), ((h - ch) / 2).floor())
    left = torch.where(found, (u[:, 21:22] * (w - cw + 1)).floor(), ((w - cw) / 2).floor())
    return torch.cat([top, left, ch, cw], 1).long()


def random_resized_crop(p: dict) -> Op:
    """Boxes drawn per sample (:func:`rrc_boxes`); the batch form resizes them all by roi_align, which
    interpolates bilinearly only: with another interpolation the crop runs per sample."""
    size, interp = list(p["size"]), _interp(p.get("interpolation", 1))
    scale, ratio = p["scale"], p["ratio"]

    def one(img, g):
        top, left, h, w = rrc_boxes(_sizes([img]), scale, ratio, _uniforms(g, 1, 22))[0].tolist()
        return _F().resized_crop(img, top, left, h, w, size, interpolation=interp, antialias=True)

    def batch(x, g):
        sizes = _sizes(x)
        return resized_crops(x, rrc_boxes(sizes, scale, ratio, _uniforms(g, len(sizes), 2 * 10 + 2)), size)

    return Op("RandomResizedCrop", one=one, batch=batch if interp.value == "bilinear" else None, ragged=True)


def random_crop(p: dict) -> Op:
    h, w, fill = int(p["height"]), int(p["width"]), p.get("fill", 0)

    def one(img, g):
        ih, iw = img.shape[-2:]
        if p.get("pad_if_needed") and (ih < h or iw < w):  # centred padding with the fill, as albumentations
            dh, dw = max(h - ih, 0), max(w - iw, 0)
            img = _F().pad(img, [dw // 2, dh // 2, dw - dw // 2, dh - dh // 2], fill=fill)
            ih, iw = img.shape[-2:]
        u = _uniforms(g, 1, 2)[0].tolist()
        return _F().crop(img, int(u[0] * (ih - h + 1)), int(u[1] * (iw - w + 1)), h, w)

    def batch(x, g):  # the same offsets in each image's own coordinates: the padding reads as the fill
        sizes = _sizes(x)
        grown = torch.maximum(sizes, torch.tensor([h, w])) if p.get("pad_if_needed") else sizes
        at = (_uniforms(g, len(sizes), 2) * (grown - torch.tensor([h, w]) + 1)).trunc().long() - (grown - sizes) // 2
        return crops(x, at[:, 0], at[:, 1], h, w, fill if p.get("pad_if_needed") else 0)

    return Op("RandomCrop", one=one, batch=batch, ragged=True)


def center_crop(p: dict) -> Op:
    h, w = int(p["height"]), int(p["width"])

    def one(img, g):  # albumentations floors an odd margin's half; v2's center_crop rounds it
        return _F().crop(img, (img.shape[-2] - h) // 2, (img.shape[-1] - w) // 2, h, w)

    def batch(x, g):
        at = (_sizes(x) - torch.tensor([h, w])).div(2, rounding_mode="floor")
        if isinstance(x, torch.Tensor) and bool((at[0] >= 0).all()):  # a view of the stacked batch
            return x[..., int(at[0, 0]) : int(at[0, 0]) + h, int(at[0, 1]) : int(at[0, 1]) + w]
        return crops(x, at[:, 0], at[:, 1], h, w)

    return Op("CenterCrop", one=one, batch=batch, ragged=True)


def resize(p: dict) -> Op:
    """A stacked batch in one resize call; images of several sizes through roi_align (bilinear) with the whole
    image as the box, else per sample."""
    size, interp = [int(p["height"]), int(p["width"])], _interp(p.get("interpolation", 1))

    def one(img, g):
        return _F().resize(img, size, interpolation=interp, antialias=True)

    def batch(x, g):
        if _same_shape(x):
            return one(x if isinstance(x, torch.Tensor) else torch.stack(x), g)
        if interp.value != "bilinear":
            return torch.stack([one(img, g) for img in x])
        sizes = _sizes(x)
        return resized_crops(x, torch.cat([torch.zeros_like(sizes), sizes], 1), size)

    return Op("Resize", one=one, batch=batch, ragged=True)


def smallest_max_size(p: dict) -> Op:
    """The shorter side scaled to ``max_size``, the aspect ratio kept: albumentations' SmallestMaxSize (each side
    ``round(side * scale)``), or torchvision's ``Resize(int)`` where ``long_side`` is 'floor' (the shorter side
    exactly, the longer ``int(size * long / short)``). The images leave in several sizes: per sample, a stacked
    batch of one size in one call."""
    size, interp = p.get("max_size"), _interp(p.get("interpolation", 1))
    if not isinstance(size, int) or p.get("max_size_hw") is not None:
        raise NoCounterpart(
            f"SmallestMaxSize(max_size={size!r}, max_size_hw={p.get('max_size_hw')!r}): only one fixed size maps"
        )
    floor = p.get("long_side") == "floor"

    def out_size(h: int, w: int) -> list[int]:
        if floor:
            return [size, int(size * w / h)] if h <= w else [int(size * h / w), size]
        scale = size / min(h, w)
        return [max(1, round(h * scale)), max(1, round(w * scale))]

    def one(img, g):
        return _F().resize(img, out_size(*img.shape[-2:]), interpolation=interp, antialias=True)

    return Op("SmallestMaxSize", one=one, batch=one)


def _affine_args(sizes: torch.Tensor, p: dict, u: torch.Tensor) -> torch.Tensor:
    """(n, 6) angle, translate x and y (pixels, rounded), scale, shear x and y from each sample's uniforms
    (column 0 is the coin of ``p``)."""
    move = p.get("translate_percent") or {"x": (0, 0), "y": (0, 0)}

    def between(col, bounds):
        return bounds[0] + (bounds[1] - bounds[0]) * u[:, col]

    return torch.stack(
        [
            between(6, p["rotate"]),
            (between(1, move["x"]) * sizes[:, 1]).round(),
            (between(2, move["y"]) * sizes[:, 0]).round(),
            between(3, p["scale"]["x"]),
            between(4, p["shear"]["x"]),
            between(5, p["shear"]["y"]),
        ],
        1,
    )


def _inverse_matrices(args: torch.Tensor) -> torch.Tensor:
    """(n, 2, 3) output-to-input matrices about the image centre: torchvision's _get_inverse_affine_matrix
    (centre 0 in centred pixel coordinates, as its affine on tensors), for every sample at once."""
    rot, sx, sy = (torch.deg2rad(args[:, i]) for i in (0, 4, 5))
    tx, ty, scale = args[:, 1], args[:, 2], args[:, 3]
    a = torch.cos(rot - sy) / torch.cos(sy)
    b = -(a * torch.tan(sx) + torch.sin(rot))
    c = torch.sin(rot - sy) / torch.cos(sy)
    d = torch.cos(rot) - c * torch.tan(sx)
    m0, m1, m3, m4 = d / scale, -b / scale, -c / scale, a / scale
    return torch.stack([m0, m1, -m0 * tx - m1 * ty, m3, m4, -m3 * tx - m4 * ty], 1).view(-1, 2, 3)


def affine_images(x: torch.Tensor, matrices: torch.Tensor, mode: str = "bilinear", fill: float = 0) -> torch.Tensor:
    """Each image of the stacked batch through its matrix (centred pixel coordinates, host) in one
    affine_grid + grid_sample: torchvision's affine with the normalisation folded into theta, and its fill (a
    ones channel sampled alongside: bilinear output blends toward the fill by how much of it fell outside)."""
    n, c, h, w = x.shape
    m = matrices.double()
    theta = (
        torch.stack(
            [m[:, 0, 0], m[:, 0, 1] * h / w, m[:, 0, 2] * 2 / w, m[:, 1, 0] * w / h, m[:, 1, 1], m[:, 1, 2] * 2 / h], 1
        )
        .view(n, 2, 3)
        .float()
    )
    grid = torch.nn.functional.affine_grid(_to(theta, x.device), [n, c + 1, h, w], align_corners=False)
    img = torch.cat([x.float(), torch.ones((n, 1, h, w), device=x.device)], 1)
    y = torch.nn.functional.grid_sample(img, grid, mode=mode, padding_mode="zeros", align_corners=False)
    out, inside = y[:, :-1], y[:, -1:]
    fill_t = _fill(fill, out)
    out = torch.where(inside < 0.5, fill_t, out) if mode == "nearest" else (out - fill_t) * inside + fill_t
    return out if x.dtype.is_floating_point else out.round_().to(x.dtype)


def _some(x: torch.Tensor, u: torch.Tensor, prob: float, fn: Callable) -> torch.Tensor:
    """``fn(images, their uniforms)`` on the samples whose coin (column 0 of ``u``) falls under ``prob``, the
    others unchanged (albumentations' ``p``)."""
    chosen = (u[:, 0] < prob).nonzero().flatten()
    if len(chosen) == 0:
        return x
    if len(chosen) == len(x):
        return fn(x, u)
    at = _to(chosen, x.device)
    return x.index_copy(0, at, fn(x[at], u[chosen]))


def affine(p: dict) -> Op:
    """Albumentations' Affine (rotate, x/y scale, shear, translate as a share of the side, zero fill) as
    v2's affine with one drawn scale: torchvision scales both axes alike (keep_ratio-like). The batch form
    needs one image size (after a crop); images of several sizes go per sample."""
    interp, fill = _interp(p.get("interpolation", 1)), p.get("fill", 0)

    def one(img, g):
        u = _uniforms(g, 1, 7)
        if float(u[0, 0]) >= p["p"]:
            return img
        angle, tx, ty, scale, shx, shy = _affine_args(_sizes([img]), p, u)[0].tolist()
        return _F().affine(
            img, angle=angle, translate=[tx, ty], scale=scale, shear=[shx, shy], interpolation=interp, fill=fill
        )

    def batch(x, g):
        return _some(
            x,
            _uniforms(g, len(x), 7),
            p["p"],
            lambda imgs, u: affine_images(
                imgs, _inverse_matrices(_affine_args(_sizes(imgs), p, u)), interp.value, fill
            ),
        )

    return Op("Affine", one=one, batch=batch)


def blur_images(x: torch.Tensor, ks: torch.Tensor, sigmas: torch.Tensor) -> torch.Tensor:
    """Each image of the stacked batch blurred with its own Gaussian (odd size ``ks[i]``, ``sigmas[i]``; host):
    torchvision's kernel, separable, zero beyond each sample's own size in a kernel of the largest, and one
    grouped convolution per direction over reflect padding (the zero taps never read the extra padding)."""
    n, c, h, w = x.shape
    half = int(ks.max()) // 2
    d = torch.arange(-half, half + 1, dtype=torch.float64)
    k = torch.exp(-0.5 * (d / sigmas.view(-1, 1)) ** 2) * (d.abs() <= (ks.view(-1, 1) // 2))
    k = _to((k / k.sum(1, keepdim=True)).float().repeat_interleave(c, 0), x.device)
    y = x.float().reshape(1, n * c, h, w)
    y = torch.nn.functional.conv2d(
        torch.nn.functional.pad(y, [half, half, 0, 0], mode="reflect"), k.view(n * c, 1, 1, -1), groups=n * c
    )
    y = torch.nn.functional.conv2d(
        torch.nn.functional.pad(y, [0, 0, half, half], mode="reflect"), k.view(n * c, 1, -1, 1), groups=n * c
    ).view(n, c, h, w)
    return y if x.dtype.is_floating_point else y.round_().to(x.dtype)


def gaussian_blur(p: dict) -> Op:
    lo, hi = (int(k) for k in p["blur_limit"])
    odd = torch.tensor([k for k in range(max(lo, 3), hi + 1) if k % 2] or [3])

    def args(u):  # kernel size (one of the odd sizes in the limit) and sigma per sample; column 0 is the coin
        at = (u[:, 1] * len(odd)).long().clamp(max=len(odd) - 1)
        return odd[at], p["sigma_limit"][0] + (p["sigma_limit"][1] - p["sigma_limit"][0]) * u[:, 2]

    def one(img, g):
        u = _uniforms(g, 1, 3)
        if float(u[0, 0]) >= p["p"]:
            return img
        k, sigma = (float(v[0]) for v in args(u))
        return _F().gaussian_blur(img, [int(k), int(k)], [sigma, sigma])

    def batch(x, g):
        return _some(x, _uniforms(g, len(x), 3), p["p"], lambda imgs, u: blur_images(imgs, *args(u)))

    return Op("GaussianBlur", one=one, batch=batch)


# ---- pixels: on the stacked batch, per-sample parameters ------------------------------------


def horizontal_flip(p: dict) -> Op:
    return Op("HorizontalFlip", batch=lambda x, g: torch.where(_chosen(x, p["p"], g), x.flip(-1), x))


def vertical_flip(p: dict) -> Op:
    return Op("VerticalFlip", batch=lambda x, g: torch.where(_chosen(x, p["p"], g), x.flip(-2), x))


def _factors(n: int, bounds, g: torch.Generator, centre: float = 1.0) -> Optional[torch.Tensor]:
    """``n`` factors drawn uniformly within ``bounds`` on the host, or None (no draw) where both ends are ``centre``."""
    lo, hi = bounds
    return lo + (hi - lo) * _draw(g, n) if (lo, hi) != (centre, centre) else None


def color_jitter(p: dict) -> Op:
    """Brightness, contrast, saturation and hue factors drawn per sample, applied in that order to the samples the
    coin chose (albumentations shuffles the order per call; the cost is the same).

    Each pass over a batch is a kernel over every pixel, and beside the step each waits for SMs (docs/measured.md):
    so only the chosen samples are converted (:func:`_some`), the blends run in place (brightness is a product:
    ``ratio * y + (1 - ratio) * 0`` is ``ratio * y``, bit for bit; the others are torchvision's blend, in its
    order), and the hue turns on RGB directly (:func:`_shift_hue`). On CUDA with Triton the same steps run as one
    pass over the batch (two with contrast, whose mean comes first: ``gpu_kernels.color_jitter``)."""
    keys = ("brightness", "contrast", "saturation", "hue")

    def jitter(x, drawn: dict):
        b, c, s, h = (None if drawn[k] is None else _to(drawn[k], x.device).view(-1, 1, 1, 1) for k in keys)
        y = x.float().div_(255) if x.dtype == torch.uint8 else x.clone()
        if b is not None:
            y.mul_(b).clamp_(0, 1)
        if c is not None:
            mean = _F().rgb_to_grayscale(y).mean(dim=(-3, -2, -1), keepdim=True)
            y.mul_(c).add_((1 - c) * mean).clamp_(0, 1)
        if s is not None:
            gray = _F().rgb_to_grayscale(y).mul_(1 - s)  # before y is scaled in place
            y.mul_(s).add_(gray).clamp_(0, 1)
        if h is not None:
            y = _shift_hue(y, h.view(-1, 1, 1))
        return y.mul_(255).round_().to(torch.uint8) if x.dtype == torch.uint8 else y

    def batch(x, g):
        n = x.shape[0]
        drawn = {k: _factors(n, p[k], g, centre=0.0 if k == "hue" else 1.0) for k in keys}  # in this order
        present = [k for k in keys if drawn[k] is not None]
        u = torch.stack([_draw(g, n), *(drawn[k] for k in present)], dim=1)  # the coin drawn last, column 0

        def chosen(imgs, rows):
            return jitter(imgs, {k: rows[:, 1 + present.index(k)].contiguous() if k in present else None for k in keys})

        from . import gpu_kernels  # imports Triton: only where a batch is jittered

        if x.shape[-3] == 3 and gpu_kernels.usable(x.device, "jitter"):  # the same steps in one or two launches
            out = gpu_kernels.color_jitter(x, [drawn[k] for k in keys], u[:, 0] < p["p"])
            if out is not None:
                return out
        return _some(x, u, p["p"], chosen)

    return Op("ColorJitter", batch=batch)


def _shift_hue(y: torch.Tensor, shift: torch.Tensor) -> torch.Tensor:
    """Hue rotated by ``shift`` (a share of the circle) per sample, value and saturation kept: HSV's rotation
    written on RGB directly. A pixel keeps its largest and smallest channel (V and V·S), and each channel reads
    ``max - (max - min) · clamp(min(k, 4 - k), 0, 1)`` at ``k = (n + 6 · hue) mod 6``, n = 5, 3, 1 for R, G, B
    (the HSV-to-RGB formula without its sextant table). torchvision's ``_rgb_to_hsv`` / ``_hsv_to_rgb`` pair
    gives the same up to float rounding (one level of 255 on a few pixels, a test checks it) in about half the
    passes over the batch: no 4-channel stack, no int64 gather."""
    minc, maxc = torch.aminmax(y, dim=-3)
    span = maxc - minc
    r, g, b = y.unbind(dim=-3)
    safe = torch.where(span > 0, span, torch.ones_like(span))  # grey: any hue, its channels all read max
    hue = torch.where(
        maxc == r, (g - b).div_(safe), torch.where(maxc == g, (b - r).div_(safe).add_(2), (r - g).div_(safe).add_(4))
    )
    hue = hue.add_(shift * 6).unsqueeze_(-3)  # in sextants; the mod comes with each channel's offset
    k = (hue + _to(torch.tensor([5.0, 3.0, 1.0]), y.device).view(3, 1, 1)).remainder_(6)
    return torch.minimum(k, 4 - k).clamp_(0, 1).mul_(span.unsqueeze(-3)).neg_().add_(maxc.unsqueeze(-3))


def gauss_noise(p: dict) -> Op:
    """Zero-mean noise whose standard deviation (a share of the pixel range) is drawn per sample."""

    def batch(x, g):
        lo, hi = p["std_range"]
        std = (lo + (hi - lo) * _draw(g, x.shape[0])) * (255 if x.dtype == torch.uint8 else 1)
        coin = _draw(g, x.shape[0])  # drawn after the deviations, as before; the noise only for the chosen samples

        def noisy(imgs, u):
            sd = _to(u[:, 1].contiguous(), imgs.device).view(-1, 1, 1, 1)
            out = imgs.float().add_(torch.randn(imgs.shape, device=imgs.device).mul_(sd))
            return out.clamp_(0, 255).round_().to(torch.uint8) if x.dtype == torch.uint8 else out

        return _some(x, torch.stack([coin, std], dim=1), p["p"], noisy)

    return Op("GaussNoise", batch=batch)


def channels(values) -> list[float]:
    """A Normalize's mean or std as plain floats, one a channel or one for all: albumentations keeps a scalar as
    given, torchvision keeps what it was given (timm's ``create_transform`` gives tensors)."""
    return torch.as_tensor(values, dtype=torch.float64).reshape(-1).tolist()


def normalize(p: dict) -> Op:
    if p.get("normalization", "standard") != "standard":
        raise NoCounterpart(
            f"augment.device: cuda: Normalize with normalization={p['normalization']!r} has no "
            "counterpart here (only 'standard': (x / max_pixel_value - mean) / std)"
        )
    scale = float(p.get("max_pixel_value", 255.0))
    mean, std = (torch.tensor(channels(p[k]), dtype=torch.float32).view(1, -1, 1, 1) for k in ("mean", "std"))

    # v2's normalize, with its mean and std sent without a blocking copy (which would wait for the queue); in place
    # on the one float copy (the same operations in the same order: the same bits, one allocation)
    def batch(x, g):
        return x.to(torch.float32, copy=True).div_(scale).sub_(_to(mean, x.device)).div_(_to(std, x.device))

    return Op("Normalize", batch=batch)


def to_tensor(p: dict) -> Op:
    return Op("ToTensorV2")  # decode_jpeg already gives CHW tensors


#: albumentations class name -> builder of its GPU counterpart from the transform's stored parameters
TORCHVISION: dict[str, Callable[[dict], Op]] = {
    "RandomResizedCrop": random_resized_crop,
    "RandomCrop": random_crop,
    "CenterCrop": center_crop,
    "Resize": resize,
    "SmallestMaxSize": smallest_max_size,
    "Affine": affine,
    "GaussianBlur": gaussian_blur,
    "HorizontalFlip": horizontal_flip,
    "VerticalFlip": vertical_flip,
    "ColorJitter": color_jitter,
    "GaussNoise": gauss_noise,
    "Normalize": normalize,
    "ToTensorV2": to_tensor,
}


def ops_of(transforms: list[dict], preset: str = "the preset") -> list[Op]:
    """The GPU ops of albumentations' serialised transforms (``A.to_dict(compose)["transform"]
    ["transforms"]``); NoCounterpart naming the first one without a mapping and the ones there are."""
    ops = []
    for t in transforms:
        name = t.get("__class_fullname__", "?").rsplit(".", 1)[-1]
        if name not in TORCHVISION:
            raise NoCounterpart(
                f"augment.device: cuda: {preset} uses {name}, which has no torchvision counterpart in "
                f"pipeprof's table (mapped: {', '.join(TORCHVISION)}); run this preset with "
                "augment.device: cpu, or map the transform in pipeprof/data/gpu_augment.py"
            )
        ops.append(TORCHVISION[name]({"p": 1.0} | t))
    return ops


class GpuPipeline:
    """Decode a batch of JPEG bytes and augment it on ``device``: ``pipe(list of uint8 byte tensors)`` ->
    NCHW tensor (float32 when the preset normalises, else uint8, as the CPU pipeline hands the step).
    ``batched=False`` runs every transform that has a per-sample form per sample (the reference, and the
    benchmark's baseline); the same seed draws the same parameters either way."""

    def __init__(
        self,
        transforms: list[dict],
        device: str | torch.device = "cuda",
        seed: int = 0,
        preset: str = "the preset",
        batched: bool = True,
    ):
        self.ops = ops_of(transforms, preset)
        self.device = torch.device(device)
        self.g = torch.Generator().manual_seed(seed)
        self.batched = batched
        self._decode = None  # made at the first batch: it imports torchvision's decoder

    def decode(self, encoded: list[torch.Tensor]) -> list[torch.Tensor]:
        """One call for the whole batch (nvJPEG on CUDA, ``gpu_decode``'s default); RGB whatever the JPEG holds
        (grey, CMYK). The current stream's queued work is waited for first (``gpu_decode.settle``)."""
        from . import gpu_decode

        if self._decode is None:
            self._decode = gpu_decode.decoder(DEFAULT_GPU_DECODER, self.device)
        gpu_decode.settle(self.device)
        return self._decode(encoded)

    def augment(self, images: list[torch.Tensor], after: Optional[Callable[[str], None]] = None) -> torch.Tensor:
        """The ops in the preset's order, each on the whole batch where it has a batch form that takes the
        batch as it is (a crop or resize takes images of several sizes; the others need one size), else per
        sample. Stacked at the first op that needs a stacked batch. ``after(op name)`` is called as each op
        returns (the benchmark's per-op clock)."""
        x: list | torch.Tensor = images
        for op in self.ops:
            x = self._apply(op, x)
            if after is not None:
                after(op.name)
        return self._stacked(x)

    def _apply(self, op: Op, x):
        if op.batch is not None and (op.one is None or self.batched and (op.ragged or _same_shape(x))):
            return op.batch(x if op.ragged else self._stacked(x), self.g)
        if op.one is not None:
            return [op.one(img, self.g) for img in x]
        return x

    @staticmethod
    def _stacked(x) -> torch.Tensor:
        if isinstance(x, torch.Tensor):
            return x
        shapes = {tuple(img.shape) for img in x}
        if len(shapes) > 1:
            raise ValueError(
                f"the preset leaves images of {len(shapes)} sizes where a batch is needed "
                f"({sorted(shapes)[:3]}...): put a crop or resize to one size first"
            )
        return torch.stack(x)

    def __call__(self, encoded: list[torch.Tensor]) -> torch.Tensor:
        return self.augment(self.decode(encoded))


def for_preset(
    preset: str, size: Optional[int], device: str | torch.device, seed: int = 0, batched: bool = True
) -> GpuPipeline:
    """The GPU pipeline of a preset (name or YAML path), cropping to ``size`` like ``augment.load_preset``."""
    from .augment import A, load_preset

    transforms = A.to_dict(load_preset(preset, size))["transform"]["transforms"]
    return GpuPipeline(transforms, device, seed, preset=f"preset {preset!r}", batched=batched)
