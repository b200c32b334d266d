"""The map-style Dataset that runs one sample through read → decode → augment.

Stage times are measured inside the worker that does the work and travel with
the batch (``collate`` sums them), so the main process learns where worker CPU
time goes without any cross-process bookkeeping. Bad samples (a file that cannot be
read or decoded) and outsize images travel the same way: each sample carries what its
worker met, the batch collects it, and :class:`SampleTally` counts it per trial.
"""

from __future__ import annotations

import time
from typing import Any, NamedTuple, Optional

import numpy as np
import torch
from torch.utils.data import Dataset, IterableDataset, Sampler, default_collate

from .decode import DecodeError, get_decoder
from .sources import Source

FIXED_STAGES = ("read", "decode")
# bad samples in a row that end the search for a stand-in: past this the data is not images at all
MAX_SKIPS = 100


class SamplePolicy(NamedTuple):
    """What a worker does with a sample it cannot read or decode, and which images are outliers
    (config ``data.on_bad_sample``, ``data.max_bad_frac``, ``data.max_pixels``)."""

    on_bad_sample: str = "skip"  # skip: the next index stands in, counted; fail: the trial fails
    max_bad_frac: float = 0.01  # a trial that skips more than this share of its samples fails
    max_pixels: int = 50_000_000

    @classmethod
    def of(cls, data) -> "SamplePolicy":
        """The policy of a config's data section (``config.DataConfig``)."""
        return cls(data.on_bad_sample, data.max_bad_frac, data.max_pixels)


class BadSample(ValueError):
    """A sample that cannot be read or decoded (policy ``fail``), or no readable stand-in for it."""


class Sample(NamedTuple):
    """One sample as a worker hands it to collate."""

    image: Any
    label: int
    stage_s: np.ndarray
    notes: Optional[dict] = None  # None, or {"bad": [(where, reason)], "large": (where, pixels, cost_s) or None}


def _stand_ins(index: int, n: int):
    """``index``, then the indices after it (wrapping), that may stand in for a bad sample."""
    return ((index + k) % n for k in range(min(MAX_SKIPS, n)))


def _bad(source, i: int, exc: BaseException, policy: SamplePolicy) -> tuple[str, str]:
    """(where, reason) of a sample that could not be read or decoded; raises under policy ``fail``."""
    where, reason = source.where(i), f"{type(exc).__name__}: {exc}"
    if policy.on_bad_sample == "fail":
        raise BadSample(f"{where}: {reason} (data.on_bad_sample: fail)") from None
    return where, reason


