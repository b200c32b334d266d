"""The user's samples, checked once before anything is timed: what ``__getitem__`` returns for the first
sample, and whether the first batch can be made of them by the collate the trials use (passed in: the
trials' ``collate_user``, so the check and the trials batch alike).

pipeprof's loader over a user's Dataset takes ``(image, label, ...)`` samples: the image a C×H×W tensor
(or ndarray) of uint8 or floating point, every sample of one size; the label a class index. What is not
is refused with what would fix it where that is unambiguous (a PIL image needs ToTensor, an H×W×C array
a permute, samples of different sizes a crop or a collate_fn of their own), as a ConfigError: the run
stops before its folder exists, exit 2 on the command line, instead of every trial failing alike.
"""

from __future__ import annotations

import threading
from itertools import islice
from typing import Callable, NamedTuple

import numpy as np
import torch
from torch.utils.data import IterableDataset

from pipeprof.config import ConfigError

#: samples the batch check reads: enough to meet a second size in a dataset of mixed sizes, few enough that
#: a slow ``__getitem__`` (10 ms) costs a third of a second
FIRST_BATCH_MOST = 32
FIRST_BATCH_BYTES = 256e6  # ...and past this many bytes two samples stand for the batch (4K images and up)
CHANNELS = (1, 3, 4)  # a first or last axis of this length is a channel axis
FORM = "(image, label) with the image a C×H×W tensor"
OWN_COLLATE = (
    "or bring your own DataLoader with a collate_fn that batches them (profile(loader=fn(num_workers)), "
    "or data.kind: loader)"
)


class SampleFacts(NamedTuple):
    """What the first sample says about every sample: the step's synthetic batch copies it."""

    dtype: str  # the image's dtype without "torch.": uint8, float32, ...
    side: int  # the image's width in pixels
    shape: tuple  # the image's C, H, W


def dims(shape) -> str:
    return "×".join(str(int(n)) for n in shape)


def describe(obj) -> str:
    """What a sample (or a part of one) is, for a message: its type, and its mode, dtype and shape."""
    if isinstance(obj, torch.Tensor):
        return f"a {str(obj.dtype).removeprefix('torch.')} tensor of shape {dims(obj.shape) or 'scalar'}"
    if isinstance(obj, np.ndarray):
        return f"a {obj.dtype} ndarray of shape {dims(obj.shape) or 'scalar'}"
    if _is_pil(obj):
        return f"a PIL image ({obj.mode}, {obj.width}×{obj.height})"
    if isinstance(obj, dict):
        return f"a dict with keys {sorted(map(str, obj))}"
    if isinstance(obj, (tuple, list)):
        return f"a {type(obj).__name__} of {len(obj)} ({', '.join(describe(x) for x in obj[:4])})"
    return f"a {type(obj).__name__} ({obj!r:.40})"


def _is_pil(obj) -> bool:
    return type(obj).__module__.startswith("PIL.")  # without importing Pillow for a dataset that does not


def image_fix(image) -> str | None:
    """Why ``image`` cannot be a sample's image and what would make it one; None when it can."""
    if _is_pil(image):
        return (
            "the loader batches tensors: add torchvision.transforms.ToTensor() (floats in [0, 1]) or "
            "PILToTensor() (uint8, normalised on the device) at the end of the dataset's transform"
        )
    if not isinstance(image, (torch.Tensor, np.ndarray)):
        return f"the image must be a C×H×W tensor; return {FORM}"
    shape, dtype = tuple(image.shape), str(image.dtype).removeprefix("torch.")
    if len(shape) == 2:
        return "a grey image needs a channel axis: image.unsqueeze(0) (or image[None] for an ndarray)"
    if len(shape) != 3:
        return f"the image must have 3 axes, C×H×W, not {len(shape)}"
    if shape[-1] in CHANNELS and shape[0] not in CHANNELS:
        return (
            f"channels last (H×W×C = {dims(shape)}): the model takes C×H×W; add ToTensor(), or "
            "torch.from_numpy(a).permute(2, 0, 1) for an ndarray (image.permute(2, 0, 1) for a tensor)"
        )
    if dtype in ("float64", "double"):
        return "64-bit floats: the model's weights are 32-bit; convert with image.float() (a.astype('float32'))"
    if dtype != "uint8" and not dtype.startswith(("float", "bfloat")):
        return (
            f"images of dtype {dtype}: the step takes uint8 (0–255, normalised on the device) or floating "
            "point; convert with .to(torch.uint8) when the values are 0–255, else .float()"
        )
    return None


def label_fix(label) -> str | None:
    """Why ``label`` cannot be a class index and what would make it one; None when it can."""
    try:
        value = float(torch.as_tensor(label).reshape(-1)[0]) if torch.as_tensor(label).numel() == 1 else None
    except (TypeError, ValueError, RuntimeError):
        value = None
    if value is None or value != int(value):
        return (
            "the label must be a class index (an int, or a one-element tensor); for one-hot or soft labels "
            "return the index (label.argmax())"
        )
    return None


