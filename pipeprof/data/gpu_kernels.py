"""The GPU pipeline's own Triton kernels: RandomResizedCrop's resize and ColorJitter, each a launch or two per
batch where the torch forms in ``gpu_augment`` make many passes over it.

Why kernels of their own: beside the step, every pass the GPU pipeline makes over a batch takes SM time from the
step, and the end-to-end rate is about the step plus that time (docs/measured.md, "The GPU pipeline"). The
roi_align form of the resize first copies every image into a batch padded to the largest one, through an int64
index of the padded size, and converts that copy to float: the largest share of the standard preset's device
time. ColorJitter's torch form makes a pass over the float batch per step of each of its four factors. The kernels
read only what they use, from uint8, and write each output pixel once (their times against the torch forms:
docs/measured.md, "The GPU pipeline's resize and colour jitter as Triton kernels").

* :func:`resized_crops`: roi_align's arithmetic (``aligned=True``, ``sampling_ratio=-1``; torchvision's CUDA
  source): per output pixel, ceil(box / out) bilinear samples along each axis at the centres of equal sub-bins,
  averaged; a sample's position clamped to the image's last row and column (what the padded copy's repeated edge
  gives). It reads the images where the decoder left them (the batch's one flat copy, ``gpu_augment._Flat``).
* :func:`color_jitter`: ``gpu_augment.color_jitter``'s brightness, contrast, saturation and hue, in that order,
  on the samples the coin chose; contrast's per-image mean of grey from a first kernel's per-block sums (summed
  by torch, so the result does not depend on the order blocks finish in).

uint8 out is rounded half to even, as ``round_()`` before the cast. Each agrees with its torch form to float
rounding (the tests compare them, in Triton's interpreter on the CPU and on CUDA).

Triton comes with PyTorch's CUDA wheels. Where a kernel cannot run (a CPU tensor, no Triton, or a first launch
that failed: an older Triton that cannot compile it, recorded in :data:`BROKEN` with a warning) the caller keeps
the torch form; the run records which kernels launched (:func:`launched`, the ``gpu_kernels`` column).
"""

from __future__ import annotations

import os
import warnings
from typing import Callable, Optional

import torch

try:  # PyTorch's CUDA wheels bring Triton; this module is imported only where the GPU pipeline runs
    import triton
    import triton.language as tl
except ImportError:  # pragma: no cover
    triton = None

BLOCK = 1024  # pixels of one image (and channel) per program

#: kernel name -> why it cannot run in this process (its first launch failed); the torch form runs instead
BROKEN: dict[str, str] = {}
_LAUNCHED: dict[str, int] = {}  # kernel -> launches that went through; after the first a failure is raised


def usable(device: torch.device, name: str = "resize") -> bool:
    """Whether kernel ``name`` ('resize', 'jitter') runs for tensors on ``device``: CUDA with Triton installed, or any
    device under Triton's interpreter (``TRITON_INTERPRET=1``, the CPU tests); not where its first launch failed."""
    if name in BROKEN or triton is None:
        return False
    return device.type == "cuda" or os.environ.get("TRITON_INTERPRET") == "1"


def launches() -> dict[str, int]:
    """How many launches of each kernel went through in this process so far: a mark for :func:`launched`."""
    return dict(_LAUNCHED)


def launched(since: Optional[dict] = None) -> str:
    """The kernels launched since the mark ``since`` (:func:`launches`; None: since the process began),
    comma-separated ('' for none): what a GPU-pipeline trial's row records, so that it says what ran in that trial,
    not what could have, nor what an earlier trial of the run (another preset's) launched."""
    since = since or {}
    return ",".join(sorted(k for k, n in _LAUNCHED.items() if n > since.get(k, 0)))


def _launch(name: str, launch: Callable[[], torch.Tensor]) -> Optional[torch.Tensor]:
    """``launch()``'s result; None where the kernel's first launch fails (Triton cannot compile it here), with the
    reason kept in :data:`BROKEN` and said once as a warning, so that the caller's torch form runs instead."""
    if name in _LAUNCHED:
        out = launch()
        _LAUNCHED[name] += 1
        return out
    try:
        out = launch()
    except Exception as exc:  # noqa: BLE001  (a compiler's error of any kind: the torch form is the answer)
        last = (str(exc).strip().splitlines() or [""])[-1][:200]
        BROKEN[name] = f"{type(exc).__name__}: {last}"
        warnings.warn(
            f"pipeprof's Triton kernel {name!r} cannot run here ({BROKEN[name]}); its torch form runs", stacklevel=3
        )
        return None
    _LAUNCHED[name] = 1
    return out