def _no_stand_in(bad: list) -> BadSample:
    return BadSample(
        f"{len(bad)} samples in a row cannot be read or decoded, from {bad[0][0]} ({bad[0][1]}) "
        f"to {bad[-1][0]} ({bad[-1][1]})"
    )


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
    """Sample ``i`` → :class:`Sample` ``(image_tensor, label, stage_seconds, notes)``.

    ``stage_seconds`` has one entry per name in :attr:`stage_names` (read, decode,
    then each top-level transform by class name); it is all zeros with timing off.
    ``notes`` reports the bad samples skipped for it and whether it is outsize (``policy``).
    """

    def __init__(
        self,
        source: Source,
        decoder: str,
        transform,
        stage_timing: "bool | TimingSwitch" = True,
        policy: SamplePolicy = SamplePolicy(),
    ):
        from .augment import stage_names

        self.source, self.policy = source, policy
        self.decode = get_decoder(decoder)
        self.transform = transform
        self.stage_timing = stage_timing
        self.stage_names = list(FIXED_STAGES) + stage_names(transform)

    def __len__(self) -> int:
        return len(self.source)

    def __getitem__(self, index: int) -> Sample:
        """Sample ``index``; under policy ``skip`` one that cannot be read or decoded is replaced by the
        next readable index, and the samples skipped travel in ``notes``."""
        timed, bad = bool(self.stage_timing), []
        for i in _stand_ins(index, len(self)):
            try:
                image, times = self._read_decode(i, timed)
            except (OSError, DecodeError) as exc:  # the data's fault (SourceError is an OSError)
                bad.append(_bad(self.source, i, exc, self.policy))
                continue
            return self._finish(i, image, times, timed, bad)
        raise _no_stand_in(bad)

    def _read_decode(self, i: int, timed: bool):
        # read is timed in this thread's CPU time: the analysis adds the stage clocks up
        # as worker CPU cost, and a read that waits on storage (cold disk, network, a
        # throttle) costs no CPU while it waits; that wait shows in storage_fetch instead
        clock, cpu = time.perf_counter, time.thread_time
        c0 = cpu()
        data = self.source.read(i)
        c1 = cpu()
        t1 = clock()
        image = self.decode(data)
        t2 = clock()
        times = np.zeros(len(self.stage_names))
        if timed:
            times[0], times[1] = c1 - c0, t2 - t1
        return image, times

    def _finish(self, i: int, image: np.ndarray, times: np.ndarray, timed: bool, bad: list) -> Sample:
        pixels = image.shape[0] * image.shape[1]
        if timed:
            image = self._timed_transforms(image, times[2:])
        else:
            image = self.transform(image=image)["image"]
        # an outsize image's cost is its own stage clocks: unknown with the clocks off
        large = (
            (self.source.where(i), pixels, float(times.sum()) if timed else None)
            if pixels > self.policy.max_pixels
            else None
        )
        return Sample(image, self.source.label(i), times, {"bad": bad, "large": large} if bad or large else None)

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

    Sample ``i`` → ``(bytes read, wall seconds of the read, [(where, reason) of unreadable samples
    skipped])``: the wall time, waits included, is the read latency.
    """

    stage_names = ["read"]

    def __init__(self, source: Source, policy: SamplePolicy = SamplePolicy()):
        self.source, self.policy = source, policy

    def __len__(self) -> int:
        return len(self.source)

    def __getitem__(self, index: int):
        bad = []
        for i in _stand_ins(index, len(self)):
            t0 = time.perf_counter()
            try:
                n = len(self.source.read(i))
            except OSError as exc:
                bad.append(_bad(self.source, i, exc, self.policy))
                continue
            return n, time.perf_counter() - t0, bad
        raise _no_stand_in(bad)


class PrebuiltDataset(Dataset):
    """One sample built once, returned for every index: the bytes a real sample carries with no read,
    decode or augment. What is left of loading (collate in the workers; receive, unpickle and pin in the
    main process) is the loader's hand-off, measured alone by the ``handoff`` trial."""

    def __init__(self, sample, length: int):
        self.sample, self.length = sample, length

    def __len__(self) -> int:
        return self.length

    def __getitem__(self, index: int):
        return self.sample


class PrebuiltStream(IterableDataset):
    """:class:`PrebuiltDataset` for a loader of an ``IterableDataset`` (which takes no sampler): the one sample
    yielded without end by each worker; the pause ends it by shutting the workers down."""

    def __init__(self, sample):
        self.sample = sample

    def __iter__(self):
        while True:
            yield self.sample


def stack(images) -> torch.Tensor:
    """Images stacked into one batch as PyTorch's default collate does it: inside a worker, straight into
    shared memory, so the batch crosses to the main process without another copy (a plain torch.stack
    costs a copy of the whole batch there, a large share of the hand-off with big float samples)."""
    return default_collate([torch.as_tensor(x) for x in images])


def collate_pipeline(samples: list[Sample]):
    """Stack images; sum each stage's seconds over the batch and add collate's own; gather the
    samples skipped as bad (``bad_samples``: (where, reason)) and the outsize images
    (``large_images``: (where, pixels, cost seconds or None))."""
    t0 = time.perf_counter()
    images = stack(s[0] for s in samples)
    labels = torch.as_tensor([s[1] for s in samples], dtype=torch.long)
    stage = np.sum([s[2] for s in samples], axis=0)
    notes = [s[3] for s in samples if s[3]]
    collate_s = time.perf_counter() - t0
    return {
        "image": images,
        "label": labels,
        "stage_s": torch.as_tensor(np.append(stage, collate_s), dtype=torch.float64),
        "bad_samples": [b for n in notes for b in n["bad"]],
        "large_images": [n["large"] for n in notes if n["large"]],
    }


