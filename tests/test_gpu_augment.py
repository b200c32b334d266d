"""The GPU pipeline (augment.device: cuda): the albumentations -> torchvision table, its errors, and the v2
pipeline's output, run on CPU tensors (the device is a parameter). True CUDA runs are marked ``gpu``."""

import os
import subprocess
import sys

import pytest
import torch

from pipeprof import config as C
from pipeprof.data.augment import A, load_preset, stage_names
from pipeprof.data.gpu_augment import TORCHVISION, GpuPipeline, NoCounterpart, for_preset, ops_of
from pipeprof.data.sources import source_class
from pipeprof.presets import available


@pytest.fixture(scope="module")
def encoded(tiny_dataset):
    src = source_class("files")(tiny_dataset)
    return [torch.frombuffer(bytearray(src.read(i)), dtype=torch.uint8) for i in range(6)]


def spec(*transforms) -> list[dict]:
    return A.to_dict(A.Compose(list(transforms)))["transform"]["transforms"]


@pytest.mark.parametrize("name", available())
def test_every_shipped_preset_maps_transform_by_transform(name):
    ops = ops_of(A.to_dict(load_preset(name))["transform"]["transforms"])
    assert [op.name for op in ops] == stage_names(load_preset(name))


def test_a_transform_without_counterpart_is_named_with_the_mapped_ones():
    with pytest.raises(
        NoCounterpart,
        match=r"uses CoarseDropout, which has no torchvision counterpart.*"
        r"mapped: RandomResizedCrop, RandomCrop",
    ) as err:
        ops_of(spec(A.CenterCrop(8, 8), A.CoarseDropout()), "preset 'mine'")
    assert isinstance(err.value, C.ConfigError) and "preset 'mine'" in str(err.value)
    with pytest.raises(NoCounterpart, match="normalization='image'"):
        ops_of(spec(A.Normalize(normalization="image")))


@pytest.mark.parametrize("name, dtype", [("light", torch.uint8), ("standard", torch.float32), ("heavy", torch.float32)])
def test_presets_on_cpu_tensors_give_the_step_its_batch(name, dtype, encoded):
    x = for_preset(name, 224, "cpu", seed=3)(encoded)
    assert tuple(x.shape) == (6, 3, 224, 224) and x.dtype == dtype and x.device.type == "cpu"
    if dtype == torch.float32:  # ImageNet-normalised: a photo-like image lands within a few units of 0
        assert -3 < float(x.mean()) < 3 and float(x.std()) > 0.1


def test_normalisation_matches_albumentations_on_the_same_image(encoded):
    """A deterministic preset (centre crop, normalise): torchvision's decode and v2 against Pillow and
    albumentations agree within what two libjpeg IDCTs differ by (< 2 levels of 255 on average)."""
    from pipeprof.data.decode import decode_pil

    chain = [A.CenterCrop(128, 128), A.Normalize(), A.pytorch.ToTensorV2()]
    gpu = GpuPipeline(spec(*chain), "cpu")(encoded[:2])
    cpu = torch.stack(
        [torch.as_tensor(A.Compose(chain)(image=decode_pil(bytes(e.numpy())))["image"]) for e in encoded[:2]]
    )
    assert gpu.shape == cpu.shape == (2, 3, 128, 128) and gpu.dtype == cpu.dtype == torch.float32
    assert float((gpu - cpu).abs().mean()) < 2 / 255 / 0.224


def test_flip_and_colour_draw_their_parameters_per_sample():
    x = torch.randint(0, 256, (64, 3, 8, 8), dtype=torch.uint8)
    always = GpuPipeline(spec(A.HorizontalFlip(p=1.0)), "cpu").augment(list(x))
    assert torch.equal(always, x.flip(-1))
    half = GpuPipeline(spec(A.HorizontalFlip(p=0.5)), "cpu", seed=1).augment(list(x))
    flipped = [bool(torch.equal(a, b.flip(-1))) for a, b in zip(half, x)]
    assert 10 < sum(flipped) < 54  # per sample, not one coin for the whole batch
    dim = GpuPipeline(
        spec(A.ColorJitter(brightness=(0.5, 0.5), contrast=(1, 1), saturation=(1, 1), hue=(0, 0), p=1.0)), "cpu"
    ).augment(list(x))
    assert dim.dtype == torch.uint8 and (dim.int() - (x.float() * 0.5).round().int()).abs().max() <= 1