if triton is not None:

    @triton.jit
    def _round(v):
        """Half to even, as torch's round_(), then clamped to uint8's range."""
        r = tl.floor(v + 0.5)
        odd = (r - 2.0 * tl.floor(r * 0.5)) == 1.0
        r = tl.where(((r - v) == 0.5) & odd, r - 1.0, r)
        return tl.minimum(tl.maximum(r, 0.0), 255.0)

    @triton.jit
    def _bilinear(at, s_row, s_col, y, x, h, w, live):
        """roi_align's bilinear sample of one channel (``at``: its first pixel) at (y, x), the position clamped to
        the image (its last row and column repeat past the edge)."""
        y = tl.minimum(tl.maximum(y, 0.0), (h - 1).to(tl.float32))
        x = tl.minimum(tl.maximum(x, 0.0), (w - 1).to(tl.float32))
        y0 = y.to(tl.int64)  # y >= 0: truncation is the floor
        x0 = x.to(tl.int64)
        ly = y - y0.to(tl.float32)
        lx = x - x0.to(tl.float32)
        r0 = at + y0 * s_row
        r1 = at + tl.minimum(y0 + 1, h - 1) * s_row
        x1 = tl.minimum(x0 + 1, w - 1)
        v00 = tl.load(r0 + x0 * s_col, mask=live, other=0).to(tl.float32)
        v01 = tl.load(r0 + x1 * s_col, mask=live, other=0).to(tl.float32)
        v10 = tl.load(r1 + x0 * s_col, mask=live, other=0).to(tl.float32)
        v11 = tl.load(r1 + x1 * s_col, mask=live, other=0).to(tl.float32)
        return (1.0 - ly) * (1.0 - lx) * v00 + (1.0 - ly) * lx * v01 + ly * (1.0 - lx) * v10 + ly * lx * v11

    @triton.jit
    def boxes_resized(
        src,  # the batch's pixels, one flat tensor (uint8 or float)
        base,  # (n,) int64: where image i starts in src
        stride,  # (n, 3) int64: image i's channel, row and column strides
        hw,  # (n, 2) int64: image i's height and width
        box,  # (n, 4) float32: top, left, height, width
        out,  # (n, C, OH, OW), contiguous
        C: tl.constexpr,
        OH: tl.constexpr,
        OW: tl.constexpr,
        ROUND: tl.constexpr,  # uint8 out
        BLOCK: tl.constexpr,
    ):
        ic = tl.program_id(0)  # image i, channel c
        i = ic // C
        c = ic % C
        o = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
        live = o < OH * OW
        oy = (o // OW).to(tl.float32)
        ox = (o % OW).to(tl.float32)
        start = tl.load(base + i) + c * tl.load(stride + 3 * i)
        s_row = tl.load(stride + 3 * i + 1)
        s_col = tl.load(stride + 3 * i + 2)
        h = tl.load(hw + 2 * i)
        w = tl.load(hw + 2 * i + 1)
        top = tl.load(box + 4 * i) - 0.5  # aligned: pixel centres at +0.5
        left = tl.load(box + 4 * i + 1) - 0.5
        bin_h = tl.load(box + 4 * i + 2) / OH
        bin_w = tl.load(box + 4 * i + 3) / OW
        grid_h = tl.maximum(tl.ceil(bin_h), 1.0).to(tl.int32)  # ceil(box / out) samples per axis
        grid_w = tl.maximum(tl.ceil(bin_w), 1.0).to(tl.int32)
        acc = tl.zeros([BLOCK], dtype=tl.float32)
        for iy in range(0, grid_h):
            y = top + oy * bin_h + (iy + 0.5) * bin_h / grid_h.to(tl.float32)
            for ix in range(0, grid_w):
                x = left + ox * bin_w + (ix + 0.5) * bin_w / grid_w.to(tl.float32)
                acc += _bilinear(src + start, s_row, s_col, y, x, h, w, live)
        v = acc / (grid_h * grid_w).to(tl.float32)
        if ROUND:
            v = _round(v)
        tl.store(out + ic.to(tl.int64) * (OH * OW) + o, v, mask=live)

    @triton.jit
    def _brightened(r, g, b, f):
        return (
            tl.minimum(tl.maximum(r * f, 0.0), 1.0),
            tl.minimum(tl.maximum(g * f, 0.0), 1.0),
            tl.minimum(tl.maximum(b * f, 0.0), 1.0),
        )

    @triton.jit
    def _grey(r, g, b):
        return r * 0.2989 + g * 0.587 + b * 0.114  # torchvision's rgb_to_grayscale, in its order

    @triton.jit
    def grey_sums(x, factors, pick, sums, hw, U8: tl.constexpr, HAS_B: tl.constexpr, BLOCK: tl.constexpr):
        """Per image and block, the sum of grey over the block's pixels after brightness (contrast's mean)."""
        i = tl.program_id(0)
        blk = tl.program_id(1)
        o = blk * BLOCK + tl.arange(0, BLOCK)
        live = (o < hw) & (tl.load(pick + i) != 0)
        at = i.to(tl.int64) * 3 * hw + o
        r = tl.load(x + at, mask=live, other=0).to(tl.float32)
        g = tl.load(x + at + hw, mask=live, other=0).to(tl.float32)
        b = tl.load(x + at + 2 * hw, mask=live, other=0).to(tl.float32)
        if U8:
            r, g, b = r / 255.0, g / 255.0, b / 255.0
        if HAS_B:
            r, g, b = _brightened(r, g, b, tl.load(factors + 4 * i))
        tl.store(sums + i * tl.num_programs(1) + blk, tl.sum(tl.where(live, _grey(r, g, b), 0.0), axis=0))

    @triton.jit
    def _hue_channel(hue, n: tl.constexpr, span, maxc):
        k = hue + n
        k = k - 6.0 * tl.floor(k / 6.0)  # torch.remainder: the divisor's sign
        return maxc - tl.minimum(tl.maximum(tl.minimum(k, 4.0 - k), 0.0), 1.0) * span

    @triton.jit
    def jittered(
        x,
        out,
        factors,  # (n, 4) float32: brightness, contrast, saturation, hue (a share of the circle)
        means,  # (n,) float32: each image's mean grey after brightness (contrast)
        pick,  # (n,) int32: 1 where the coin chose the sample
        hw,
        U8: tl.constexpr,
        HAS_B: tl.constexpr,
        HAS_C: tl.constexpr,
        HAS_S: tl.constexpr,
        HAS_H: tl.constexpr,
        BLOCK: tl.constexpr,
    ):
        i = tl.program_id(0)
        o = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
        live = o < hw
        at = i.to(tl.int64) * 3 * hw + o
        r0 = tl.load(x + at, mask=live, other=0)
        g0 = tl.load(x + at + hw, mask=live, other=0)
        b0 = tl.load(x + at + 2 * hw, mask=live, other=0)
        r, g, b = r0.to(tl.float32), g0.to(tl.float32), b0.to(tl.float32)
        if U8:
            r, g, b = r / 255.0, g / 255.0, b / 255.0
        if HAS_B:
            r, g, b = _brightened(r, g, b, tl.load(factors + 4 * i))
        if HAS_C:
            f = tl.load(factors + 4 * i + 1)
            m = (1.0 - f) * tl.load(means + i)
            r = tl.minimum(tl.maximum(r * f + m, 0.0), 1.0)
            g = tl.minimum(tl.maximum(g * f + m, 0.0), 1.0)
            b = tl.minimum(tl.maximum(b * f + m, 0.0), 1.0)
        if HAS_S:
            f = tl.load(factors + 4 * i + 2)
            grey = _grey(r, g, b) * (1.0 - f)
            r = tl.minimum(tl.maximum(r * f + grey, 0.0), 1.0)
            g = tl.minimum(tl.maximum(g * f + grey, 0.0), 1.0)
            b = tl.minimum(tl.maximum(b * f + grey, 0.0), 1.0)
        if HAS_H:  # gpu_augment._shift_hue, per pixel
            maxc = tl.maximum(tl.maximum(r, g), b)
            span = maxc - tl.minimum(tl.minimum(r, g), b)
            safe = tl.where(span > 0, span, 1.0)
            hue = tl.where(maxc == r, (g - b) / safe, tl.where(maxc == g, (b - r) / safe + 2.0, (r - g) / safe + 4.0))
            hue = hue + tl.load(factors + 4 * i + 3) * 6.0
            r = _hue_channel(hue, 5.0, span, maxc)
            g = _hue_channel(hue, 3.0, span, maxc)
            b = _hue_channel(hue, 1.0, span, maxc)
        if U8:
            r, g, b = _round(r * 255.0), _round(g * 255.0), _round(b * 255.0)
        chosen = tl.load(pick + i) != 0
        tl.store(out + at, tl.where(chosen, r, r0.to(tl.float32)), mask=live)
        tl.store(out + at + hw, tl.where(chosen, g, g0.to(tl.float32)), mask=live)
        tl.store(out + at + 2 * hw, tl.where(chosen, b, b0.to(tl.float32)), mask=live)


def resized_crops(flat, sizes: torch.Tensor, boxes: torch.Tensor, size, channels: int) -> Optional[torch.Tensor]:
    """(n, channels, *size): each image's box (top, left, height, width; host int64) of the flat batch ``flat``
    (``gpu_augment._Flat``) resized, in one launch on the images' device and current stream; uint8 in, uint8 out.
    None where the kernel cannot run (:func:`_launch`)."""

    def launch() -> torch.Tensor:
        dev, n = flat.flat.device, len(sizes)
        out = torch.empty((n, channels, *size), dtype=flat.flat.dtype, device=dev)
        if n == 0:
            return out
        grid = (n * channels, triton.cdiv(size[0] * size[1], BLOCK))
        boxes_resized[grid](
            flat.flat,
            flat.base.contiguous(),
            flat.stride.contiguous(),
            sizes.to(dev, non_blocking=True).contiguous(),
            boxes.float().to(dev, non_blocking=True).contiguous(),
            out,
            C=channels,
            OH=size[0],
            OW=size[1],
            ROUND=not out.dtype.is_floating_point,
            BLOCK=BLOCK,
        )
        return out

    return _launch("resize", launch)


def color_jitter(x: torch.Tensor, factors: list, chosen: torch.Tensor) -> Optional[torch.Tensor]:
    """The stacked RGB batch ``x`` (N, 3, H, W; uint8 or float) with each chosen sample's brightness, contrast,
    saturation and hue factors (``factors``: four host tensors of n, or None for one not drawn) applied in that
    order; the others as they were. Two launches at most (contrast's sums first). None where the kernel cannot run."""

    def launch() -> torch.Tensor:
        n, hw = x.shape[0], x.shape[-2] * x.shape[-1]
        src = x.contiguous()
        table = torch.stack(
            [torch.full((n,), 0.0 if k == 3 else 1.0) if f is None else f for k, f in enumerate(factors)], 1
        )
        table = table.float().to(x.device, non_blocking=True)
        pick = chosen.int().to(x.device, non_blocking=True)
        flags = {"U8": x.dtype == torch.uint8, "HAS_B": factors[0] is not None}
        blocks = triton.cdiv(hw, BLOCK)
        means = table[:, 0]  # read only with contrast
        if factors[1] is not None:
            sums = torch.empty((n, blocks), dtype=torch.float32, device=x.device)
            grey_sums[(n, blocks)](src, table, pick, sums, hw, BLOCK=BLOCK, **flags)
            means = sums.sum(1).div_(hw)
        out = torch.empty_like(src)
        jittered[(n, blocks)](
            src,
            out,
            table,
            means.contiguous(),
            pick,
            hw,
            HAS_C=factors[1] is not None,
            HAS_S=factors[2] is not None,
            HAS_H=factors[3] is not None,
            BLOCK=BLOCK,
            **flags,
        )
        return out

    return _launch("jitter", launch)
