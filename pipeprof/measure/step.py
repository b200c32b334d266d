"""The work the accelerator does per batch: a train step or an inference step.

A batch may arrive as ``uint8`` (a preset that leaves normalisation to the GPU)
or as normalised floats; uint8 is converted and normalised on the device, inside
the timed compute. Regions are bracketed with :class:`DeviceClock`, whose CUDA
events are read only after a synchronisation (see ``measure``).
"""

from __future__ import annotations

import time
from contextlib import contextmanager, nullcontext
from typing import Any, Callable, Optional

import torch
import torch.nn.functional as F
from torch.nn.parameter import is_lazy

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

    On, as in the reference training recipes, except in true FP32: there cuDNN's autotuning of
    a large model's first backward pass has not finished in minutes, while without it the step
    runs at its rate from its second step on (docs/measured.md, "The step").
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


def main_output(out: Any) -> torch.Tensor:
    """The tensor the default loss is taken on, whatever container the model returns.

    A tensor itself; a dict's ``'logits'``, else ``'out'`` (torchvision segmentation), else its
    first value; an object's ``.logits`` (torchvision's GoogLeNetOutputs / InceptionOutputs in
    train mode, Hugging Face outputs); a tuple or list's first element. Nested containers are
    followed. Raises TypeError naming the type when no tensor is found.
    """
    found = _innermost(out)
    if not isinstance(found, torch.Tensor):
        where = _type_name(out) + ("" if found is out else f" (its main entry is a {_type_name(found)})")
        raise TypeError(
            f"cannot find the output tensor in the model's {where}: expected a tensor, a tuple/list "
            "(first element), a dict ('logits' or 'out' key) or an object with .logits; "
            "pass loss_fn= to take the raw output"
        )
    return found


def _type_name(obj: Any) -> str:
    kind = type(obj)
    return kind.__qualname__ if kind.__module__ == "builtins" else f"{kind.__module__}.{kind.__qualname__}"


def _innermost(out: Any) -> Any:
    if isinstance(out, torch.Tensor):
        return out
    if isinstance(out, dict):
        inner = next((out[k] for k in ("logits", "out") if k in out), next(iter(out.values()), None))
    elif hasattr(out, "logits"):
        inner = out.logits  # before tuple: torchvision's aux-logit outputs are namedtuples
    elif isinstance(out, (tuple, list)) and out:
        inner = out[0]
    else:
        return out
    return _innermost(inner)


def check_labels(labels: torch.Tensor, num_outputs: Optional[int]) -> None:
    """Raise ValueError unless ``labels`` are class indices in ``[0, num_outputs)``.

    Meant for the host copy, before it goes to the device: on CUDA an out-of-range
    target is a device-side assert that poisons the context for every later trial,
    while a ValueError only fails this one. ``num_outputs`` None: only the dtype is checked.
    """
    if labels.is_floating_point() or labels.is_complex() or labels.dtype == torch.bool:
        raise ValueError(
            f"labels are {labels.dtype}, but cross-entropy needs integer class indices: "
            "return int labels from the dataset, or pass loss_fn= for a different target"
        )
    if num_outputs is None or labels.numel() == 0:
        return
    lo, hi = (int(v) for v in torch.aminmax(labels))
    if 0 <= lo and hi < num_outputs:
        return
    bad, fix = (
        (hi, f"build the model with num_classes >= {hi + 1} (config model.num_classes)")
        if hi >= num_outputs
        else (lo, f"map the labels to 0..{num_outputs - 1}")
    )
    raise ValueError(
        f"label {bad} is outside the model's {num_outputs} outputs (labels must be in "
        f"[0, {num_outputs})): {fix}, or pass loss_fn= for a different target"
    )


@contextmanager
def _buffers_kept(model: torch.nn.Module):
    """BatchNorm's running statistics as they were: the probe looks, it does not train."""
    saved = {name: b.clone() for name, b in model.named_buffers() if not is_lazy(b)}
    try:
        yield
    finally:
        with torch.no_grad():
            for name, b in model.named_buffers():
                if name in saved:
                    b.copy_(saved[name])