def test_colour_and_noise_change_only_the_samples_their_coin_chose():
    """Both convert and compute only the chosen samples (the coin drawn on the host): the others come back as
    they were, bit for bit, and the chosen ones as the op's arithmetic says."""
    x = torch.randint(0, 256, (64, 3, 16, 16), dtype=torch.uint8)
    dim = A.ColorJitter(brightness=(0.5, 0.5), contrast=(1, 1), saturation=(1, 1), hue=(0, 0), p=0.5)
    noise = A.GaussNoise(std_range=(0.1, 0.1), p=0.5)
    for t in (dim, noise):
        out = GpuPipeline(spec(t), "cpu", seed=2).augment(list(x))
        same = [bool(torch.equal(a, b)) for a, b in zip(out, x)]
        assert out.dtype == torch.uint8 and 10 < sum(same) < 54, (t, sum(same))
        moved = (out.float() - x.float())[[i for i, kept in enumerate(same) if not kept]]
        if t is dim:  # half as bright, rounded
            expect = (x.float() * 0.5).round() - x.float()
            assert (moved - expect[[i for i, kept in enumerate(same) if not kept]]).abs().max() <= 1
        else:  # 10% of 255 a pixel, less where the clamp to 0..255 cut it
            assert 0.8 * 25.5 < float(moved.std()) < 1.05 * 25.5


def test_the_hue_turns_as_torchvisions_hsv_pair_turns_it():
    """The hue rotation written on RGB against torchvision's own RGB -> HSV -> RGB with the hue moved: the same up to
    float rounding (at most one level of 255, on a few pixels), grey and saturated pixels included; a whole turn
    gives the image back."""
    from torchvision.transforms.v2.functional._color import _hsv_to_rgb, _rgb_to_hsv

    from pipeprof.data.gpu_augment import _shift_hue

    g = torch.Generator().manual_seed(0)
    x = torch.randint(0, 256, (16, 3, 32, 32), dtype=torch.uint8, generator=g)
    x[:3] = x[:3, :1]  # grey: no hue to turn
    x[3:6, :, :, :16] = 255  # saturated channels
    y = x.float() / 255
    shift = torch.rand(16, 1, 1, generator=g) - 0.5
    hsv = _rgb_to_hsv(y)
    hsv[:, 0] = (hsv[:, 0] + shift) % 1.0
    want = (_hsv_to_rgb(hsv) * 255).round()
    got = (_shift_hue(y, shift) * 255).round()
    diff = (got - want).abs()
    assert diff.max() <= 1 and float((diff > 0).float().mean()) < 1e-3
    assert torch.equal(got[:3], x[:3].float())  # grey stays grey
    assert torch.equal((_shift_hue(y, torch.ones(16, 1, 1)) * 255).round(), x.float())


def test_crops_leave_one_size_and_a_missing_crop_is_said(encoded):
    x = GpuPipeline(spec(A.RandomResizedCrop((32, 48)), A.GaussianBlur(p=1.0)), "cpu").augment(
        GpuPipeline([], "cpu").decode(encoded)
    )
    assert tuple(x.shape) == (6, 3, 32, 48)
    mixed = [torch.zeros(3, 8, 8, dtype=torch.uint8), torch.zeros(3, 9, 8, dtype=torch.uint8)]
    with pytest.raises(ValueError, match="put a crop or resize to one size first"):
        GpuPipeline(spec(A.HorizontalFlip()), "cpu").augment(mixed)


