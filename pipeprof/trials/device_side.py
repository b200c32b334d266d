"""The training process's share of the pipeline when ``augment.device`` is cuda: each batch of bytes is
decoded and augmented on the step's device before the step, and timed there.

Device clock marks (CUDA events on a GPU, read after the window's sync) bracket the decode and the
augmentation; the host's own time in the call is kept too, since nvJPEG does part of its work (the
Huffman decoding of some backends) on the calling thread. Their sum over the measured time is the
device's decode/augment share, a resource on the step's side: the step and the pipeline now share it.
"""
from __future__ import annotations

import time
from typing import Optional

import numpy as np
import torch

from pipeprof.data.encoded import unpacked
from pipeprof.data.gpu_augment import for_preset
from pipeprof.measure.step import DeviceClock


class DeviceSide:
    """``side(batch, measuring) -> batch`` with ``"image"`` decoded and augmented on ``device``."""

    def __init__(self, preset: str, size: Optional[int], device: torch.device, seed: int = 0):
        self.pipe = for_preset(preset, size, device, seed)
        self.clock = DeviceClock(device)
        self.marks: list[tuple] = []
        self.host_s: list[float] = []

    def __call__(self, batch: dict, measuring: bool) -> dict:
        t0 = time.perf_counter()
        m0 = self.clock.mark()
        images = self.pipe.decode(unpacked(batch))
        m1 = self.clock.mark()
        out = self.pipe.augment(images)
        m2 = self.clock.mark()
        if measuring:
            self.marks.append((m0, m1, m2))
            self.host_s.append(time.perf_counter() - t0)
        return {**batch, "image": out}

    def sync(self) -> None:
        self.clock.sync()

    def columns(self, measured_s: float) -> dict:
        """Per batch: device ms in decode and in augment, host ms in the call; the device's share of the
        measured time (``device_pipeline_frac``). Read after the last window's sync."""
        if not self.marks:
            return {}
        decode = np.array([self.clock.elapsed_ms(a, b) for a, b, _ in self.marks])
        augment = np.array([self.clock.elapsed_ms(b, c) for _, b, c in self.marks])
        return {"device_decode_ms_mean": float(decode.mean()), "device_augment_ms_mean": float(augment.mean()),
                "device_pipeline_host_ms_mean": float(np.mean(self.host_s) * 1e3),
                "device_pipeline_frac": float((decode.sum() + augment.sum()) / 1e3 / measured_s)
                if measured_s > 0 else None}


def device_side(ctx, spec) -> Optional[DeviceSide]:
    """The DeviceSide of a trial whose workers only read bytes (``spec.augment_device`` set), else None."""
    if spec.augment_device in (None, "cpu") or ctx.user_dataset is not None or ctx.user_loader is not None:
        return None
    return DeviceSide(spec.preset, spec.image_size, ctx.device, ctx.seed)


def passthrough(batch: dict, measuring: bool) -> dict:
    """The CPU pipeline's batches need nothing from the training process before the step."""
    return batch
