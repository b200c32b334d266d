"""The training step's global switches: what each precision sets, and what a CUDA step reports."""

import pytest
import torch

from pipeprof.measure.step import Step, autotune_default, configure_precision
from pipeprof.models import build as build_model


@pytest.mark.parametrize(
    "precision, override, expected",
    [
        ("bf16", None, True),
        ("fp16", None, True),
        ("tf32", None, True),
        ("fp32", None, False),  # cuDNN's FP32 autotuning of VGG16 did not end in minutes on an H200
        ("fp32", True, True),
        ("bf16", False, False),
    ],
)
def test_cudnn_autotuning_by_precision_and_override(precision, override, expected):
    assert autotune_default(precision, override) is expected


def test_cpu_step_leaves_cuda_switches_alone():
    assert configure_precision(torch.device("cpu"), "fp32", cudnn_benchmark=True) == {
        "tf32": False,
        "cudnn_benchmark": False,
    }


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_fp32_step_turns_tf32_and_autotuning_off_on_cuda():
    step = Step(build_model("resnet18", 10), "cuda", "fp32", num_classes=10)
    assert step.settings == {"tf32": False, "cudnn_benchmark": False}
    assert not torch.backends.cudnn.allow_tf32 and not torch.backends.cudnn.benchmark
    x, y = step.synthetic_batch(2, 64)
    m = step.run(x, y, on_device=True)
    step.clock.sync()
    assert step.clock.elapsed_ms(m[1], m[2]) > 0


# ---- the step learns the model: output shape, lazy modules, labels, user loss ----------

import re  # noqa: E402
from dataclasses import dataclass  # noqa: E402

import torchvision  # noqa: E402
from torch import nn  # noqa: E402
from torch.nn import functional as F  # noqa: E402
from torchvision.models.inception import InceptionOutputs  # noqa: E402

import pipeprof  # noqa: E402
from pipeprof.measure.step import main_output  # noqa: E402

LOGITS, AUX = torch.randn(2, 4), torch.randn(2, 4)


@dataclass
class ClassifierOutput:
    """The shape of a Hugging Face output: fields, ``.logits`` among them."""

    loss: torch.Tensor | None
    logits: torch.Tensor


def googlenet(num_classes: int = 4):
    return torchvision.models.googlenet(weights=None, num_classes=num_classes, init_weights=False, aux_logits=True)


def googlenet_outputs():
    out = googlenet().train()(torch.rand(2, 3, 96, 96))
    assert type(out).__name__ == "GoogLeNetOutputs"
    return out, out.logits


@pytest.mark.parametrize(
    "make",
    [
        lambda: (LOGITS, LOGITS),
        lambda: ((LOGITS, AUX), LOGITS),
        lambda: ([LOGITS, AUX], LOGITS),
        googlenet_outputs,
        lambda: (InceptionOutputs(LOGITS, AUX), LOGITS),
        lambda: ({"aux": AUX, "logits": LOGITS}, LOGITS),
        lambda: ({"aux": AUX, "out": LOGITS}, LOGITS),  # torchvision segmentation
        lambda: ({"pred": LOGITS, "aux": AUX}, LOGITS),
        lambda: (ClassifierOutput(None, LOGITS), LOGITS),
    ],
    ids=[
        "tensor",
        "tuple",
        "list",
        "googlenet-namedtuple",
        "inception-namedtuple",
        "dict-logits",
        "dict-out",
        "dict-first",
        "object-logits",
    ],
)
def test_main_output_finds_the_logits(make):
    out, expected = make()
    assert main_output(out) is expected


@pytest.mark.parametrize("out", [{}, (), "text", object()])
def test_main_output_names_the_type_it_cannot_read(out):
    with pytest.raises(TypeError, match=re.escape(type(out).__qualname__)):
        main_output(out)


def resnet_step(**kw):
    return Step(torchvision.models.resnet18(num_classes=4), "cpu", **kw)


def test_step_learns_the_outputs_and_draws_labels_in_range():
    step = resnet_step()  # num_classes keeps its 1000 default: the model's 4 outputs decide
    x, y = step.synthetic_batch(4, 64)
    assert step.num_outputs == 4 and y.min() >= 0 and y.max() < 4
    step.run(x, y, on_device=True)