def test_config_axis_and_its_errors(tmp_path):
    assert C.build({}).augment.device == ["cpu"]
    assert C.build({"augment": {"device": "cuda"}}).augment.device == ["cuda"]
    with pytest.raises(C.ConfigError, match="augment.device"):
        C.build({"augment": {"device": "tpu"}})
    with pytest.raises(C.ConfigError, match="augment.device: 'cuda' .* this run has none"):
        C.resolve(C.build({"augment": {"device": ["cpu", "cuda"]}}), cuda=False, bf16_ok=False, usable_cores=2)


def test_a_preset_the_gpu_cannot_run_fails_before_the_run(tmp_path):
    """Exit 2 material: the runner's early check names the transform before any dataset or run folder."""
    from pipeprof.orchestrate.runner import prepare

    mine = tmp_path / "mine.yaml"
    A.save(A.Compose([A.CenterCrop(64, 64), A.ChannelShuffle()]), str(mine), data_format="yaml")
    cfg = C.build({"augment": {"preset": str(mine), "device": "cuda"}, "out_dir": str(tmp_path / "out")})
    with pytest.raises(NoCounterpart, match="uses ChannelShuffle"):
        prepare(cfg, log=lambda *a: None)
    assert not list((tmp_path / "out").glob("*/run.json"))


def test_end_to_end_and_cpu_pipeline_trials_with_workers_that_read_bytes(tiny_dataset, quick_measure):
    """augment.device cuda on the CPU device: the workers read bytes, the training process decodes and
    augments, and its time is a column (device clock marks around it)."""
    from conftest import fixed_step_context
    from pipeprof.trials import TrialSpec, run_trial

    measure = C.MeasureConfig(**quick_measure | {"window_s": 0.2, "windows": 2, "max_windows": 2})
    src = source_class("files")(tiny_dataset)
    spec_ = dict(
        num_workers=1,
        batch_size=4,
        preset="standard",
        decoder="pil",
        image_size=64,
        source="files",
        augment_device="cuda",
        pin_memory=False,
    )
    with fixed_step_context(src, measure, 0.002) as ctx:
        e2e = run_trial(ctx, TrialSpec("end_to_end", model="fixed", precision="fp32", mode="train", **spec_))
        cpu = run_trial(ctx, TrialSpec("cpu_pipeline", **spec_))
    for row in (e2e, cpu):
        assert row["samples_per_s"] > 0 and 0 < row["device_pipeline_frac"] < 1
        assert row["device_decode_ms_mean"] > 0 and row["device_augment_ms_mean"] > 0
        assert set(k for k in row if k.startswith("stage_share.")) == {"stage_share.read", "stage_share.collate"}
    assert TrialSpec("end_to_end", **spec_).trial_id == "end_to_end/standard/gpu-augment/files/bs4/w1"


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_nvjpeg_decode_and_augment_on_cuda_match_the_cpu_path(encoded):
    chain = spec(A.CenterCrop(128, 128), A.Normalize(), A.pytorch.ToTensorV2())
    gpu, cpu = GpuPipeline(chain, "cuda")(encoded), GpuPipeline(chain, "cpu")(encoded)
    assert gpu.device.type == "cuda" and gpu.shape == cpu.shape
    # nvJPEG upsamples chroma otherwise than libjpeg-turbo (docs/measured.md, "The GPU pipeline": how far apart)
    assert float((gpu.cpu() - cpu).abs().mean()) < 4 / 255 / 0.224
    assert tuple(for_preset("heavy", 224, "cuda")(encoded).shape) == (6, 3, 224, 224)


def test_the_table_names_each_builder_once():
    assert len(set(TORCHVISION.values())) == len(TORCHVISION)


# ---- batch forms of the geometric transforms against their per-sample forms ----------------------------------


def smooth(h: int, w: int, seed: int = 0) -> torch.Tensor:
    """A CHW uint8 image of low-frequency colour waves: where antialiasing filters of different shapes agree."""
    import math

    yy, xx = torch.meshgrid(torch.linspace(0, 1, h), torch.linspace(0, 1, w), indexing="ij")
    phase = torch.rand(3, generator=torch.Generator().manual_seed(seed)) * 6
    return (
        torch.stack(
            [127.5 + 110 * torch.sin(2 * math.pi * (1.3 * xx + 0.8 * yy) + 2.5 * yy * xx + phase[c]) for c in range(3)]
        )
        .round()
        .to(torch.uint8)
    )


