"""DataLoader construction: the same settings for every trial that uses a loader.

Workers are capped to one thread and seeded in :func:`worker_init` (see
``confounders``); the sampler cycles forever so a trial can measure as many
windows as it needs without an epoch boundary restarting the workers.

A user's own DataLoader (or one over an IterableDataset, which cannot cycle by index) is
iterated through :class:`EndlessIter`, which starts a new pass when one ends; its batches
are put in pipeprof's form by :func:`user_batch`.
"""

from __future__ import annotations

import atexit
import os
import signal
from functools import partial
from typing import Callable

import torch
from torch.utils.data import DataLoader, IterableDataset, get_worker_info

from pipeprof.data.dataset import CyclingSampler, ShardSampler

from .confounders import cap_worker_threads, seed_worker


def worker_init(worker_id: int, base_seed: int) -> None:
    cap_worker_threads()
    seed = base_seed + worker_id
    seed_worker(seed)
    transform = getattr(get_worker_info().dataset, "transform", None)
    if hasattr(transform, "set_random_seed"):  # albumentations >= 2 keeps its own RNG
        transform.set_random_seed(seed)


def sampler_for(dataset, batch_size: int, num_workers: int, seed: int = 0, shard=None):
    """Shuffled endless passes, or shard-by-shard per worker when the dataset's source is sequential.
    ``shard``: (rank, world size) of an N-GPU trial: this rank's DistributedSampler share of each pass."""
    source = getattr(dataset, "source", None)
    if getattr(source, "sequential", False):
        if shard is not None:
            raise ValueError(
                "a sequential (sharded) source is not split between the ranks of an N-GPU trial; "
                "use files or memory there"
            )
        return ShardSampler(source, batch_size, num_workers, seed)
    return CyclingSampler(len(dataset), seed, shard)


def access_order(dataset) -> str:
    """How the loader walks the dataset, as recorded with each trial."""
    return (
        "sequential: each worker reads its own shards front to back"
        if getattr(getattr(dataset, "source", None), "sequential", False)
        else "shuffled"
    )


def build_loader(
    dataset,
    batch_size: int,
    num_workers: int,
    collate_fn,
    pin_memory: bool = False,
    prefetch_factor: int = 2,
    seed: int = 0,
    timeout_s: float = 0,
    shard=None,
    **knobs,
) -> DataLoader:
    """An endless DataLoader over ``dataset`` with pipeprof's worker policy.

    ``timeout_s`` (> 0, with workers) bounds the wait for one batch, so storage that stops
    answering ends a trial with an error instead of hanging it. ``knobs``: other DataLoader keywords
    of the workers (an action's variant: ``in_order``, ``persistent_workers``), with workers only.
    """
    extra = {"prefetch_factor": prefetch_factor, "timeout": timeout_s, **knobs} if num_workers > 0 else {}
    # an IterableDataset takes no sampler (it cannot be indexed): its passes end, EndlessIter restarts them
    sampler = (
        None if isinstance(dataset, IterableDataset) else sampler_for(dataset, batch_size, num_workers, seed, shard)
    )
    return DataLoader(
        dataset,
        batch_size=batch_size,
        sampler=sampler,
        num_workers=num_workers,
        collate_fn=collate_fn,
        pin_memory=pin_memory,
        worker_init_fn=partial(worker_init, base_seed=seed),
        drop_last=True,
        **extra,
    )


def collect_before_fork() -> None:
    """A full garbage collection, run before a loader's workers are forked (outside any timed region).

    Each worker inherits this process's garbage collector's counts. What was made here since the last full
    collection (modules imported to read a dataset, a variant's objects) leaves one due, which an idle parent
    never runs: every child ran it instead, over the whole inherited heap, each page it touched copied, and a
    loader without persistent workers forks a child each pass (docs/measured.md, "three held-out scripts").
    Collected first, the children start as a training loop's do."""
    import gc

    gc.collect()


def prefetch_depth(num_workers: int, prefetch_factor: int) -> int:
    """Batches the workers can have ready before the first ``next()``: excluded as warm-up."""
    return num_workers * prefetch_factor


