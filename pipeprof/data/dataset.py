"""The map-style Dataset that runs one sample through read → decode → augment.

Stage times are measured inside the worker that does the work and travel with
the batch (``collate`` sums them), so the main process learns where worker CPU
time goes without any cross-process bookkeeping.
"""
from __future__ import annotations

import time

import numpy as np
import torch
from torch.utils.data import Dataset, Sampler

from .decode import get_decoder
from .sources import Source

FIXED_STAGES = ("read", "decode")


class PipelineDataset(Dataset):
    """Sample ``i`` → ``(image_tensor, label, stage_seconds)``.

    ``stage_seconds`` has one entry per name in :attr:`stage_names` (read, decode,
    then each top-level transform by class name); it is all zeros with timing off.
    """

    def __init__(self, source: Source, decoder: str, transform, stage_timing: bool = True):
        from ..augment import stage_names

        self.source = source
        self.decode = get_decoder(decoder)
        self.transform = transform
        self.stage_timing = stage_timing
        self.stage_names = list(FIXED_STAGES) + stage_names(transform)

    def __len__(self) -> int:
        return len(self.source)

    def __getitem__(self, index: int):
        clock = time.perf_counter
        t0 = clock()
        data = self.source.read(index)
        t1 = clock()
        image = self.decode(data)
        t2 = clock()
        times = np.zeros(len(self.stage_names))
        if self.stage_timing:
            times[0], times[1] = t1 - t0, t2 - t1
            image = self._timed_transforms(image, times[2:])
        else:
            image = self.transform(image=image)["image"]
        return image, self.source.label(index), times

    def _timed_transforms(self, image, out: np.ndarray):
        # Same transforms as Compose, applied one by one so each gets its own clock
        data, clock = {"image": image}, time.perf_counter
        for k, t in enumerate(self.transform.transforms):
            t0 = clock()
            data = t(**data)
            out[k] = clock() - t0
        return data["image"]


class RawBytesDataset(Dataset):
    """Reads the bytes only: what the storage delivers, with no decode (storage_fetch)."""

    stage_names = ["read"]

    def __init__(self, source: Source):
        self.source = source

    def __len__(self) -> int:
        return len(self.source)

    def __getitem__(self, index: int):
        t0 = time.perf_counter()
        n = len(self.source.read(index))
        return n, time.perf_counter() - t0


def collate_pipeline(samples):
    """Stack images; sum each stage's seconds over the batch and add collate's own."""
    t0 = time.perf_counter()
    images = torch.stack([torch.as_tensor(s[0]) for s in samples])
    labels = torch.as_tensor([s[1] for s in samples], dtype=torch.long)
    stage = np.sum([s[2] for s in samples], axis=0)
    collate_s = time.perf_counter() - t0
    return {"image": images, "label": labels,
            "stage_s": torch.as_tensor(np.append(stage, collate_s), dtype=torch.float64)}


def collate_bytes(samples):
    return {"bytes": sum(s[0] for s in samples), "read_s": sum(s[1] for s in samples),
            "n": len(samples)}


class CyclingSampler(Sampler):
    """Endless shuffled passes over the dataset: a trial never hits an epoch end,
    so workers are started once and never restarted mid-measurement."""

    def __init__(self, n: int, seed: int = 0):
        self.n, self.seed = n, seed

    def __iter__(self):
        epoch = 0
        while True:
            g = torch.Generator().manual_seed(self.seed + epoch)
            yield from torch.randperm(self.n, generator=g).tolist()
            epoch += 1