MIXED = [(120, 90), (90, 130), (100, 100), (64, 200), (150, 40), (120, 90)]


def levels(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    return (a.float() - b.float()).abs()


def rrc_box_reference(h, w, scale, ratio, u):
    """torchvision's RandomResizedCrop.get_params written out, fed the sample's 22 uniforms in order."""
    import math

    area = h * w
    for i in range(10):
        target = area * (scale[0] + (scale[1] - scale[0]) * u[2 * i])
        lo, hi = math.log(ratio[0]), math.log(ratio[1])
        aspect = math.exp(lo + (hi - lo) * u[2 * i + 1])
        cw, ch = int(round(math.sqrt(target * aspect))), int(round(math.sqrt(target / aspect)))
        if 0 < cw <= w and 0 < ch <= h:
            return [int(u[20] * (h - ch + 1)), int(u[21] * (w - cw + 1)), ch, cw]
    in_ratio = w / h
    cw, ch = (
        (w, int(round(w / min(ratio))))
        if in_ratio < min(ratio)
        else ((int(round(h * max(ratio))), h) if in_ratio > max(ratio) else (w, h))
    )
    return [(h - ch) // 2, (w - cw) // 2, ch, cw]


def test_a_batch_draws_what_its_samples_draw_one_by_one_and_boxes_follow_torchvision():
    from pipeprof.data.gpu_augment import _uniforms, rrc_boxes

    g1, g2 = torch.Generator().manual_seed(7), torch.Generator().manual_seed(7)
    assert torch.equal(_uniforms(g1, 300, 22), torch.cat([_uniforms(g2, 1, 22) for _ in range(300)]))
    sizes = torch.tensor([[375, 500], [500, 375], [7, 300], [300, 7], [1, 1], [40, 41]] * 50)
    for scale, ratio in [((0.08, 1.0), (3 / 4, 4 / 3)), ((0.9, 1.0), (2.0, 3.0)), ((0.5, 0.6), (0.2, 0.3))]:
        u = _uniforms(g1, len(sizes), 22)
        got = rrc_boxes(sizes, scale, ratio, u).tolist()
        assert got == [rrc_box_reference(h, w, scale, ratio, row) for (h, w), row in zip(sizes.tolist(), u.tolist())]


def test_resized_crops_in_one_roi_align_match_torchvision_per_sample_on_mixed_sizes():
    """Boxes inside images of six sizes padded into one batch: within half a level of torchvision's resized_crop
    on average on smooth images (a box filter against its triangle filter; the outer row and column also read
    the image half a pixel past the box, where torchvision's crop stops at it: up to a tenth of a steep image's
    step per pixel there), and each image exactly as it comes out alone (the padding repeats the edge, which is
    what roi_align reads half a pixel past a box at the image's edge)."""
    from torchvision.transforms.v2 import functional as F

    from pipeprof.data.gpu_augment import _uniforms, resized_crops, rrc_boxes

    images = [smooth(h, w, i) for i, (h, w) in enumerate(MIXED)]
    sizes = torch.tensor(MIXED)
    boxes = rrc_boxes(sizes, (0.08, 1.0), (3 / 4, 4 / 3), _uniforms(torch.Generator().manual_seed(1), 6, 22))
    boxes[0] = torch.tensor([30, 20, 90, 70])  # ends at the bottom-right edge
    for size in ([48, 40], [160, 150]):  # downscale and upscale
        got = resized_crops(images, boxes, size)
        ref = torch.stack([F.resized_crop(img, *b.tolist(), size, antialias=True) for img, b in zip(images, boxes)])
        assert got.shape == ref.shape == (6, 3, *size) and got.dtype == torch.uint8
        assert float(levels(got, ref).mean()) < 0.5 and float(levels(got, ref)[..., 1:-1, 1:-1].max()) <= 4
        alone = torch.cat([resized_crops([img], b.view(1, 4), size) for img, b in zip(images, boxes)])
        assert torch.equal(got, alone)
        assert torch.equal(resized_crops(images, boxes, size, budget=3 * 130 * 130), got)  # several padded groups


def _interpreted(tmp_path, kernel: str, compute: str, data: dict) -> list:
    """``compute`` (an expression over ``d``, the saved ``data``) in a process of its own under Triton's interpreter,
    which runs pipeprof's Triton kernels on CPU tensors (the interpreter is chosen as Triton loads): its result, after
    checking that ``kernel`` launched there (not the torch form it falls back to)."""
    torch.save(data, tmp_path / "in.pt")
    script = (
        "import sys, torch\n"
        "from pipeprof.data import gpu_kernels\n"
        "from pipeprof.data.gpu_augment import TORCHVISION, resized_crops\n"
        "d = torch.load(sys.argv[1])\n"
        f"out = {compute}\n"
        f"assert {kernel!r} in gpu_kernels.launched().split(','), gpu_kernels.BROKEN\n"
        "torch.save(out, sys.argv[2])\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", script, str(tmp_path / "in.pt"), str(tmp_path / "out.pt")],
        env={**os.environ, "TRITON_INTERPRET": "1"},
        capture_output=True,
    )
    assert done.returncode == 0, done.stderr.decode()[-2000:]
    return torch.load(tmp_path / "out.pt")


def test_the_resize_kernel_computes_what_roi_align_does_over_the_padded_batch(tmp_path):
    """The Triton kernel, run by Triton's interpreter on CPU tensors, against roi_align over the padded batch here:
    images of mixed sizes, one in HWC memory (the CPU decoder's), one of random pixels, one of a single pixel; uint8
    to float rounding (at most one level, on a few pixels at a tie), float to 1e-4; downscale and upscale. Here,
    without the interpreter, a CPU tensor takes the roi_align form."""
    pytest.importorskip("triton")
    from pipeprof.data import gpu_kernels
    from pipeprof.data.gpu_augment import _uniforms, resized_crops, rrc_boxes

    images = [smooth(h, w, i) for i, (h, w) in enumerate(MIXED)]
    images += [torch.randint(0, 256, (3, 1, 1), dtype=torch.uint8)]
    images[1] = images[1].permute(1, 2, 0).contiguous().permute(2, 0, 1)  # HWC memory, a CHW view
    images[2] = torch.randint(0, 256, (3, 100, 100), dtype=torch.uint8)  # steep: every tap counts
    sizes = torch.tensor([list(img.shape[-2:]) for img in images])
    boxes = rrc_boxes(sizes, (0.08, 1.0), (3 / 4, 4 / 3), _uniforms(torch.Generator().manual_seed(2), len(images), 22))
    boxes[0] = torch.tensor([30, 20, 90, 70])  # ends at the bottom-right edge
    cases = [(dt, size) for dt in (torch.uint8, torch.float32) for size in ([24, 20], [40, 36])]
    assert not gpu_kernels.usable(torch.device("cpu"))
    want = [resized_crops([i.to(dt) for i in images], boxes, size) for dt, size in cases]
    got = _interpreted(
        tmp_path,
        "resize",
        "[resized_crops([i.to(dt) for i in d['images']], d['boxes'], size) for dt, size in d['cases']]",
        {"images": images, "boxes": boxes, "cases": cases},
    )
    for (dt, size), ref, out in zip(cases, want, got):
        assert out.shape == ref.shape == (len(images), 3, *size) and out.dtype == ref.dtype == dt
        gap = (out.double() - ref.double()).abs()
        if dt == torch.uint8:
            assert float(gap.max()) <= 1 and int((gap > 0).sum()) <= gap.numel() // 200
        else:
            assert float(gap.max()) < 1e-4
        assert float((ref.double() - ref.double().flip(0)).abs().max()) > 10  # the images differ: gaps would show


def test_a_rows_kernels_are_those_launched_since_its_mark_not_an_earlier_trials():
    """``launched(since)`` names a kernel only if a launch went through after the mark: a standard-preset trial
    after a heavy one does not record the heavy one's colour kernel. A failed first launch names nothing."""
    from pipeprof.data import gpu_kernels

    before = gpu_kernels.launches()
    try:
        assert gpu_kernels._launch("test-ran", lambda: torch.zeros(1)) is not None
        with pytest.warns(UserWarning, match="test-failed"):
            assert gpu_kernels._launch("test-failed", lambda: 1 / 0) is None
        assert "test-ran" in gpu_kernels.launched(before).split(",")
        assert "test-failed" not in gpu_kernels.launched(before)
        later = gpu_kernels.launches()  # the next trial's mark: nothing launched since
        assert "test-ran" not in gpu_kernels.launched(later)
        gpu_kernels._launch("test-ran", lambda: torch.zeros(1))  # launched again: named again
        assert "test-ran" in gpu_kernels.launched(later)
    finally:
        gpu_kernels._LAUNCHED.pop("test-ran", None)
        gpu_kernels.BROKEN.pop("test-failed", None)


def test_the_colour_kernel_computes_what_the_torch_form_does(tmp_path):
    """ColorJitter's kernels (contrast's per-image sums, then one pass), run by Triton's interpreter, against the torch
    form here on the same draws: all four factors with a coin that leaves some samples as they were, contrast alone,
    and brightness, saturation and hue without contrast; a grey image (no hue) among random ones; uint8 to the level
    on all but a tie's pixel, float to 1e-5."""
    pytest.importorskip("triton")
    x = torch.randint(0, 256, (6, 3, 20, 24), dtype=torch.uint8, generator=torch.Generator().manual_seed(0))
    x[2] = 128
    chains = [
        {"brightness": (0.6, 1.4), "contrast": (0.6, 1.4), "saturation": (0.6, 1.4), "hue": (-0.1, 0.1), "p": 0.5},
        {"brightness": (1, 1), "contrast": (0.5, 1.5), "saturation": (1, 1), "hue": (0, 0), "p": 1.0},
        {"brightness": (0.2, 1.8), "contrast": (1, 1), "saturation": (0, 2), "hue": (-0.5, 0.5), "p": 1.0},
    ]
    cases = [(c, dt) for c in chains for dt in (torch.uint8, torch.float32)]
    compute = (
        "[TORCHVISION['ColorJitter'](c).batch(d['x'] if dt == torch.uint8 else d['x'] / 255, "
        "torch.Generator().manual_seed(3)) for c, dt in d['cases']]"
    )
    want = [
        TORCHVISION["ColorJitter"](c).batch(x if dt == torch.uint8 else x / 255, torch.Generator().manual_seed(3))
        for c, dt in cases
    ]
    got = _interpreted(tmp_path, "jitter", compute, {"x": x, "cases": cases})
    for (_, dt), ref, out in zip(cases, want, got):
        assert out.shape == ref.shape == x.shape and out.dtype == ref.dtype == dt
        gap = (out.double() - ref.double()).abs()
        assert float(gap.max()) <= (1 if dt == torch.uint8 else 1e-5) and int((gap > 1e-5).sum()) <= 2
        assert float((ref.double() - (x if dt == torch.uint8 else x / 255).double()).abs().max()) > 0.05  # it jittered
    kept = [i for i in range(6) if torch.equal(want[0][i], x[i])]  # the first chain's coin left these as they were
    assert 0 < len(kept) < 6 and all(torch.equal(got[0][i], x[i]) for i in kept)


def test_crops_and_resize_in_one_call_equal_the_per_sample_forms(encoded):
    """Decoded JPEGs of mixed sizes (and images smaller than the crop: pad_if_needed's fill, crop's zeros)."""
    images = GpuPipeline([], "cpu").decode(encoded) + [smooth(100, 700), smooth(40, 30)]
    for chain in (
        [A.RandomCrop(256, 320, pad_if_needed=True, fill=7)],
        [A.RandomCrop(120, 130)],
        [A.CenterCrop(301, 256)],
        [A.CenterCrop(200, 200), A.CenterCrop(101, 99)],
        [A.CenterCrop(64, 64), A.Resize(40, 30)],
    ):
        batch, one = (GpuPipeline(spec(*chain), "cpu", seed=2, batched=b).augment(images) for b in (True, False))
        assert batch.shape == one.shape and batch.dtype == one.dtype == torch.uint8 and torch.equal(batch, one)
    resized = GpuPipeline(spec(A.Resize(64, 48)), "cpu").augment([smooth(h, w) for h, w in MIXED])
    ref = torch.stack([F_().resize(smooth(h, w), [64, 48], antialias=True) for h, w in MIXED])
    assert resized.shape == (6, 3, 64, 48) and float(levels(resized, ref).mean()) < 1.0


def F_():
    from torchvision.transforms.v2 import functional

    return functional


@pytest.mark.parametrize(
    "angle, translate, scale, shear",
    [
        (0.0, (0, 0), 1.0, (0.0, 0.0)),
        (12.5, (3, -5), 1.08, (0.0, 0.0)),
        (-15.0, (-6, 2), 0.9, (4.0, -3.0)),
        (90.0, (0, 0), 1.0, (0.0, 0.0)),
        (7.0, (1, 1), 1.03, (-5.0, 5.0)),
    ],
)
def test_affine_in_one_grid_sample_matches_torchvision_per_sample(angle, translate, scale, shear):
    from pipeprof.data.gpu_augment import _inverse_matrices, affine_images

    x = torch.stack([smooth(96, 128, i) for i in range(3)])
    args = torch.tensor([[angle, *translate, scale, *shear]] * 3, dtype=torch.float64)
    got = affine_images(x, _inverse_matrices(args))
    ref = torch.stack(
        [
            F_().affine(
                img,
                angle=angle,
                translate=list(translate),
                scale=scale,
                shear=list(shear),
                interpolation=F_().InterpolationMode.BILINEAR,
                fill=0,
            )
            for img in x
        ]
    )
    assert got.shape == ref.shape and got.dtype == torch.uint8
    assert float(levels(got, ref)[..., 8:-8, 8:-8].mean()) < 0.05  # levels of 255, away from the borders
    assert float(levels(got, ref).mean()) < 0.05 and float(levels(got, ref).max()) <= 1  # and at them


def test_affine_and_blur_batch_forms_draw_per_sample_and_match_the_per_sample_forms():
    images = [smooth(80, 96, i) for i in range(40)]
    for chain in (
        [A.Affine(rotate=(-15, 15), scale=(0.9, 1.1), shear=(-5, 5), translate_percent=(-0.05, 0.05), p=0.7)],
        [A.GaussianBlur(blur_limit=(3, 7), sigma_limit=(0.5, 3.0), p=0.5)],
    ):
        batch, one = (GpuPipeline(spec(*chain), "cpu", seed=4, batched=b).augment(images) for b in (True, False))
        assert batch.shape == (40, 3, 80, 96) and batch.dtype == torch.uint8
        assert float(levels(batch, one).mean()) < 0.01 and float(levels(batch, one).max()) <= 1
        changed = sum(not torch.equal(a, b) for a, b in zip(batch, torch.stack(images)))
        assert 8 < changed < 36  # a coin per sample
    # images of two sizes: the affine runs per sample (no batch form without a common size), then a crop batches
    chain = spec(A.Affine(rotate=(-15, 15), p=1.0), A.CenterCrop(24, 24))
    ragged = [smooth(40, 50), smooth(30, 44, 1)]
    got, ref = (GpuPipeline(chain, "cpu", seed=2, batched=b).augment(ragged) for b in (True, False))
    assert got.shape == (2, 3, 24, 24) and torch.equal(got, ref)


def test_blur_kernels_of_several_sizes_in_one_convolution_match_torchvision():
    from pipeprof.data.gpu_augment import blur_images

    x = torch.stack([smooth(50, 60, i) for i in range(4)])
    x[:, :, 20:30, 25:35] = 255  # an edge for the kernel to show its size on
    ks, sigmas = torch.tensor([3, 7, 5, 3]), torch.tensor([0.5, 3.0, 1.2, 2.9], dtype=torch.float64)
    got = blur_images(x, ks, sigmas)
    ref = torch.stack([F_().gaussian_blur(img, [int(k)] * 2, [float(s)] * 2) for img, k, s in zip(x, ks, sigmas)])
    assert float(levels(got, ref).max()) <= 1 and float(levels(got, ref).mean()) < 0.01


@pytest.mark.parametrize("name", ["standard", "heavy"])
def test_presets_batched_and_per_sample_agree_on_decoded_images_of_mixed_sizes(name, encoded):
    images = GpuPipeline([], "cpu").decode(encoded)
    assert len({tuple(i.shape) for i in images}) > 1
    pipes = [for_preset(name, 96, "cpu", seed=9) for _ in range(2)]
    pipes[1].batched = False
    torch.manual_seed(0)  # GaussNoise draws its noise from torch's own generator
    batch = pipes[0].augment(images)
    torch.manual_seed(0)
    one = pipes[1].augment(images)
    assert batch.shape == one.shape == (6, 3, 96, 96) and batch.dtype == one.dtype == torch.float32
    assert float((batch - one).abs().mean()) < 3 / 255 / 0.224  # RandomResizedCrop's filter, on noisy photos


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_batch_forms_on_cuda_match_the_same_forms_on_cpu(encoded):
    """The same decoded images (decoded on the CPU) and seed: CUDA's resize and colour kernels (Triton's, where it
    runs), gather, grid_sample and grouped convolution give what the CPU's torch forms do, to rounding."""
    images = GpuPipeline([], "cpu").decode(encoded)
    for chain in (
        [A.RandomResizedCrop((224, 224))],
        [A.RandomCrop(300, 400, pad_if_needed=True)],
        [
            A.CenterCrop(256, 256),
            A.Affine(rotate=(-15, 15), shear=(-5, 5), p=0.7),
            A.GaussianBlur(blur_limit=(3, 7), p=0.5),
        ],
        [A.Resize(200, 180)],
        [A.CenterCrop(256, 256), A.ColorJitter(0.4, 0.4, 0.4, 0.1, p=0.8)],  # CUDA: the colour kernel
    ):
        cpu = GpuPipeline(spec(*chain), "cpu", seed=6).augment(images)
        gpu = GpuPipeline(spec(*chain), "cuda", seed=6).augment([img.cuda() for img in images])
        assert gpu.device.type == "cuda" and gpu.shape == cpu.shape and gpu.dtype == cpu.dtype
        assert float(levels(gpu.cpu(), cpu).mean()) < 0.1 and float(levels(gpu.cpu(), cpu).max()) <= 2


def test_a_batch_of_bytes_crosses_from_the_workers_as_one_tensor_and_decodes_as_the_files(tiny_dataset):
    """The workers read bytes; a batch reaches the training process as one flat tensor and each sample's
    length (one shared-memory segment, not one per sample), split there into views that decode as the
    files themselves do."""
    from torch.utils.data import DataLoader
    from torchvision.io import decode_jpeg

    from pipeprof.data.encoded import EncodedDataset, collate_encoded, unpacked

    src = source_class("files")(tiny_dataset)
    loader = DataLoader(EncodedDataset(src), batch_size=4, num_workers=1, collate_fn=collate_encoded)
    batch = next(iter(loader))
    assert batch["encoded"].dim() == 1 and batch["encoded"].dtype == torch.uint8
    files = [src.read(i) for i in range(4)]
    assert batch["lengths"].tolist() == [len(f) for f in files] and len(batch["encoded"]) == sum(map(len, files))
    views = unpacked(batch)
    assert [bytes(v.numpy()) for v in views] == files
    for got, want in zip(
        decode_jpeg(views), decode_jpeg([torch.frombuffer(bytearray(f), dtype=torch.uint8) for f in files])
    ):
        assert torch.equal(got, want)