def _loader_iters(iterator) -> list:
    """The DataLoader iterators behind ``iterator``: itself, or those an EndlessIter has open."""
    return iterator.dataloader_iters() if isinstance(iterator, EndlessIter) else [iterator]


def worker_pids(iterator) -> list[int]:
    """PIDs of the iterator's worker processes (none when loading in the main process)."""
    # _workers is private but stable since torch 1.x; asking it beats scanning /proc
    return [w.pid for it in _loader_iters(iterator) for w in getattr(it, "_workers", []) if w.pid is not None]


#: POSIX job control: a loader's workers can be stopped and continued (not on Windows)
PAUSABLE = hasattr(signal, "SIGSTOP") and hasattr(signal, "SIGCONT")


class Pause:
    """Stops a running loader's workers (SIGSTOP) and continues them (SIGCONT), where the OS can.

    Two loaders timed in turn share the cores: without a pause, the one not timed keeps filling its
    prefetch queues (pf batches a worker) after the switch, on the cores the timed one needs. Stopped,
    its workers hold their half-made batches until their turn and go on with them then. Whatever ends the
    trial must :meth:`resume` first (a stopped worker cannot exit, and the interpreter's exit joins its
    daemonic workers): the trial's ``finally`` does, and so does an exit hook for a trial abandoned in its
    thread. Only a training process killed outright (SIGKILL) leaves its workers stopped.
    """

    def __init__(self, iterator=None, pids: tuple = ()):
        self.iterator, self.pids, self.stopped = iterator, tuple(pids), []

    def stop(self) -> None:
        """Stop the iterator's workers (or the processes ``pids`` given instead)."""
        if not PAUSABLE or self.stopped:
            return
        # now: a user's loader may have started new ones since
        self.stopped = worker_pids(self.iterator) if self.iterator is not None else list(self.pids)
        _PAUSED.add(self)
        self._send(signal.SIGSTOP)

    def resume(self) -> None:
        if self.stopped:
            self._send(signal.SIGCONT)
        self.stopped = []
        _PAUSED.discard(self)

    def _send(self, sig) -> None:
        for pid in self.stopped:
            try:
                os.kill(pid, sig)
            except ProcessLookupError:  # a worker that ended with its pass (a user's loader)
                pass


_PAUSED: set = set()


@atexit.register  # after torch's multiprocessing hooks are registered, so it runs before they join the workers
def _resume_all() -> None:
    for pause in list(_PAUSED):
        pause.resume()


def shutdown(iterator) -> None:
    """Stop the workers now, rather than whenever the iterator is garbage-collected."""
    for it in _loader_iters(iterator):
        stop = getattr(it, "_shutdown_workers", None)
        if stop is not None:
            stop()


# ---- a user's own loader -------------------------------------------------------------

USER_WORKER_POLICY = "user's DataLoader"  # the trial row's worker_policy when the user built the loader
USER_WORKER_POLICY_NOTE = (
    "the user's DataLoader runs its own worker_init_fn: pipeprof does not cap its workers' "
    "threads (cv2, torch) or seed them"
)
BATCH_FORMS = (
    "a dict with 'image' and 'label' (or 'images' and 'labels')",
    "a tuple or list whose first two items are (images, labels)",
)


def _dataloaders(loader) -> list[DataLoader]:
    """The DataLoaders inside a user's loader: itself, or the first stage of a webdataset WebLoader
    (a DataPipeline whose ``pipeline`` starts with the DataLoader it wraps)."""
    if isinstance(loader, DataLoader):
        return [loader]
    stages = getattr(loader, "pipeline", None)
    return [s for s in stages if isinstance(s, DataLoader)] if isinstance(stages, list) else []


