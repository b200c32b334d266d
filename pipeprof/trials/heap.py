"""What a trial leaves behind: its garbage and the device memory it cached, freed before the next trial,
and what outlives it set aside from the garbage collector (:func:`release` inside :func:`trial_heap`). Used
by the sweep in the run's process, by each rank of a kept torchrun job between the trials it is handed,
and by the batch-size search between the sizes it tries."""

from __future__ import annotations

import contextlib
import gc
from typing import Iterator

import torch

_HEAP_OWNED = False  # inside trial_heap, which froze the heap: release sets each trial's survivors aside too


def release(device: torch.device) -> None:
    """Free what a trial left: its cycles, and the device memory torch's allocator still caches. Inside
    :func:`trial_heap` what survives the collection is set aside as well (``gc.freeze``): the modules the
    first trials import on the way (torch's compiler, through the optimiser) were otherwise walked again at
    every later trial, a fraction of a second each; set aside, a release after the first trial's takes
    milliseconds (docs/measured.md)."""
    gc.collect()
    if _HEAP_OWNED:
        gc.freeze()
    if device.type == "cuda":
        torch.cuda.empty_cache()


@contextlib.contextmanager
def trial_heap(collect_first: bool = False) -> Iterator[None]:
    """Within the block, :func:`release`'s collection walks only the objects made since the last trial: what
    the process held before is set aside from the garbage collector (``gc.freeze``), so is what each trial
    leaves alive, and all of it is set back at the end (``gc.unfreeze``). A full collection walks the whole
    heap, torch's and pandas' objects included, a fraction of a second a trial, for cycles that only the
    trials make. Set-aside objects are still freed by reference count; only a cycle among them that
    becomes garbage before the block ends waits for its end (nothing the sweep keeps from one trial to the
    next holds device memory: each trial builds its own model and loader).
    ``collect_first``: free the garbage already there before setting it aside (on a GPU, cycles holding
    device memory). What the process had frozen before is set back too: Python 3.12 starts with a few
    hundred objects frozen (375 on 3.12.1), and a block that stood aside for them never froze anything
    there; a process that freezes its heap before forking freezes it again after the run. Nested: the
    outer block's policy holds."""
    global _HEAP_OWNED
    if _HEAP_OWNED:
        yield
        return
    if collect_first:
        gc.collect()
    gc.freeze()
    _HEAP_OWNED = True
    try:
        yield
    finally:
        _HEAP_OWNED = False
        gc.unfreeze()
