"""Tests for the synthetic ImageNet-like dataset generator."""

from __future__ import annotations

import io

import numpy as np
import pytest
from PIL import Image
from torchvision.datasets import ImageFolder

from pipeprof.data.synthetic import (
    MARKER,
    cached_dataset,
    dataset_stats,
    encode_image,
    image_size,
    make_dataset,
)


def _indices_of_size(size: tuple[int, int], count: int, seed: int = 0) -> list[int]:
    """First ``count`` image indices whose drawn size is ``size``."""
    found = [i for i in range(20 * count) if image_size(np.random.default_rng([seed, i])) == size]
    return found[:count]


def _spectrum_slope(gray: np.ndarray) -> float:
    """Log-log slope of the radially averaged power spectrum (natural images: ~ -2)."""
    g = gray.astype(np.float64) - gray.mean()
    power = np.abs(np.fft.fft2(g)) ** 2
    h, w = g.shape
    f = np.hypot(np.fft.fftfreq(h)[:, None], np.fft.fftfreq(w)[None, :]).ravel()
    edges = np.geomspace(2 / min(h, w), 0.5, 16)
    which = np.digitize(f, edges)
    mean_power = [power.ravel()[which == i].mean() for i in range(1, len(edges))]
    centres = np.sqrt(edges[1:] * edges[:-1])
    return float(np.polyfit(np.log(centres), np.log(mean_power), 1)[0])


def _decode_gray(data: bytes) -> np.ndarray:
    return np.asarray(Image.open(io.BytesIO(data)).convert("L"))


def test_imagefolder_reads_dataset_and_progress_is_reported(tmp_path):
    calls = []
    stats = make_dataset(tmp_path, images=12, classes=3, workers=2, progress=lambda d, t: calls.append((d, t)))
    ds = ImageFolder(tmp_path)
    assert ds.classes == ["class_000", "class_001", "class_002"]
    assert len(ds) == 12
    assert np.bincount(ds.targets).tolist() == [4, 4, 4]  # round-robin
    assert (tmp_path / "class_001" / "img_0000004.jpg").is_file()
    assert calls == [(d, 12) for d in range(1, 13)]
    assert (stats.images, stats.classes) == (12, 3)
    assert stats.decode_ms_per_image > 0


def test_dataset_stats_matches_make_dataset(tmp_path):
    made = make_dataset(tmp_path, images=6, classes=2, workers=1)
    measured = dataset_stats(tmp_path)
    assert measured.images == 6 and measured.classes == 2
    assert measured.mean_kb == pytest.approx(made.mean_kb)
    assert measured.total_mb == pytest.approx(made.total_mb)
    assert (measured.mean_width, measured.mean_height) == (made.mean_width, made.mean_height)
    assert set(measured.to_dict()) == {
        "path",
        "images",
        "classes",
        "mean_kb",
        "total_mb",
        "decode_ms_per_image",
        "mean_width",
        "mean_height",
    }


def test_sizes_follow_imagenet_shape_distribution():
    sizes = [image_size(np.random.default_rng([0, i])) for i in range(4000)]
    landscape = sum(s == (500, 375) for s in sizes) / len(sizes)
    portrait = sum(s == (375, 500) for s in sizes) / len(sizes)
    assert 0.55 < landscape < 0.65
    assert 0.16 < portrait < 0.24
    others = np.array([s for s in sizes if s not in ((500, 375), (375, 500))], dtype=float)
    area_ratio = others[:, 0] * others[:, 1] / (500 * 375)
    aspect = others[:, 0] / others[:, 1]
    assert area_ratio.min() > 0.49 and area_ratio.max() < 1.61
    assert aspect.min() > 0.74 and aspect.max() < 1.79
    assert len({tuple(s) for s in others}) > 0.9 * len(others)  # a spread, not a few shapes


def test_rendered_image_has_the_drawn_size():
    for i in range(3):
        w, h = image_size(np.random.default_rng([5, i]))
        assert Image.open(io.BytesIO(encode_image(5, i))).size == (w, h)


