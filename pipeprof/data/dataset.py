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


class TimingSwitch:
    """Stage clocks on or off, shared with forked DataLoader workers (a byte in shared memory).

    One running loader can then alternate clocked and unclocked windows: the clocks' cost is
    measured at one setting on the same workers, not as two trials apart in time. Only for
    fork-started workers (Linux's default): a spawned worker would get a copy, not the byte.
    """

    def __init__(self, on: bool = True):
        import multiprocessing as mp

        self._flag = mp.RawValue("b", on)

    def __bool__(self) -> bool:
        return bool(self._flag.value)

    def set(self, on: bool) -> None:
        self._flag.value = on


class PipelineDataset(Dataset):
    """Sample ``i`` → ``(image_tensor, label, stage_seconds)``.

    ``stage_seconds`` has one entry per name in :attr:`stage_names` (read, decode,
    then each top-level transform by class name); it is all zeros with timing off.
    """

    def __init__(self, source: Source, decoder: str, transform, stage_timing: "bool | TimingSwitch" = True):
        from ..augment import stage_names

        self.source = source
        self.decode = get_decoder(decoder)
        self.transform = transform
        self.stage_timing = stage_timing
        self.stage_names = list(FIXED_STAGES) + stage_names(transform)

    def __len__(self) -> int:
        return len(self.source)

    def __getitem__(self, index: int):
        # read is timed in this thread's CPU time: the analysis adds the stage clocks up
        # as worker CPU cost, and a read that waits on storage (cold disk, network, a
        # throttle) costs no CPU while it waits; that wait shows in storage_fetch instead
        clock, cpu = time.perf_counter, time.thread_time
        c0 = cpu()
        data = self.source.read(index)
        c1 = cpu()
        t1 = clock()
        image = self.decode(data)
        t2 = clock()
        times = np.zeros(len(self.stage_names))
        if self.stage_timing:
            times[0], times[1] = c1 - c0, t2 - t1
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
    """Reads the bytes only: what the storage delivers, with no decode (storage_fetch).

    Sample ``i`` → ``(bytes read, wall seconds of the read)``: the wall time, waits included,
    is the read latency.
    """

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
    """Totals of a batch of raw reads, plus each read's own time (for latency percentiles)."""
    return {"bytes": sum(s[0] for s in samples), "read_s": sum(s[1] for s in samples),
            "n": len(samples), "read_times": [s[1] for s in samples]}


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


class ShardSampler(Sampler):
    """Endless passes that read tar shards front to back, each DataLoader worker its own.

    WebDataset's layout is read this way (``split_by_worker``): a worker opens a shard and
    reads its members in file order, so storage sees few large sequential reads. Each
    epoch takes ``source.shard_order(seed, epoch)`` (shards shuffled, members in file
    order), cuts it into runs of one shard (split further when there are fewer shards
    than workers) and deals the runs to the workers in turn. A DataLoader hands batch
    ``k`` to worker ``k % num_workers`` (round robin, in order), so the sampler emits
    ``batch_size`` indices from worker 0's stream, then worker 1's, and so on. Each
    worker's stream cycles through epochs on its own, so the sampler never ends.
    """

    def __init__(self, source, batch_size: int, num_workers: int, seed: int = 0):
        if not getattr(source, "sequential", False):
            raise ValueError(f"{type(source).__name__} is not a sequential (sharded) source")
        self.source, self.batch_size, self.seed = source, batch_size, seed
        self.workers = max(num_workers, 1)

    def units(self, epoch: int) -> list[list[int]]:
        """Contiguous runs of one shard's members, in this epoch's order (at least one per worker)."""
        runs: list[list[int]] = []
        for i in self.source.shard_order(self.seed, epoch):
            if runs and self.source.shard_of(i) == self.source.shard_of(runs[-1][-1]):
                runs[-1].append(i)
            else:
                runs.append([i])
        if len(runs) < self.workers:  # fewer shards than workers: each reads a contiguous part
            pieces = -(-self.workers // len(runs))
            runs = [part for run in runs for part in np.array_split(run, min(pieces, len(run)))]
            runs = [[int(i) for i in part] for part in runs]
        return runs

    def worker_stream(self, worker: int):
        epoch = 0
        while True:
            units = self.units(epoch)
            mine = units[worker::self.workers] or units  # fewer samples than workers: all of them
            for unit in mine:
                yield from unit
            epoch += 1

    def __iter__(self):
        streams = [self.worker_stream(j) for j in range(self.workers)]
        while True:
            for stream in streams:
                for _ in range(self.batch_size):
                    yield next(stream)
