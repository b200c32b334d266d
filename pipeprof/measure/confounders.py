"""Everything that silently changes a measurement, controlled in one place.

Thread pools inside DataLoader workers (OpenCV's, torch's intra-op pool) would
oversubscribe the cores N workers already use, so each worker is capped to one
thread; albumentations phones home for updates at import in every process unless
told not to; and unseeded augmentations make two runs do different work. A worker
that sets these differently from the next run is a confounder, so they live here.
"""

from __future__ import annotations

import os
import random
from contextlib import contextmanager
from typing import Iterator, Optional

# numpy and torch are imported where they are used: ``import pipeprof`` (every ``pipeprof`` command,
# ``pipeprof --help`` included) imports this module and should not pay a second for torch

#: Recorded in run.json so a reader knows what the workers were allowed to do.
WORKER_POLICY = {
    "cv2_threads": 0,
    "torch_threads": 1,
    "seed": "base_seed + worker_id (numpy, random, torch, albumentations)",
    "NO_ALBUMENTATIONS_UPDATE": "1",
}


def quiet_albumentations() -> None:
    """Stop albumentations' update check; must run before it is first imported."""
    os.environ.setdefault("NO_ALBUMENTATIONS_UPDATE", "1")


def cap_worker_threads() -> None:
    """One thread per worker: parallelism comes from the number of workers."""
    import torch

    cap_cv2_threads()
    torch.set_num_threads(1)


_CV2_CAPPED: set[int] = set()  # the processes that have capped OpenCV's threads (a forked worker has not)


def cap_cv2_threads() -> None:
    """OpenCV decodes on the calling thread alone; called before each decode where pipeprof decodes in a user's
    workers, which run the user's worker_init_fn, not :func:`cap_worker_threads`. Once per process: a worker is
    a process of its own, so the process id says whether this one has."""
    if os.getpid() in _CV2_CAPPED:
        return
    import cv2

    cv2.setNumThreads(0)
    _CV2_CAPPED.add(os.getpid())


def seed_worker(seed: int) -> None:
    """Seed every random source a worker's pipeline may draw from."""
    import numpy as np
    import torch

    random.seed(seed)
    np.random.seed(seed % 2**32)
    torch.manual_seed(seed)


def step_threads(
    kind: str, device_type: str, usable_cores: int, workers: Optional[int], override: Optional[int] = None
) -> Optional[int]:
    """Intra-op threads for the training process in a trial; None: leave torch's setting alone.

    On a CPU device the step's OpenMP threads share the cores with the DataLoader workers.
    Threads that find their core taken spin and wait for each other: a step with more threads
    than free cores can run many times slower than with one (docs/measured.md, "The step"). So
    an end-to-end trial gives the step the cores the workers leave, ``max(1, usable - workers)``,
    and the step ceiling, which runs alone, all of them. A masked pair (``cores_pair``) runs both its sides at
    the count its mask leaves, one (as many CPUs as workers): with torch's default, two threads on one masked
    CPU spun against its worker and the masked side read well under a run inside the same mask. On a GPU the
    host threads only launch kernels: torch's default stays.
    """
    if device_type != "cpu" or kind not in ("end_to_end", "gpu_ceiling", "cores_pair"):
        return None
    if override is not None:
        return override
    if kind == "cores_pair":
        return 1
    return usable_cores if kind == "gpu_ceiling" else max(1, usable_cores - (workers or 0))


@contextmanager
def torch_threads(n: Optional[int]) -> Iterator[Optional[int]]:
    """Run the block with ``n`` intra-op threads in this process (None: unchanged), then restore."""
    import torch

    if n is None:
        yield None
        return
    before = torch.get_num_threads()
    torch.set_num_threads(n)
    try:
        yield n
    finally:
        torch.set_num_threads(before)