def test_step_trains_on_the_datasets_labels_unchanged():
    step = resnet_step()
    images, labels = torch.rand(4, 3, 64, 64), torch.tensor([0, 3, 1, 2])
    step.run(images, labels)
    assert torch.equal(labels, torch.tensor([0, 3, 1, 2]))
    assert step.to_device(images, labels)[1].tolist() == [0, 3, 1, 2]


def test_out_of_range_label_is_a_value_error_naming_the_fix():
    step = resnet_step()
    with pytest.raises(ValueError) as err:
        step.run(torch.rand(4, 3, 64, 64), torch.tensor([0, 7, 1, 2]))
    assert "label 7" in str(err.value) and "4 outputs" in str(err.value) and "num_classes >= 8" in str(err.value)


def test_probe_leaves_batchnorm_statistics_alone():
    step = resnet_step()
    before = step.model.bn1.running_mean.clone()
    step.probe(torch.rand(2, 3, 64, 64))
    assert torch.equal(step.model.bn1.running_mean, before)


def test_lazy_modules_are_materialised_before_the_optimizer_and_channels_last():
    model = nn.Sequential(nn.LazyConv2d(4, 3), nn.ReLU(), nn.Flatten(), nn.LazyLinear(10))
    step = Step(model, "cpu", channels_last=True)
    x, y = step.synthetic_batch(2, 16)
    head = step.model[3].weight
    assert step.num_outputs == 10 and step.model[0].weight.is_contiguous(memory_format=torch.channels_last)
    assert any(p is head for group in step.optimizer.param_groups for p in group["params"])
    before = head.detach().clone()
    step.run(x, y, on_device=True)
    assert not torch.equal(head.detach(), before)


class TupleNet(nn.Module):
    """Returns (logits, aux) like inception: as a namedtuple, or as a plain tuple."""

    def __init__(self, named: bool, outputs: int = 4):
        super().__init__()
        self.named = named
        self.body = nn.Sequential(nn.Conv2d(3, 4, 3), nn.AdaptiveAvgPool2d(1), nn.Flatten())
        self.fc, self.aux = nn.Linear(4, outputs), nn.Linear(4, outputs)

    def forward(self, x):
        h = self.body(x)
        out = (self.fc(h), self.aux(h))
        return InceptionOutputs(*out) if self.named else out


@pytest.mark.parametrize(
    "model, main, aux",
    [
        (lambda: googlenet(), "fc", "aux1"),
        (lambda: TupleNet(named=True), "fc", "aux"),
        (lambda: TupleNet(named=False), "fc", "aux"),
    ],
    ids=["googlenet", "inception-namedtuple", "tuple"],
)
def test_aux_logit_models_train_on_their_main_output(model, main, aux):
    step = Step(model(), "cpu")
    x, y = step.synthetic_batch(2, 64)
    step.run(x, y, on_device=True)
    assert step.num_outputs == 4
    assert all(p.grad is not None for p in getattr(step.model, main).parameters())
    assert all(p.grad is None for p in getattr(step.model, aux).parameters())  # no loss on the aux head


def test_user_loss_gets_the_raw_output_and_any_target():
    seen = []

    def one_hot_mse(out, target):
        seen.append((type(out), target.clone()))
        return F.mse_loss(out[0], F.one_hot(target, 8)[:, :4].float())

    step = Step(TupleNet(named=False), "cpu", loss_fn=one_hot_mse)
    before = step.model.fc.weight.detach().clone()
    step.run(torch.rand(2, 3, 16, 16), torch.tensor([7, 1]))  # 7: out of the 4 outputs, fine for this loss
    assert seen[0][0] is tuple and seen[0][1].tolist() == [7, 1]
    assert not torch.equal(step.model.fc.weight.detach(), before)