def _read(dataset, count: int, samples: list) -> None:
    """Append the first ``count`` samples to ``samples`` (by index, or from the iterator of an IterableDataset),
    stopping early past :data:`FIRST_BATCH_BYTES`."""
    if isinstance(dataset, IterableDataset):
        samples.extend(islice(iter(dataset), count))
        return
    held = 0
    for index in range(min(count, len(dataset))):
        samples.append(dataset[index])
        held += _nbytes(samples[-1])
        if held > FIRST_BATCH_BYTES and len(samples) >= 2:
            return


def read_first(dataset, count: int, cap_s: float) -> list:
    """The first samples, read in a thread of their own that the caller waits ``cap_s`` for: a
    ``__getitem__`` that blocks would otherwise hang the run before anything is timed (and Python cannot
    interrupt it; the thread stays blocked, cut off, as a trial's does). ConfigError naming the sample that
    raised or did not return."""
    samples: list = []
    failed: list = []

    def read():
        try:
            _read(dataset, count, samples)
        except Exception as exc:  # the user's code: any failure means no sample to measure with
            failed.append(exc)

    thread = threading.Thread(target=read, name="pipeprof-sample-check", daemon=True)
    thread.start()
    thread.join(cap_s)
    if thread.is_alive():
        raise ConfigError(
            f"data: the dataset's sample {len(samples)} did not return in {cap_s:g} s "
            "(measure.max_trial_s): its __getitem__ blocks; every trial reading it would hang"
        )
    if failed:
        exc = failed[0]
        raise ConfigError(
            f"data: the dataset's sample {len(samples)} raised {type(exc).__name__}: {exc}; every "
            "trial reading it would fail the same way"
        )
    return samples


def _nbytes(sample) -> int:
    image = sample[0] if isinstance(sample, (tuple, list)) and sample else sample
    return int(image.nbytes) if isinstance(image, (torch.Tensor, np.ndarray)) else 0


def check_sample(sample) -> SampleFacts:
    """The facts of one sample in the accepted form, else ConfigError saying what it is and what fixes it."""
    if not isinstance(sample, (tuple, list)) or len(sample) < 2:
        hint = (
            "return (sample['image'], sample['label']) from __getitem__"
            if isinstance(sample, dict)
            else "add the label"
        )
        raise ConfigError(
            f"data: the dataset returns {describe(sample)}; the loader takes {FORM}: {hint}, {OWN_COLLATE}"
        )
    image, label = sample[0], sample[1]
    fix = image_fix(image)
    if fix is not None:
        raise ConfigError(f"data: the dataset's image is {describe(image)}: {fix}")
    fix = label_fix(label)
    if fix is not None:
        raise ConfigError(f"data: the dataset's label is {describe(label)}: {fix}")
    shape = tuple(int(n) for n in image.shape)
    return SampleFacts(str(image.dtype).removeprefix("torch."), shape[-1], shape)


def check_batch(samples: list, collate: Callable) -> None:
    """The first batch, made by ``collate`` as the trials make it; ConfigError when it cannot be."""
    shapes = [tuple(int(n) for n in np.shape(s[0])) for s in samples]
    other = next((k for k, shape in enumerate(shapes) if shape != shapes[0]), None)
    if other is not None:
        raise ConfigError(
            f"data: samples differ in size: {dims(shapes[0])} (sample 0) vs {dims(shapes[other])} "
            f"(sample {other}); crop or resize them to one size (e.g. Resize and CenterCrop, or "
            f"RandomResizedCrop), {OWN_COLLATE}"
        )
    try:
        collate(samples)
    except Exception as exc:  # what stack or the labels' conversion refused, in the user's words
        raise ConfigError(
            f"data: the first {len(samples)} samples cannot be batched ({type(exc).__name__}: "
            f"{exc}); samples are {describe(samples[0])}"
        ) from None


def check_user_dataset(dataset, batch_size: int, collate: Callable, cap_s: float = 60.0) -> SampleFacts:
    """Check the first sample and the first batch (up to :data:`FIRST_BATCH_MOST` samples, made by
    ``collate``, read within ``cap_s``) of a user's Dataset; their facts, or ConfigError with the problem
    and its fix."""
    samples = read_first(dataset, max(1, min(batch_size, FIRST_BATCH_MOST)), cap_s)
    if not samples:
        raise ConfigError("data: the dataset has no samples")
    facts = check_sample(samples[0])
    for k, sample in enumerate(samples[1:], 1):  # a sample of another form breaks the batch too: say which
        try:
            check_sample(sample)
        except ConfigError as exc:
            raise ConfigError(f"{exc} (sample {k}; sample 0 is {describe(samples[0])})") from None
    check_batch(samples, collate)
    return facts


#: what a user's own DataLoader's collate says when its samples cannot be batched -> what fixes it
COLLATE_FIXES = {
    "PIL.Image": "the dataset returns PIL images: add torchvision.transforms.ToTensor() (or PILToTensor()) at the "
    "end of its transform",
    "stack expects each tensor to be equal size": "samples differ in size: crop or resize them to one size (e.g. "
    "Resize and CenterCrop, or RandomResizedCrop), or give the "
    "DataLoader a collate_fn that batches them",
}


def collate_fix(message: str) -> str:
    """The fix for a collate error of a user's own DataLoader, as '; <fix>', or '' when none is known."""
    return next((f"; {fix}" for key, fix in COLLATE_FIXES.items() if key in message), "")