def collate_bytes(samples):
    """Totals of a batch of raw reads, plus each read's own time (for latency percentiles)."""
    return {
        "bytes": sum(s[0] for s in samples),
        "read_s": sum(s[1] for s in samples),
        "n": len(samples),
        "read_times": [s[1] for s in samples],
        "bad_samples": [b for s in samples for b in s[2]],
    }


def _first(kept: list, new: list, most: int) -> None:
    """Add to ``kept`` the entries of ``new`` whose path (first item) it lacks, up to ``most`` in all."""
    for entry in new:
        if len(kept) < most and all(entry[0] != k[0] for k in kept):
            kept.append(entry)


class SampleTally:
    """The bad samples and outsize images the workers reported with one trial's batches.

    Wraps the loader's iterator: the trial reads its batches through it, warm-up included, so
    the counts cover every sample the trial consumed. Only batches of pipeprof's own pipeline
    carry reports (``reported``); a user's loader's do not.
    """

    EXAMPLES = 5  # distinct paths kept with their reasons; the counts are complete

    def __init__(self, it):
        self.it = it
        self.reported = False
        self.samples = self.bad = self.large = 0
        self.bad_first: list[tuple[str, str]] = []
        self.large_first: list[tuple[str, int]] = []
        self.large_s, self.large_timed, self.stage_s = 0.0, True, 0.0

    def __iter__(self):
        return self

    def __next__(self):
        batch = next(self.it)
        if isinstance(batch, dict) and "bad_samples" in batch:
            self._add(batch)
        return batch

    def _add(self, batch: dict) -> None:
        self.reported = True
        self.samples += len(batch["label"]) if "label" in batch else batch["n"]
        self.bad += len(batch["bad_samples"])
        _first(self.bad_first, batch["bad_samples"], self.EXAMPLES)
        large = batch.get("large_images", [])
        self.large += len(large)
        _first(self.large_first, [(w, p) for w, p, _ in large], self.EXAMPLES)
        self.large_s += sum(s for _, _, s in large if s is not None)
        self.large_timed = self.large_timed and all(s is not None for _, _, s in large)
        if "stage_s" in batch:
            self.stage_s += float(batch["stage_s"].sum())


class CyclingSampler(Sampler):
    """Endless shuffled passes over the dataset: a trial never hits an epoch end,
    so workers are started once and never restarted mid-measurement.

    ``shard=(rank, world)``: each pass is this rank's share, drawn by torch's DistributedSampler
    (``set_epoch`` per pass, as a DDP training loop does), so the ranks read disjoint samples."""

    def __init__(self, n: int, seed: int = 0, shard: Optional[tuple[int, int]] = None):
        self.n, self.seed, self.shard = n, seed, shard

    def __iter__(self):
        epoch = 0
        if self.shard is not None:
            from torch.utils.data.distributed import DistributedSampler

            rank, world = self.shard
            part = DistributedSampler(range(self.n), num_replicas=world, rank=rank, shuffle=True, seed=self.seed)
        while True:
            if self.shard is None:
                g = torch.Generator().manual_seed(self.seed + epoch)
                yield from torch.randperm(self.n, generator=g).tolist()
            else:
                part.set_epoch(epoch)
                yield from part
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
            mine = units[worker :: self.workers] or units  # fewer samples than workers: all of them
            for unit in mine:
                yield from unit
            epoch += 1

    def __iter__(self):
        streams = [self.worker_stream(j) for j in range(self.workers)]
        while True:
            for stream in streams:
                for _ in range(self.batch_size):
                    yield next(stream)