def _capture(dl: DataLoader, latest: dict) -> None:
    """Keep in ``latest[id(dl)]`` the newest iterator ``dl`` creates, to read its workers' PIDs and
    stop them. DataLoader.__iter__ makes each through ``self._get_iterator()`` (private, stable since
    torch 1.7): a wrapper such as WebLoader creates the iterator inside a generator, out of reach."""
    make = dl._get_iterator

    def capture():
        it = make()
        old = latest.get(id(dl))
        if old is not None and old is not it:  # a new pass of non-persistent workers: the old ones are done
            shutdown(old)
        latest[id(dl)] = it
        return it

    dl._get_iterator = capture


class EndlessIter:
    """Endless batches from a loader whose passes end: a user's DataLoader (an epoch ends) or one over
    an IterableDataset (exhausted; it cannot be cycled by index).

    When a pass ends the iterator is re-created, which restarts non-persistent workers. That restart
    falls inside whichever window is open, as it falls inside training between epochs; ``restarts``
    counts it for the trial row (``loader_restarts``). ``normalise(batch)`` puts each batch in
    pipeprof's form; ``on_pass(self)`` runs after each pass's first batch, when its workers exist
    (a WebLoader starts them lazily), so the monitor can follow the new PIDs.
    """

    def __init__(self, loader, normalise: Callable = lambda b: b, on_pass: Callable = lambda it: None):
        self.loader, self.normalise, self.on_pass = loader, normalise, on_pass
        self.restarts = 0
        self._latest: dict = {}  # id(DataLoader) -> its newest iterator
        for dl in _dataloaders(loader):
            _capture(dl, self._latest)
        self._it, self._fresh = iter(loader), True

    def __iter__(self):
        return self

    def __next__(self) -> dict:
        try:
            batch = next(self._it)
        except StopIteration:
            self.restarts += 1
            self._it, self._fresh = iter(self.loader), True
            try:
                batch = next(self._it)
            except StopIteration:  # restarting again would spin forever
                raise RuntimeError("the loader yielded no batch in a whole pass") from None
        if self._fresh:
            self._fresh = False
            self.on_pass(self)
        return self.normalise(batch)

    def dataloader_iters(self) -> list:
        """The newest iterator of each DataLoader inside the loader (whose workers run now)."""
        return list(self._latest.values())


def user_batch(batch) -> dict:
    """A user loader's batch as ``{"image": tensor [B, C, H, W], "label": tensor [B]}``; samples are
    counted from ``len(images)``. Accepted forms: see :data:`BATCH_FORMS`; others raise ValueError."""
    pair = _images_labels(batch)
    if pair is None:
        raise ValueError(
            f"the user's loader returned {_describe(batch)}; accepted batches: {'; or '.join(BATCH_FORMS)}"
        )
    images, labels = pair
    try:
        if isinstance(images, (list, tuple)):  # a collate that leaves the images unstacked
            images = torch.stack([torch.as_tensor(x) for x in images])
        images, labels = torch.as_tensor(images), torch.as_tensor(labels)
    except (TypeError, ValueError, RuntimeError) as exc:
        raise ValueError(
            f"the user's loader returned {_describe(batch)} whose images/labels are not tensors "
            f"({exc}); accepted batches: {'; or '.join(BATCH_FORMS)}"
        ) from None
    if images.ndim != 4 or len(labels) != len(images):
        raise ValueError(
            f"the user's loader returned images of shape {tuple(images.shape)} and {labels.numel()} "
            "labels: expected images [batch, channels, height, width] and one label per image"
        )
    return {"image": images, "label": labels}


def _images_labels(batch):
    """(images, labels) of a batch in one of the accepted forms, else None."""
    if isinstance(batch, dict):
        for images, labels in (("image", "label"), ("images", "labels")):
            if images in batch and labels in batch:
                return batch[images], batch[labels]
        return None
    if isinstance(batch, (tuple, list)) and len(batch) >= 2:
        return batch[0], batch[1]
    return None


def _describe(batch) -> str:
    if isinstance(batch, dict):
        return f"a dict with keys {sorted(map(str, batch))}"
    if isinstance(batch, (tuple, list)):
        return f"a {type(batch).__name__} of {len(batch)} item(s) ({', '.join(type(x).__name__ for x in batch)})"
    return f"a {type(batch).__name__}"