class Step:
    """One training (forward, backward, SGD step) or inference (no grad) step.

    The first batch the step sees (:meth:`run` during warm-up, or :meth:`synthetic_batch`)
    is probed once: see :meth:`probe`. ``num_classes`` is what the model was built with; the
    model's own output (``num_outputs``) decides the label range. ``loss_fn(output, target)``
    gets the model's raw output and the labels and returns a scalar tensor; None: cross-entropy
    on :func:`main_output`, with labels checked on the host to be in ``[0, num_outputs)``.
    """

    def __init__(
        self,
        model: torch.nn.Module,
        device: str | torch.device,
        precision: str = "fp32",
        mode: str = "train",
        channels_last: bool = False,
        num_classes: int = 1000,
        cudnn_benchmark: bool | None = None,
        loss_fn: Optional[Callable] = None,
        ddp: bool = False,
    ):
        self.device = torch.device(device)
        self.ddp = ddp  # wrap in DistributedDataParallel after the probe (an N-GPU trial's rank)
        self.precision, self.mode, self.num_classes, self.loss_fn = precision, mode, num_classes, loss_fn
        self.settings = configure_precision(self.device, precision, cudnn_benchmark)
        self.memory_format = torch.channels_last if channels_last else torch.contiguous_format
        # the memory format waits for the probe: lazy modules' parameters have no shape to convert yet
        self.model = model.to(self.device)
        self.model.train(mode == "train")
        self.optimizer = None  # made by the probe, once lazy modules have real parameters
        self.num_outputs: Optional[int] = None
        self.probed = False
        self.scaler = torch.amp.GradScaler("cuda") if precision == "fp16" and self.device.type == "cuda" else None
        self.clock = DeviceClock(self.device)
        shape = (1, 3, 1, 1)
        self._mean = torch.tensor(IMAGENET_MEAN, device=self.device).view(shape) * 255
        self._std = torch.tensor(IMAGENET_STD, device=self.device).view(shape) * 255

    def _autocast(self):
        dtype = AMP_DTYPES.get(self.precision)
        return torch.autocast(self.device.type, dtype=dtype) if dtype else nullcontext()

    def probe(self, images: torch.Tensor) -> Optional[int]:
        """One forward pass on the first 2 samples of ``images`` (host or device), before any timing.

        Learns ``num_outputs`` (the class dimension, dim 1, of the main output; None when the
        output has none, or when :func:`main_output` cannot read it and no default loss needs it:
        a ``loss_fn`` is given, or ``mode="inference"``),
        materialises lazy modules, then sets the memory format and makes the optimizer, which
        must see the real parameters. BatchNorm statistics are restored. Runs once; returns
        ``num_outputs``.
        """
        if not self.probed:
            x = self.prepare(images[:2].to(self.device))
            with torch.no_grad(), _buffers_kept(self.model), self._autocast():
                out = self.model(x)
            self.num_outputs = self._classes_of(out)
            self.model.to(memory_format=self.memory_format)
            if self.ddp:  # after lazy modules have real parameters: DDP broadcasts rank 0's to the others
                self.model = torch.nn.parallel.DistributedDataParallel(
                    self.model, device_ids=[self.device.index] if self.device.type == "cuda" else None
                )
            if self.mode == "train":
                self.optimizer = torch.optim.SGD(self.model.parameters(), lr=1e-3, momentum=0.9)
            self.probed = True
        return self.num_outputs

    def _classes_of(self, out: Any) -> Optional[int]:
        try:
            main = main_output(out)
        except TypeError:
            if self.loss_fn is None and self.mode != "inference":
                raise  # the default loss needs that tensor; inference computes no loss
            return None
        return int(main.shape[1]) if main.ndim >= 2 else None

    def to_device(self, images: torch.Tensor, labels: torch.Tensor):
        """Host→device copy (asynchronous from pinned memory); labels are checked first, on the host."""
        self.probe(images)
        if self.mode == "train" and self.loss_fn is None:
            check_labels(labels, self.num_outputs)
        x = images.to(self.device, non_blocking=True)
        y = labels.to(self.device, non_blocking=True)
        return x, y

    def prepare(self, x: torch.Tensor) -> torch.Tensor:
        if x.dtype == torch.uint8:
            x = (x.float() - self._mean) / self._std
        return x.contiguous(memory_format=self.memory_format)

    def loss(self, out: Any, y: torch.Tensor) -> torch.Tensor:
        """The scalar the backward pass starts from: ``loss_fn`` on the raw output, else cross-entropy."""
        return self.loss_fn(out, y) if self.loss_fn is not None else F.cross_entropy(main_output(out), y)

    def compute(self, x: torch.Tensor, y: torch.Tensor) -> None:
        self.probe(x)
        x = self.prepare(x)
        if self.mode == "inference":
            with torch.inference_mode(), self._autocast():
                self.model(x)
            return
        with self._autocast():
            loss = self.loss(self.model(x), y)
        self.optimizer.zero_grad(set_to_none=True)
        if self.scaler is None:
            loss.backward()
            self.optimizer.step()
        else:
            self.scaler.scale(loss).backward()
            self.scaler.step(self.optimizer)
            self.scaler.update()

    def run(self, images: torch.Tensor, labels: torch.Tensor, on_device: bool = False):
        """Copy (unless already on device) and compute; returns three clock marks.

        The first call probes the model (see :meth:`probe`) before its first mark.
        """
        self.probe(images)
        m0 = self.clock.mark()
        x, y = (images, labels) if on_device else self.to_device(images, labels)
        m1 = self.clock.mark()
        self.compute(x, y)
        return m0, m1, self.clock.mark()

    def synthetic_batch(self, batch_size: int, size: int, dtype: torch.dtype = torch.float32):
        """A batch already resident on the device, shaped and typed like the loader's.

        ``size`` is the image side in pixels. Probes the model first, so the labels lie in
        ``[0, num_outputs)`` (``[0, num_classes)`` when the output shows no class dimension).
        """
        g = torch.Generator(device="cpu").manual_seed(0)
        if dtype == torch.uint8:
            x = torch.randint(0, 256, (batch_size, 3, size, size), dtype=torch.uint8, generator=g)
        else:
            x = torch.randn(batch_size, 3, size, size, generator=g).to(dtype)
        self.probe(x)
        y = torch.randint(0, self.num_outputs or self.num_classes, (batch_size,), generator=g)
        return x.to(self.device), y.to(self.device)