def test_user_loss_takes_float_targets_and_outputs_main_output_cannot_read():
    class Pair(nn.Module):
        """Returns a set first: nothing main_output can take."""

        def __init__(self):
            super().__init__()
            self.conv = nn.Conv2d(3, 1, 1)

        def forward(self, x):
            return {"a", "b"}, self.conv(x).mean((1, 2, 3))

    step = Step(
        nn.Sequential(nn.Conv2d(3, 1, 1), nn.Flatten(0)),
        "cpu",
        loss_fn=lambda out, target: F.mse_loss(out[: target.numel()], target),
    )
    step.run(torch.rand(2, 3, 4, 4), torch.tensor([0.5, 2.5]))
    odd = Step(Pair(), "cpu", loss_fn=lambda out, target: out[1].sum())
    x, y = odd.synthetic_batch(2, 8)
    assert odd.num_outputs is None and y.max() < odd.num_classes
    with pytest.raises(TypeError, match="set"):
        Step(Pair(), "cpu").synthetic_batch(2, 8)


def test_inference_takes_outputs_main_output_cannot_read_without_a_loss():
    class Boxes:
        """A detection-style result: no tensor main_output could find."""

        def __init__(self, scores):
            self.scores = scores

    class Detector(nn.Module):
        def __init__(self):
            super().__init__()
            self.conv = nn.Conv2d(3, 2, 1)

        def forward(self, x):
            return Boxes(self.conv(x).mean((2, 3)))

    step = Step(Detector(), "cpu", mode="inference")
    marks = step.run(torch.rand(2, 3, 8, 8), torch.tensor([0, 1]))
    assert len(marks) == 3 and step.probed and step.num_outputs is None
    with pytest.raises(TypeError, match="Boxes"):
        Step(Detector(), "cpu").run(torch.rand(2, 3, 8, 8), torch.tensor([0, 1]))  # train: the loss needs it


class TenClasses(torch.utils.data.Dataset):
    def __init__(self, labels: int = 10, n: int = 24):
        self.labels, self.n = labels, n

    def __len__(self):
        return self.n

    def __getitem__(self, i):
        return torch.rand(3, 16, 16), i % self.labels


def profile_ten_outputs(dataset, tmp_path):
    run = pipeprof.profile(
        dataset,
        model=nn.Sequential(nn.Flatten(), nn.LazyLinear(10)),
        batch_size=4,
        num_workers=[0],
        trials=["gpu_ceiling", "end_to_end"],
        out_dir=str(tmp_path),
        device="cpu",
        log=lambda *a: None,
        measure={
            "warmup_batches": 1,
            "warmup_s": 0.1,
            "warmup_max_s": 0.5,
            "window_s": 0.2,
            "window_batches": 2,
            "windows": 2,
            "max_windows": 2,
            "redraws": 10,
            "cpu_reference_s": 0,
        },
    )  # a status, not a rate
    return run.trials.set_index("kind")


def test_profile_a_ten_output_model_on_its_own_labels(tmp_path):
    rows = profile_ten_outputs(TenClasses(), tmp_path)
    assert (rows["status"] == "ok").all(), rows["error"].to_dict()


def test_profile_reports_labels_beyond_the_models_outputs_as_a_trial_error(tmp_path):
    rows = profile_ten_outputs(TenClasses(labels=12), tmp_path)
    assert rows.loc["gpu_ceiling", "status"] == "ok", rows["error"].to_dict()
    assert rows.loc["end_to_end", "status"] == "error"
    assert re.search(
        r"label 1[01] is outside the model's 10 outputs .*num_classes >= 1[12]", rows.loc["end_to_end", "error"]
    )


def test_model_loss_must_be_an_import_path(tmp_path):
    from pipeprof.config import ConfigError, build
    from pipeprof.orchestrate.runner import execute

    assert build({"model": {"loss": "torch.nn.functional:mse_loss"}}).model.loss == "torch.nn.functional:mse_loss"
    with pytest.raises(ConfigError, match="model.loss"):
        build({"model": {"loss": "torch.nn.functional.mse_loss"}})
    with pytest.raises(ConfigError, match="model.loss: cannot import 'pipeprof.nowhere:loss'"):
        execute(
            build({"model": {"loss": "pipeprof.nowhere:loss"}, "device": "cpu", "out_dir": str(tmp_path)}),
            log=lambda *a: None,
        )  # refused at validation, before execute
    assert not any(tmp_path.iterdir())  # refused before a run folder was made
