"""The training step's global switches: what each precision sets, and what a CUDA step reports."""
import pytest
import torch

from pipeprof.models import build as build_model
from pipeprof.step import Step, autotune_default, configure_precision


@pytest.mark.parametrize("precision, override, expected", [
    ("bf16", None, True), ("fp16", None, True), ("tf32", None, True),
    ("fp32", None, False),  # cuDNN's FP32 autotuning of VGG16 did not end in minutes on an H200
    ("fp32", True, True), ("bf16", False, False),
])
def test_cudnn_autotuning_by_precision_and_override(precision, override, expected):
    assert autotune_default(precision, override) is expected


def test_cpu_step_leaves_cuda_switches_alone():
    assert configure_precision(torch.device("cpu"), "fp32", cudnn_benchmark=True) == {
        "tf32": False, "cudnn_benchmark": False}


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
