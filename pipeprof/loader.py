"""DataLoader construction: the same settings for every trial that uses a loader.

Workers are capped to one thread and seeded in :func:`worker_init` (see
``confounders``); the sampler cycles forever so a trial can measure as many
windows as it needs without an epoch boundary restarting the workers.
"""
from __future__ import annotations

from functools import partial

from torch.utils.data import DataLoader, get_worker_info

from .confounders import cap_worker_threads, seed_worker
from .data.dataset import CyclingSampler, ShardSampler


def worker_init(worker_id: int, base_seed: int) -> None:
    cap_worker_threads()
    seed = base_seed + worker_id
    seed_worker(seed)
    transform = getattr(get_worker_info().dataset, "transform", None)
    if hasattr(transform, "set_random_seed"):  # albumentations >= 2 keeps its own RNG
        transform.set_random_seed(seed)


def sampler_for(dataset, batch_size: int, num_workers: int, seed: int = 0):
    """Shuffled endless passes, or shard-by-shard per worker when the dataset's source is sequential."""
    source = getattr(dataset, "source", None)
    if getattr(source, "sequential", False):
        return ShardSampler(source, batch_size, num_workers, seed)
    return CyclingSampler(len(dataset), seed)


def access_order(dataset) -> str:
    """How the loader walks the dataset, as recorded with each trial."""
    return ("sequential: each worker reads its own shards front to back"
            if getattr(getattr(dataset, "source", None), "sequential", False) else "shuffled")


def build_loader(dataset, batch_size: int, num_workers: int, collate_fn, pin_memory: bool = False,
                 prefetch_factor: int = 2, seed: int = 0, timeout_s: float = 0) -> DataLoader:
    """An endless DataLoader over ``dataset`` with pipeprof's worker policy.

    ``timeout_s`` (> 0, with workers) bounds the wait for one batch, so storage that stops
    answering ends a trial with an error instead of hanging it.
    """
    extra = {"prefetch_factor": prefetch_factor, "timeout": timeout_s} if num_workers > 0 else {}
    return DataLoader(dataset, batch_size=batch_size, sampler=sampler_for(dataset, batch_size, num_workers, seed),
                      num_workers=num_workers, collate_fn=collate_fn, pin_memory=pin_memory,
                      worker_init_fn=partial(worker_init, base_seed=seed), drop_last=True, **extra)


def prefetch_depth(num_workers: int, prefetch_factor: int) -> int:
    """Batches the workers can have ready before the first ``next()``: excluded as warm-up."""
    return num_workers * prefetch_factor


def worker_pids(iterator) -> list[int]:
    """PIDs of the iterator's worker processes (none when loading in the main process)."""
    # _workers is private but stable since torch 1.x; asking it beats scanning /proc
    return [w.pid for w in getattr(iterator, "_workers", []) if w.pid is not None]


def shutdown(iterator) -> None:
    """Stop the workers now, rather than whenever the iterator is garbage-collected."""
    stop = getattr(iterator, "_shutdown_workers", None)
    if stop is not None:
        stop()
