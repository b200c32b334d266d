"""The work the accelerator does per batch: a train step or an inference step.

A batch may arrive as ``uint8`` (a preset that leaves normalisation to the GPU)
or as normalised floats; uint8 is converted and normalised on the device, inside
the timed compute. Regions are bracketed with :class:`DeviceClock`, whose CUDA
events are read only after a synchronisation (see ``measure``).
"""
from __future__ import annotations

import time
from contextlib import nullcontext

import torch
import torch.nn.functional as F

IMAGENET_MEAN = (0.485, 0.456, 0.406)
IMAGENET_STD = (0.229, 0.224, 0.225)
AMP_DTYPES = {"fp16": torch.float16, "bf16": torch.bfloat16}


class DeviceClock:
    """Marks points in the device's stream: CUDA events on GPU, the host clock on CPU.

    ``elapsed_ms`` of CUDA marks is valid only after :meth:`sync`; callers sync at
    window boundaries, never per step, so the loop runs as asynchronously as a
    real training loop does.
    """

    def __init__(self, device: torch.device):
        self.cuda = device.type == "cuda"

    def mark(self):
        if not self.cuda:
            return time.perf_counter()
        event = torch.cuda.Event(enable_timing=True)
        event.record()
        return event

    def sync(self) -> None:
        if self.cuda:
            torch.cuda.synchronize()

    def elapsed_ms(self, a, b) -> float:
        return a.elapsed_time(b) if self.cuda else (b - a) * 1e3


def autotune_default(precision: str, override: bool | None = None) -> bool:
    """Whether cuDNN autotunes (``cudnn.benchmark``) for ``precision`` unless told otherwise.

    On, as in the reference training recipes, except in true FP32: there cuDNN 9.19 on an
    H200 did not finish autotuning VGG16's first backward pass in 35 s (nor in 190 s inside
    a sweep), while without autotuning the step ran at 558 (channels_last) – 590 samples/s
    from its second step on.
    """
    return precision != "fp32" if override is None else bool(override)


def configure_precision(device: torch.device, precision: str, cudnn_benchmark: bool | None = None) -> dict:
    """Set the global TF32 / cuDNN switches for ``precision``; returns what was set."""
    if device.type != "cuda":
        return {"tf32": False, "cudnn_benchmark": False}
    tf32 = precision != "fp32"  # fp32 means true FP32; AMP recipes keep TF32 for fp32 leftovers
    benchmark = autotune_default(precision, cudnn_benchmark)
    torch.backends.cuda.matmul.allow_tf32 = tf32
    torch.backends.cudnn.allow_tf32 = tf32
    torch.backends.cudnn.benchmark = benchmark
    return {"tf32": tf32, "cudnn_benchmark": benchmark}


class Step:
    """One training (forward, backward, SGD step) or inference (no grad) step."""

    def __init__(self, model: torch.nn.Module, device: str | torch.device, precision: str = "fp32",
                 mode: str = "train", channels_last: bool = False, num_classes: int = 1000,
                 cudnn_benchmark: bool | None = None):
        self.device = torch.device(device)
        self.precision, self.mode, self.num_classes = precision, mode, num_classes
        self.settings = configure_precision(self.device, precision, cudnn_benchmark)
        self.memory_format = torch.channels_last if channels_last else torch.contiguous_format
        self.model = model.to(self.device, memory_format=self.memory_format)
        self.model.train(mode == "train")
        self.optimizer = torch.optim.SGD(self.model.parameters(), lr=1e-3, momentum=0.9) if mode == "train" else None
        self.scaler = torch.amp.GradScaler("cuda") if precision == "fp16" and self.device.type == "cuda" else None
        self.clock = DeviceClock(self.device)
        shape = (1, 3, 1, 1)
        self._mean = torch.tensor(IMAGENET_MEAN, device=self.device).view(shape) * 255
        self._std = torch.tensor(IMAGENET_STD, device=self.device).view(shape) * 255

    def _autocast(self):
        dtype = AMP_DTYPES.get(self.precision)
        return torch.autocast(self.device.type, dtype=dtype) if dtype else nullcontext()

    def to_device(self, images: torch.Tensor, labels: torch.Tensor):
        """Host→device copy (asynchronous from pinned memory) and on-device normalisation of uint8."""
        x = images.to(self.device, non_blocking=True)
        y = labels.to(self.device, non_blocking=True) % self.num_classes
        return x, y

    def prepare(self, x: torch.Tensor) -> torch.Tensor:
        if x.dtype == torch.uint8:
            x = (x.float() - self._mean) / self._std
        return x.contiguous(memory_format=self.memory_format)

    def compute(self, x: torch.Tensor, y: torch.Tensor) -> None:
        x = self.prepare(x)
        if self.mode == "inference":
            with torch.inference_mode(), self._autocast():
                self.model(x)
            return
        with self._autocast():
            out = self.model(x)
            logits = out if isinstance(out, torch.Tensor) else out[0]  # inception/googlenet aux outputs
            loss = F.cross_entropy(logits, y)
        self.optimizer.zero_grad(set_to_none=True)
        if self.scaler is None:
            loss.backward()
            self.optimizer.step()
        else:
            self.scaler.scale(loss).backward()
            self.scaler.step(self.optimizer)
            self.scaler.update()

    def run(self, images: torch.Tensor, labels: torch.Tensor, on_device: bool = False):
        """Copy (unless already on device) and compute; returns three clock marks."""
        m0 = self.clock.mark()
        x, y = (images, labels) if on_device else self.to_device(images, labels)
        m1 = self.clock.mark()
        self.compute(x, y)
        return m0, m1, self.clock.mark()

    def synthetic_batch(self, batch_size: int, size: int, dtype: torch.dtype = torch.float32):
        """A batch already resident on the device, shaped and typed like the loader's."""
        g = torch.Generator(device="cpu").manual_seed(0)
        if dtype == torch.uint8:
            x = torch.randint(0, 256, (batch_size, 3, size, size), dtype=torch.uint8, generator=g)
        else:
            x = torch.randn(batch_size, 3, size, size, generator=g).to(dtype)
        y = torch.randint(0, self.num_classes, (batch_size,), generator=g)
        return x.to(self.device), y.to(self.device)
