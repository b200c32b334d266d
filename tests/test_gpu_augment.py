"""The GPU pipeline (augment.device: cuda): the albumentations -> torchvision table, its errors, and the v2
pipeline's output, run on CPU tensors (the device is a parameter). True CUDA runs are marked ``gpu``."""
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
    with pytest.raises(NoCounterpart, match=r"uses CoarseDropout, which has no torchvision counterpart.*"
                                            r"mapped: RandomResizedCrop, RandomCrop") as err:
        ops_of(spec(A.CenterCrop(8, 8), A.CoarseDropout()), "preset 'mine'")
    assert isinstance(err.value, C.ConfigError) and "preset 'mine'" in str(err.value)
    with pytest.raises(NoCounterpart, match="normalization='image'"):
        ops_of(spec(A.Normalize(normalization="image")))


@pytest.mark.parametrize("name, dtype", [("light", torch.uint8), ("standard", torch.float32),
                                         ("heavy", torch.float32)])
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
    cpu = torch.stack([torch.as_tensor(A.Compose(chain)(image=decode_pil(bytes(e.numpy())))["image"])
                       for e in encoded[:2]])
    assert gpu.shape == cpu.shape == (2, 3, 128, 128) and gpu.dtype == cpu.dtype == torch.float32
    assert float((gpu - cpu).abs().mean()) < 2 / 255 / 0.224


def test_flip_and_colour_draw_their_parameters_per_sample():
    x = torch.randint(0, 256, (64, 3, 8, 8), dtype=torch.uint8)
    always = GpuPipeline(spec(A.HorizontalFlip(p=1.0)), "cpu").augment(list(x))
    assert torch.equal(always, x.flip(-1))
    half = GpuPipeline(spec(A.HorizontalFlip(p=0.5)), "cpu", seed=1).augment(list(x))
    flipped = [bool(torch.equal(a, b.flip(-1))) for a, b in zip(half, x)]
    assert 10 < sum(flipped) < 54  # per sample, not one coin for the whole batch
    dim = GpuPipeline(spec(A.ColorJitter(brightness=(0.5, 0.5), contrast=(1, 1), saturation=(1, 1), hue=(0, 0),
                                         p=1.0)), "cpu").augment(list(x))
    assert dim.dtype == torch.uint8 and (dim.int() - (x.float() * 0.5).round().int()).abs().max() <= 1


def test_crops_leave_one_size_and_a_missing_crop_is_said(encoded):
    x = GpuPipeline(spec(A.RandomResizedCrop((32, 48)), A.GaussianBlur(p=1.0)), "cpu").augment(
        GpuPipeline([], "cpu").decode(encoded))
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
    from pipeprof.checks.calibrate import FixedStepModel
    from pipeprof.measure.monitors import Monitor
    from pipeprof.trials import TrialContext, TrialSpec, run_trial

    measure = C.MeasureConfig(**quick_measure | {"window_s": 0.2, "windows": 2, "max_windows": 2})
    src = source_class("files")(tiny_dataset)
    spec_ = dict(num_workers=1, batch_size=4, preset="standard", decoder="pil", image_size=64, source="files",
                 augment_device="cuda", pin_memory=False)
    with Monitor(hz=10, gpu=False) as mon:
        ctx = TrialContext(torch.device("cpu"), src, measure, mon, num_classes=10, sources={"files": src},
                           models={"fixed": lambda: FixedStepModel(0.002, 10)}, step_threads=1)
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
    assert float((gpu.cpu() - cpu).abs().mean()) < 2 / 255 / 0.224
    assert tuple(for_preset("heavy", 224, "cuda")(encoded).shape) == (6, 3, 224, 224)


def test_the_table_names_each_builder_once():
    assert len(set(TORCHVISION.values())) == len(TORCHVISION)
