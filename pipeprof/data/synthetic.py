"""Synthetic ImageNet-like JPEG dataset in torchvision ``ImageFolder`` layout.

Profiling an input pipeline needs data whose *cost* resembles the real thing:
JPEG decode time scales with pixel count and with the number of non-zero DCT
coefficients, i.e. with file size; resize/crop cost scales with image shape.
Flat colours compress to a few KB and decode far too fast; white noise
compresses badly and decodes far too slowly. So the images imitate the
statistics that drive those costs:

* Shapes follow ImageNet train: mostly 500x375 and 375x500, plus a spread of
  other sizes (area 0.5x-1.6x of 500x375, aspect 3:4..16:9).
* Content has a natural-image power spectrum, ``P(f) ~ 1/f^alpha`` with alpha
  in 1.8..2.2 (textures made by filtering noise in the Fourier domain). Colour
  channels are correlated the way photos are: a shared luminance field plus
  weaker chroma fields.
* Occluding objects (ellipses, polygons) with their own colour and texture add
  sharp edges, which real photos have and pure 1/f fields lack; a gradient adds
  illumination; a little luminance noise stands in for sensor noise; a
  soft-knee tone curve (not a hard clip) maps to 8 bits, as cameras do.
* The texture contrast is tuned so the mean file size at 500x375, quality 90
  (4:2:0) is ~113 KB, close to ImageNet's; decode cost follows from that.

Every image is a pure function of ``(seed, index)``, so datasets are
reproducible and can be generated in parallel in any order.
"""

from __future__ import annotations

import io
import json
import os
import pathlib
import shutil
import signal
import time
import uuid
from dataclasses import asdict, dataclass, replace
from multiprocessing import Pool
from typing import Callable

import numpy as np
from PIL import Image, ImageDraw

# Bump when the generated pixels change, so stale caches are regenerated.
GENERATOR_VERSION = 1
MARKER = "pipeprof-dataset.json"
BASE_W, BASE_H = 500, 375
# Range of the background texture's luminance std, in 8-bit levels. It sets how
# many DCT coefficients survive quantisation, i.e. the file size; tuned so the
# mean at 500x375, quality 90 is ~113 KB (ImageNet train: ~110 KB).
# Sensor noise barely moves the size (the texture already fills those coefficients).
CONTRAST = (45.0, 75.0)
SENSOR_NOISE = 4.0  # mean std of per-pixel noise in 8-bit levels; tunes the file size


@dataclass(frozen=True)
class DatasetStats:
    path: str
    images: int
    classes: int
    mean_kb: float
    total_mb: float
    decode_ms_per_image: float
    mean_width: float
    mean_height: float

    def to_dict(self) -> dict:
        return asdict(self)


# --------------------------------------------------------------------------
# Image content


def image_size(rng: np.random.Generator) -> tuple[int, int]:
    """Draw (width, height) with ImageNet-train-like frequencies.

    Most ImageNet photos are 500x375 or 375x500 (Flickr's downscaled sizes);
    the rest scatter around that area with mostly landscape aspects.
    """
    u = rng.random()
    if u < 0.6:
        return BASE_W, BASE_H
    if u < 0.8:
        return BASE_H, BASE_W
    area = BASE_W * BASE_H * np.exp(rng.uniform(np.log(0.5), np.log(1.6)))
    aspect = np.exp(rng.uniform(np.log(3 / 4), np.log(16 / 9)))
    w = int(round(np.sqrt(area * aspect)))
    return w, int(round(area / w))


