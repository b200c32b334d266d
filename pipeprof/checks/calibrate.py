"""Workloads whose answer is known in advance: pipeprof's ground truth.

* :class:`BurnDataset` — each sample burns a set CPU time (a busy loop, not a
  sleep: it occupies a core the way decoding does). With ``w`` workers and ``c``
  seconds per sample the CPU bound is ``w / c`` samples/s (``1 / c`` at 0 workers).
* :class:`FixedStepModel` — each forward takes a set wall time *without* using the
  CPU (a sleep), the way a GPU step leaves the host free. With batch ``b`` and
  ``s`` seconds per step the accelerator bound is ``b / s`` samples/s.
  :class:`BurnStepModel` is the same step burning one core: a CPU step of known cost.
* :class:`WaitDataset` — each sample waits a set wall time without CPU (a read of known
  latency): ``w / c`` samples/s on any number of cores (the action trials' benchmark).

So ``min(w / c, b / s)`` is the expected end-to-end rate and the binding side is
the expected verdict; tests and ``pipeprof validate`` assert both.

Profile them with ``model.threads: 1`` (``profile(threads=1)``): after each sleep torch's
idle intra-op threads take milliseconds to wake for the loss and backward (docs/measured.md),
which would add a cost nobody asked for (a GPU step leaves those threads alone).
"""

from __future__ import annotations

import time

import torch
from torch import nn
from torch.utils.data import DataLoader, Dataset


def burn(seconds: float) -> None:
    """Keep this thread busy until it has used ``seconds`` of CPU time.

    CPU time, not wall time: a sample that costs 10 ms of CPU takes longer on a core it
    shares, as decoding does, so more workers than cores cannot exceed what the cores can do.
    """
    end = time.thread_time() + seconds
    while time.thread_time() < end:
        pass


class BurnDataset(Dataset):
    """``n`` tiny uint8 images, each costing ``cost_s`` seconds of busy CPU to produce."""

    def __init__(self, n: int = 256, cost_s: float = 0.01, side: int = 8):
        self.n, self.cost_s, self.side = n, cost_s, side

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, index: int):
        burn(self.cost_s)
        return torch.full((3, self.side, self.side), index % 256, dtype=torch.uint8), index % 10


class WaitDataset(Dataset):
    """``n`` tiny uint8 images that each take ``wait_s`` of wall time and no CPU (a read of known latency):
    ``w`` workers make ``w / wait_s`` samples/s, whatever else the machine's cores are doing, less the sleep's
    overshoot and the sample's trip through a worker (a fraction of a millisecond a sample: never more)."""

    def __init__(self, wait_s: float, n: int = 4096):
        self.wait_s, self.n = wait_s, n

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int):
        time.sleep(self.wait_s)
        return torch.zeros(3, 8, 8, dtype=torch.uint8), i % 10


class FixedStepModel(nn.Module):
    """A model whose forward takes ``step_s`` seconds of wall time and no CPU.

    ``tuple_output`` returns ``(logits, aux)`` the way googlenet/inception do in train mode.
    """

    def __init__(self, step_s: float = 0.005, num_classes: int = 1000, tuple_output: bool = False):
        super().__init__()
        self.step_s, self.tuple_output = step_s, tuple_output
        # logits straight from a bias: a real layer would wake the intra-op thread pool
        # after each sleep, adding milliseconds the test did not ask for
        self.bias = nn.Parameter(torch.zeros(num_classes))

    def wait(self) -> None:
        time.sleep(self.step_s)

    def forward(self, x: torch.Tensor):
        self.wait()
        logits = self.bias.expand(x.shape[0], -1)
        return (logits, logits.detach() * 0) if self.tuple_output else logits


class BurnStepModel(FixedStepModel):
    """A CPU step of known cost: the forward keeps one core busy for ``step_s`` seconds."""

    def wait(self) -> None:
        burn(self.step_s)


def expected_rate(cost_s: float, workers: int, batch: int, step_s: float) -> tuple[float, str]:
    """(samples/s, binding side) for a BurnDataset feeding a FixedStepModel.

    At 0 workers the main process alternates loading and stepping, so the two
    costs add; with workers they overlap and the slower side binds.
    """
    if workers == 0:  # serial: the side that takes more of each batch's time binds
        return batch / (batch * cost_s + step_s), "cpu" if batch * cost_s >= step_s else "gpu"
    cpu, gpu = workers / cost_s, batch / step_s
    return (cpu, "cpu") if cpu < gpu else (gpu, "gpu")


def fixed_step_model_5ms() -> FixedStepModel:
    """A 5 ms step for configs (``model.name: "pipeprof.checks.calibrate:fixed_step_model_5ms"``): a fast,
    CPU-free stand-in for an accelerator, so the data side of a run is what binds."""
    return FixedStepModel(0.005)


def burn_step_model_40ms() -> BurnStepModel:
    """A 40 ms CPU step for configs: the training process's own core, whose share of a masked machine the
    sizing model charges (``trials.kinds.cores_pair``: at batch 8 and one 10 ms worker, 100 samples/s on two
    CPUs, 8 / (80 + 40 ms) = 66.7 on one)."""
    return BurnStepModel(0.040)


def burn_dataset_10ms() -> BurnDataset:
    """2,048 samples of 10 ms CPU each, for configs (``data: {kind: factory, factory:
    "pipeprof.checks.calibrate:burn_dataset_10ms"}``): a pipeline whose CPU curve is known, 100 samples/s
    per core, used by the sizing check in processes restricted to fewer cores."""
    return BurnDataset(2048, 0.010)


def _tuple_collate(samples) -> tuple[torch.Tensor, torch.Tensor]:
    """(images [B, 3, side, side] uint8, labels [B] int64): a user's collate that returns a tuple."""
    return torch.stack([s[0] for s in samples]), torch.tensor([s[1] for s in samples], dtype=torch.long)


def burn_loader(num_workers: int) -> DataLoader:
    """A user's own DataLoader, for configs
    (``data: {kind: loader, factory: "pipeprof.checks.calibrate:burn_loader"}``): 256 BurnDataset samples of
    2 ms CPU each (500 samples/s per core), batch 8, shuffled, tuple batches.
    One pass is 32 batches: trials see its epochs end and restart."""
    return DataLoader(
        BurnDataset(256, 0.002),
        batch_size=8,
        shuffle=True,
        num_workers=num_workers,
        collate_fn=_tuple_collate,
        drop_last=True,
    )
