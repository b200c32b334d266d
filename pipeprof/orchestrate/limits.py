"""Settings checked against the machine before anything starts, each refusal naming the field and the
limit (a ConfigError: exit 2 on the command line, before the run folder exists).

- ``loader.num_workers`` above :data:`WORKERS_PER_CORE` per usable core: every worker is a process with
  its own memory and start-up, and past the cores they only take turns (thousands of workers on a small
  machine never finish starting). Network storage is the case for more workers than cores, and it is
  served well below this multiple.
- ``loader.batch_size`` above the dataset's samples: every batch would hold some samples twice, and the
  trial would measure a dataset that is not the user's.
- Memory the machine cannot give: the batches a loader holds in flight (``num_workers ×
  prefetch_factor`` of them, in shared memory between the workers and the main process, one more in the
  main process) against ``/dev/shm``'s free space and the memory available (the cgroup's limit too).
  A batch's bytes are known before it is made: batch × 3 channels × side² × the dtype's size.

:func:`check_workers` runs as soon as the config is resolved (nothing is made before it);
:func:`check_plan` once the trials are planned and the dataset's size is known.
"""

from __future__ import annotations

import shutil
from typing import Optional

import torch

from pipeprof.config import ConfigError
from pipeprof.schema import TrialKind

# a chosen cap, not a measured limit: far past the cores workers only take turns (thousands on 2 cores did not
# finish starting: docs/measured.md), and a count this far past them is taken for a typo before it starts
# thousands of processes
WORKERS_PER_CORE = 8
SHM = "/dev/shm"
# the kinds whose loaders hold decoded batches in flight (storage_fetch holds encoded bytes)
LOADER_KINDS = {
    TrialKind.CPU_PIPELINE.value,
    TrialKind.END_TO_END.value,
    TrialKind.HANDOFF.value,
    TrialKind.MONITOR_OVERHEAD.value,
}


def check_workers(cfg, usable_cores: int) -> None:
    """Refuse worker counts above :data:`WORKERS_PER_CORE` per usable core, naming the field and the limit."""
    most = WORKERS_PER_CORE * max(1, int(usable_cores))
    over = [w for w in cfg.loader.num_workers if w > most]
    if over:
        raise ConfigError(
            f"loader.num_workers: {max(over)} is above pipeprof's cap of {most} "
            f"({WORKERS_PER_CORE} workers per usable core, a chosen multiple; {int(usable_cores)} usable "
            "cores here): each worker is a process of its own, and past the cores they only take turns"
        )


def batch_bytes(spec, dtype: str, channels: int = 3) -> int:
    """Bytes of one decoded batch of ``spec`` whose images are ``dtype``: batch × channels × side² × its size."""
    itemsize = torch.empty((), dtype=getattr(torch, dtype)).element_size()
    return int(spec.batch_size) * channels * int(spec.image_size) ** 2 * itemsize


def in_flight_bytes(spec, dtype: str, prefetch_factor: int) -> int:
    """The decoded batches a loader trial holds at once: ``prefetch_factor`` per worker (in shared memory),
    and the one the main process holds (at 0 workers, only that one)."""
    return (spec.num_workers * prefetch_factor + 1) * batch_bytes(spec, dtype)


def shm_free() -> Optional[int]:
    try:
        return shutil.disk_usage(SHM).free
    except OSError:  # no /dev/shm (not Linux): torch passes tensors another way
        return None


def check_plan(
    cfg, specs: list, probe, samples: Optional[int], available_bytes: Optional[float], shm_bytes: Optional[int]
) -> None:
    """Refuse batch sizes above the dataset's ``samples`` (None: unknown, an IterableDataset) and loader
    trials whose batches in flight exceed ``shm_bytes`` free in /dev/shm or ``available_bytes`` of memory.
    ``probe(preset, side) -> (dtype, side)`` says what the loader's images are (``sweep.expand``'s)."""
    sizes = [s.batch_size for s in specs if s.batch_size and s.kind != TrialKind.GPU_CEILING.value]  # the ceiling's
    # batch is synthetic, made on the device: only the trials that read the dataset are bound by its size
    if samples is not None and sizes and max(sizes) > samples:
        raise ConfigError(
            f"loader.batch_size: {max(sizes)} is more than the dataset's {samples} samples: every "
            f"batch would hold samples twice; at most {samples}, or a larger dataset"
            f"{' (data.images)' if cfg.data.kind == 'synthetic' else ''}"
        )
    loaders = [s for s in specs if s.kind in LOADER_KINDS and s.image_size and s.augment_device in (None, "cpu")]
    if not loaders:
        return
    prefetch = cfg.loader.prefetch_factor
    flight = {s: in_flight_bytes(s, probe(s.preset, s.image_size)[0], prefetch) for s in loaders}
    worst = max(loaders, key=flight.get)
    one = batch_bytes(worst, probe(worst.preset, worst.image_size)[0])
    # the workers' batches wait in shared memory; the main process's is its own
    for wanted, have, where in (
        (flight[worst] - one, shm_bytes if worst.num_workers else None, f"{SHM} has {{}} MB free"),
        (flight[worst], available_bytes, "the machine has {} MB available (or its cgroup allows)"),
    ):
        if have is not None and wanted > have:
            raise ConfigError(
                f"loader.num_workers, loader.batch_size, loader.prefetch_factor: {worst.num_workers} workers × "
                f"{prefetch} batches in flight of {worst.batch_size} images ({one / 1e6:,.0f} MB each, "
                f"{worst.image_size}² px) need {wanted / 1e6:,.0f} MB, but {where.format(f'{have / 1e6:,.0f}')}; use "
                "fewer workers, a smaller batch or prefetch_factor"
                + (", or a larger /dev/shm (docker run --shm-size)" if where.startswith(SHM) else "")
            )