def _pink_fields(rng: np.random.Generator, n: int, h: int, w: int, alpha: float) -> np.ndarray:
    """``n`` zero-mean, unit-std fields with power spectrum ~ 1/f^alpha."""
    fy = np.fft.fftfreq(h).astype(np.float32)[:, None]
    fx = np.fft.rfftfreq(w).astype(np.float32)[None, :]
    f2 = fy * fy + fx * fx
    f2[0, 0] = 1.0  # the DC term is zeroed below; avoid dividing by zero
    amp = f2 ** np.float32(-alpha / 4)  # amplitude = sqrt(power) = f^(-alpha/2)
    amp[0, 0] = 0.0
    # Uniform rather than Gaussian coefficients: 4x cheaper to draw, and the
    # inverse FFT sums so many of them that the field is Gaussian anyway.
    coef = rng.random((n, h, w // 2 + 1, 2), dtype=np.float32)
    coef -= np.float32(0.5)
    spec = coef.view(np.complex64)[..., 0]
    spec *= amp
    fields = np.fft.irfft2(spec, s=(h, w))
    return fields / fields.std(axis=(1, 2), keepdims=True)


def _colourize(rng: np.random.Generator, fields: np.ndarray, contrast: float) -> np.ndarray:
    """Map (luma, chroma1, chroma2) fields to correlated RGB around a random mean colour."""
    mean = rng.uniform(60, 195, size=3)
    chroma = rng.normal(0, 0.35, size=(3, 2))  # weaker than luma, as in photos
    rgb = np.empty(fields.shape[1:] + (3,), np.float32)
    # Elementwise rather than a matmul: BLAS would spin up threads for a 3x3 mix.
    for c in range(3):
        mixed = fields[0] + np.float32(chroma[c, 0]) * fields[1] + np.float32(chroma[c, 1]) * fields[2]
        rgb[..., c] = np.float32(contrast) * mixed + np.float32(mean[c])
    return rgb


def _gradient(rng: np.random.Generator, h: int, w: int) -> np.ndarray:
    """A linear illumination/colour ramp in a random direction."""
    theta = rng.uniform(0, 2 * np.pi)
    y = np.linspace(-0.5, 0.5, h, dtype=np.float32)[:, None, None]
    x = np.linspace(-0.5, 0.5, w, dtype=np.float32)[None, :, None]
    colour = rng.normal(0, 35, size=3).astype(np.float32)
    return (np.float32(np.cos(theta)) * colour) * x + (np.float32(np.sin(theta)) * colour) * y


def _shape_mask(rng: np.random.Generator, h: int, w: int) -> np.ndarray:
    """A filled ellipse or polygon as a boolean mask."""
    mask = Image.new("L", (w, h), 0)
    draw = ImageDraw.Draw(mask)
    cx, cy = rng.uniform(0, w), rng.uniform(0, h)
    r = rng.uniform(0.08, 0.4) * min(w, h)
    if rng.random() < 0.5:
        rx, ry = r * rng.uniform(0.5, 1.5), r * rng.uniform(0.5, 1.5)
        draw.ellipse([cx - rx, cy - ry, cx + rx, cy + ry], fill=255)
    else:
        k = int(rng.integers(3, 8))
        ang = np.sort(rng.uniform(0, 2 * np.pi, k))
        rad = r * rng.uniform(0.5, 1.3, k)
        draw.polygon(list(zip(cx + rad * np.cos(ang), cy + rad * np.sin(ang))), fill=255)
    return np.asarray(mask) > 127


def _sensor_noise(rng: np.random.Generator, h: int, w: int) -> np.ndarray:
    """Fine per-pixel detail on luminance only: 4:2:0 JPEG would discard most chroma noise."""
    # Photos vary in how busy they are; so does the file size, so vary the noise per image.
    std = SENSOR_NOISE * rng.uniform(0.5, 1.5)
    half_width = np.float32(std * np.sqrt(3.0))  # uniform noise with that std
    noise = rng.random((h, w, 1), dtype=np.float32)
    noise -= np.float32(0.5)
    return noise * (2 * half_width)


def _tone_map(img: np.ndarray) -> np.ndarray:
    """Soft-knee tone curve to uint8: near-linear mid-tones, rolled-off extremes.

    Gaussian fields overshoot 0..255; hard clipping would leave large flat
    saturated patches (cheap to encode), whereas cameras roll highlights off.
    """
    t = (img - np.float32(127.5)) / np.float32(127.5)
    t4 = t * t
    t4 *= t4
    t /= np.sqrt(np.sqrt(t4 + np.float32(1.0)))  # t / (1 + t^4)^(1/4), bounded by +-1
    return (t * np.float32(127.49) + np.float32(128.0)).astype(np.uint8)


def render_image(seed: int, index: int) -> np.ndarray:
    """The RGB uint8 array of image ``index`` of the dataset with ``seed``."""
    rng = np.random.default_rng([seed, index])
    w, h = image_size(rng)
    fields = _pink_fields(rng, 4, h, w, alpha=rng.uniform(1.8, 2.2))
    img = _colourize(rng, fields[:3], contrast=rng.uniform(*CONTRAST))
    img += _gradient(rng, h, w)
    for _ in range(int(rng.integers(2, 7))):
        # Objects share one texture field but each has its own colour and gain,
        # so their surfaces differ from the background and from each other.
        mask = _shape_mask(rng, h, w)
        colour = (rng.uniform(30, 220) + rng.normal(0, 35, size=3)).astype(np.float32)
        gain = (rng.uniform(25, 55) * rng.uniform(0.6, 1.0, 3)).astype(np.float32)
        img[mask] = colour + gain * fields[3][mask][:, None]
    img += _sensor_noise(rng, h, w)
    return _tone_map(img)


def encode_image(seed: int, index: int, quality: int = 90) -> bytes:
    """JPEG bytes of image ``index`` (Pillow, 4:2:0 subsampling like most photos)."""
    buf = io.BytesIO()
    Image.fromarray(render_image(seed, index)).save(buf, "JPEG", quality=quality, subsampling=2)
    return buf.getvalue()


# --------------------------------------------------------------------------
# Dataset on disk


def _class_name(c: int) -> str:
    return f"class_{c:03d}"


def _file_path(root: pathlib.Path, index: int, classes: int) -> pathlib.Path:
    return root / _class_name(index % classes) / f"img_{index:07d}.jpg"


def _write_one(job: tuple[str, int, int, int, int]) -> tuple[int, int, int]:
    """Worker: write one image; return (bytes, width, height)."""
    root, index, classes, seed, quality = job
    data = encode_image(seed, index, quality)
    _file_path(pathlib.Path(root), index, classes).write_bytes(data)
    w, h = Image.open(io.BytesIO(data)).size
    return len(data), w, h


def _validate(images: int, classes: int, quality: int, workers: int | None = None) -> None:
    if images < 1:
        raise ValueError(f"images must be >= 1, got images={images}")
    if classes < 1:
        raise ValueError(f"classes must be >= 1, got classes={classes}")
    if classes > images:
        raise ValueError(f"classes must be <= images ({images}), got classes={classes}")
    if not 1 <= quality <= 100:
        raise ValueError(f"quality must be in 1..100, got quality={quality}")
    if workers is not None and workers < 1:
        raise ValueError(f"workers must be >= 1 or None, got workers={workers}")


def _usable_cores() -> int:
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1


def _run_jobs(jobs: list, workers: int, progress: Callable[[int, int], None] | None) -> list:
    """Run ``_write_one`` over ``jobs``, reporting progress as each completes."""
    results = []

    def collect(it):
        for r in it:
            results.append(r)
            if progress is not None:
                progress(len(results), len(jobs))

    if workers <= 1:
        collect(map(_write_one, jobs))
    else:
        chunk = max(1, min(16, len(jobs) // (workers * 8)))
        with Pool(workers, initializer=_default_signals) as pool:
            collect(pool.imap_unordered(_write_one, jobs, chunksize=chunk))
    return results


def _default_signals() -> None:
    """A pool worker ends quietly on the SIGTERM the pool sends when done: the command line's handler,
    inherited by fork, would turn it into a KeyboardInterrupt traceback per worker."""
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    signal.signal(signal.SIGINT, signal.SIG_IGN)


def make_dataset(
    root: str | os.PathLike,
    images: int,
    classes: int = 10,
    seed: int = 0,
    workers: int | None = None,
    quality: int = 90,
    progress: Callable[[int, int], None] | None = None,
) -> DatasetStats:
    """Write ``images`` JPEGs round-robin over ``classes`` folders under ``root``."""
    _validate(images, classes, quality, workers)
    root = pathlib.Path(root)
    for c in range(classes):
        (root / _class_name(c)).mkdir(parents=True, exist_ok=True)
    workers = min(workers or _usable_cores(), images)
    jobs = [(str(root), i, classes, seed, quality) for i in range(images)]
    results = np.array(_run_jobs(jobs, workers, progress), dtype=np.float64)
    files = [_file_path(root, i, classes) for i in range(images)]
    return _stats(root, classes, results, files)


def _decode_ms(files: list[pathlib.Path], sample: int) -> float:
    """Mean PIL decode time of an evenly spaced sample, bytes preloaded so disk isn't timed."""
    if not files or sample < 1:
        return float("nan")
    picks = [files[i] for i in np.linspace(0, len(files) - 1, min(sample, len(files))).astype(int)]
    blobs = [p.read_bytes() for p in picks]
    t0 = time.perf_counter()
    for blob in blobs:
        Image.open(io.BytesIO(blob)).convert("RGB")
    return (time.perf_counter() - t0) * 1000 / len(blobs)


def _stats(root: pathlib.Path, classes: int, sizes: np.ndarray, files: list, decode_sample: int = 64) -> DatasetStats:
    """Build stats from rows of (bytes, width, height)."""
    return DatasetStats(
        path=str(root),
        images=len(sizes),
        classes=classes,
        mean_kb=float(sizes[:, 0].mean() / 1e3),  # decimal, as every file size and rate in pipeprof
        total_mb=float(sizes[:, 0].sum() / 1e6),
        decode_ms_per_image=_decode_ms(files, decode_sample),
        mean_width=float(sizes[:, 1].mean()),
        mean_height=float(sizes[:, 2].mean()),
    )


def dataset_stats(root: str | os.PathLike, decode_sample: int = 64) -> DatasetStats:
    """Measure an existing ImageFolder-style folder of JPEGs."""
    root = pathlib.Path(root)
    files = sorted(p for p in root.glob("*/*") if p.suffix.lower() in (".jpg", ".jpeg"))
    if not files:
        raise ValueError(f"root contains no */*.jpg files: root={str(root)!r}")
    sizes = np.array([(p.stat().st_size, *Image.open(p).size) for p in files], dtype=np.float64)
    classes = len({p.parent.name for p in files})
    return _stats(root, classes, sizes, files, decode_sample)


# --------------------------------------------------------------------------
# Cache


def _params(images: int, classes: int, seed: int, quality: int) -> dict:
    return {
        "images": images,
        "classes": classes,
        "seed": seed,
        "quality": quality,
        "generator_version": GENERATOR_VERSION,
        "size_units": "KB=1e3",
    }  # older markers held KiB


def _read_marker(folder: pathlib.Path) -> dict | None:
    try:
        return json.loads((folder / MARKER).read_text())
    except (OSError, ValueError):
        return None


def _write_marker(folder: pathlib.Path, params: dict, stats: DatasetStats) -> None:
    # Written via rename so a crash never leaves a half-written, parseable marker.
    tmp = folder / (MARKER + ".tmp")
    tmp.write_text(json.dumps({"params": params, "stats": stats.to_dict()}, indent=2))
    os.replace(tmp, folder / MARKER)


def _install(tmp: pathlib.Path, final: pathlib.Path) -> None:
    """Move a finished dataset into place, discarding any stale folder there."""
    if final.exists():
        trash = final.with_name(f".{final.name}.old-{uuid.uuid4().hex[:8]}")
        os.rename(final, trash)
        shutil.rmtree(trash, ignore_errors=True)
    os.rename(tmp, final)


def _cached_stats(folder: pathlib.Path, params: dict) -> DatasetStats | None:
    """Stats of ``folder`` if its marker says it is complete and made with ``params``."""
    marker = _read_marker(folder)
    if marker is None or marker.get("params") != params:
        return None
    return DatasetStats(**{**marker["stats"], "path": str(folder)})


def cached_dataset(
    cache_root: str | os.PathLike, images: int, classes: int = 10, seed: int = 0, **kw
) -> tuple[pathlib.Path, DatasetStats]:
    """Reuse ``cache_root/imagenet-like-{images}x{classes}-s{seed}`` if complete, else generate it.

    ``kw`` goes to :func:`make_dataset` (``workers``, ``quality``, ``progress``).
    """
    quality = kw.get("quality", 90)
    _validate(images, classes, quality, kw.get("workers"))
    final = pathlib.Path(cache_root) / f"imagenet-like-{images}x{classes}-s{seed}"
    params = _params(images, classes, seed, quality)
    stats = _cached_stats(final, params)
    if stats is not None:
        return final, stats
    # Generate beside the final folder (same filesystem) so the rename is atomic.
    tmp = final.with_name(f".{final.name}.tmp-{os.getpid()}-{uuid.uuid4().hex[:8]}")
    try:
        stats = replace(make_dataset(tmp, images, classes, seed, **kw), path=str(final))
        _write_marker(tmp, params, stats)  # last: its presence means "complete"
        if _cached_stats(final, params) is None:  # another process may have won the race
            _install(tmp, final)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return final, stats