def test_deterministic_for_seed_and_index():
    assert encode_image(0, 3) == encode_image(0, 3)
    assert encode_image(0, 3) != encode_image(1, 3)
    assert encode_image(0, 3) != encode_image(0, 4)


def test_parallel_generation_writes_the_same_bytes(tmp_path):
    make_dataset(tmp_path / "a", images=4, classes=2, seed=7, workers=1)
    make_dataset(tmp_path / "b", images=4, classes=2, seed=7, workers=2)
    files = sorted(p.relative_to(tmp_path / "a") for p in (tmp_path / "a").rglob("*.jpg"))
    assert len(files) == 4
    for rel in files:
        assert (tmp_path / "a" / rel).read_bytes() == (tmp_path / "b" / rel).read_bytes()


def test_mean_file_size_is_imagenet_like():
    blobs = [encode_image(0, i) for i in _indices_of_size((500, 375), 8)]
    assert len(blobs) == 8
    mean_kb = np.mean([len(b) for b in blobs]) / 1024
    assert 90 <= mean_kb <= 140, mean_kb


def test_power_spectrum_is_natural_not_flat_or_noise():
    slopes = [_spectrum_slope(_decode_gray(encode_image(0, i))) for i in range(4)]
    assert all(-3.5 < s < -1.2 for s in slopes), slopes
    # The measure does tell noise apart: white noise has a flat spectrum.
    noise = np.random.default_rng(0).integers(0, 256, (375, 500))
    assert _spectrum_slope(noise) > -0.3


def test_cached_dataset_reuses_complete_folder(tmp_path):
    path, stats = cached_dataset(tmp_path, images=4, classes=2, seed=1, workers=1)
    assert path == tmp_path / "imagenet-like-4x2-s1"
    image = path / "class_000" / "img_0000000.jpg"
    before = (image.stat().st_mtime_ns, (path / MARKER).stat().st_mtime_ns)
    path2, stats2 = cached_dataset(tmp_path, images=4, classes=2, seed=1, workers=1)
    assert path2 == path and stats2 == stats
    assert (image.stat().st_mtime_ns, (path / MARKER).stat().st_mtime_ns) == before
    assert [p.name for p in tmp_path.iterdir()] == [path.name]  # no temp folders left


def test_cached_dataset_regenerates_without_marker(tmp_path):
    path, _ = cached_dataset(tmp_path, images=4, classes=2, seed=1, workers=1)
    (path / MARKER).unlink()  # as if generation had been interrupted
    (path / "stale.txt").write_text("left by an interrupted run")
    path2, stats = cached_dataset(tmp_path, images=4, classes=2, seed=1, workers=1)
    assert path2 == path and (path / MARKER).is_file()
    assert not (path / "stale.txt").exists()  # the folder was replaced, not patched
    assert stats.images == len(ImageFolder(path)) == 4
    assert [p.name for p in tmp_path.iterdir()] == [path.name]


def test_cached_dataset_regenerates_when_parameters_differ(tmp_path):
    path, _ = cached_dataset(tmp_path, images=2, classes=1, workers=1)
    small = (path / "class_000" / "img_0000000.jpg").stat().st_size
    cached_dataset(tmp_path, images=2, classes=1, workers=1, quality=30)
    assert (path / "class_000" / "img_0000000.jpg").stat().st_size < small


@pytest.mark.parametrize(
    "kwargs, needle",
    [
        ({"images": 0}, "images=0"),
        ({"images": 5, "classes": 0}, "classes=0"),
        ({"images": 3, "classes": 4}, "classes=4"),
        ({"images": 2, "classes": 1, "quality": 0}, "quality=0"),
        ({"images": 2, "classes": 1, "quality": 101}, "quality=101"),
        ({"images": 2, "classes": 1, "workers": 0}, "workers=0"),
    ],
)
def test_invalid_arguments_raise_value_error(tmp_path, kwargs, needle):
    with pytest.raises(ValueError, match=needle):
        make_dataset(tmp_path, **kwargs)
    with pytest.raises(ValueError, match=needle):
        cached_dataset(tmp_path, **kwargs)
    assert not any(tmp_path.iterdir())  # nothing written before validation
