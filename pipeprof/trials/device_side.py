"""The training process's share of the pipeline when ``augment.device`` is cuda: each batch of bytes is
decoded and augmented on the step's device before the step, and timed there.

Device clock marks (CUDA events on a GPU, read after the window's sync) bracket the decode and the
augmentation; the host's own time in the call is kept too, since nvJPEG does part of its work (the
Huffman decoding of some backends) on the calling thread. Their sum over the measured time is the
device's decode/augment share, a resource on the step's side: the step and the pipeline now share it.

A stand-in for the step (``stand_in_s``) keeps the device busy for the step's own time before each batch,
as the step does end to end: the host then decodes and queues the next batch while the device works, and
the marks bracket the pipeline's own device time, not the host's. Without it (the pipeline alone) the
device waits for the host inside the marks, and its time alone overstates what it adds end to end, where a
batch costs the step's time plus the pipeline's own device time (docs/measured.md, "The GPU pipeline").
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

    def __init__(self, preset: str, size: Optional[int], device: torch.device, seed: int = 0, stand_in_s: float = 0.0):
        self.pipe = for_preset(preset, size, device, seed)
        self.clock = DeviceClock(device)
        self.marks: list[tuple] = []
        self.host_s: list[float] = []
        self.stand_in = StandIn(device, stand_in_s) if stand_in_s > 0 else None

    def __call__(self, batch: dict, measuring: bool) -> dict:
        if self.stand_in is not None:
            self.stand_in()  # queued ahead of the marks: the pipeline's own device time stays inside them
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
        return {
            "device_decode_ms_mean": float(decode.mean()),
            "device_augment_ms_mean": float(augment.mean()),
            "device_pipeline_host_ms_mean": float(np.mean(self.host_s) * 1e3),
            "device_pipeline_frac": float((decode.sum() + augment.sum()) / 1e3 / measured_s)
            if measured_s > 0
            else None,
        } | (self.stand_in.columns() if self.stand_in is not None else {})


class StandIn:
    """``stand_in()`` occupies the device for ``seconds``, as a step of that length would: on a GPU a spin
    kernel queued on the current stream (``torch.cuda._sleep``, in clock cycles counted once against CUDA
    events), so the host goes on at once; on the CPU, where the step runs on the calling thread, a sleep."""

    def __init__(self, device: torch.device, seconds: float):
        self.seconds, self.cuda = seconds, device.type == "cuda"
        self.cycles = round(seconds * _cycles_per_s()) if self.cuda else 0
        self.marks: list[tuple] = []

    def __call__(self) -> None:
        if not self.cuda:
            time.sleep(self.seconds)
            return
        if len(self.marks) < 8:  # its length on the device, for the record: a few suffice (read after a sync)
            start = torch.cuda.Event(enable_timing=True)
            start.record()
            torch.cuda._sleep(self.cycles)
            end = torch.cuda.Event(enable_timing=True)
            end.record()
            self.marks.append((start, end))
        else:
            torch.cuda._sleep(self.cycles)

    def columns(self) -> dict:
        done = [a.elapsed_time(b) for a, b in self.marks if b.query()] if self.cuda else []
        return {
            "stand_in_step_ms": self.seconds * 1e3,
            "stand_in_step_device_ms": float(np.median(done)) if done else None,
        }


def _cycles_per_s() -> float:
    """The spin kernel's clock cycles per second on the current device, timed by CUDA events: 20 ms worth at
    a nominal 2 GHz, twice, the second read (the first carries the kernel's load)."""
    cycles = 40_000_000
    for _ in range(2):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        torch.cuda._sleep(cycles)
        end.record()
        end.synchronize()
    return cycles / (start.elapsed_time(end) / 1e3)


def device_side(ctx, spec) -> Optional[DeviceSide]:
    """The DeviceSide of a trial whose workers only read bytes (``spec.augment_device`` set), else None."""
    if spec.augment_device in (None, "cpu") or ctx.user_dataset is not None or ctx.user_loader is not None:
        return None
    return DeviceSide(spec.preset, spec.image_size, ctx.device, ctx.seed, ctx.stand_in_step_s)


def passthrough(batch: dict, measuring: bool) -> dict:
    """The CPU pipeline's batches need nothing from the training process before the step."""
    return batch
