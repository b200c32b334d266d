"""The input pipeline on Ray Data (``data.engine: ray``): the same source, decoder and preset as the DataLoader's.

Rows are sample indices (``ray.data.range``); ``map_batches`` runs a pool of CPU actors, each reading, decoding
and augmenting its batch with pipeprof's own :class:`~pipeprof.data.dataset.PipelineDataset`, one thread each as a
DataLoader worker is (cv2 and torch threads 1, ``OMP_NUM_THREADS=1`` in the job's runtime env); the training
process takes the batches through ``iter_torch_batches`` (pinned, prefetched). The CPU limit of the streaming
executor (``DataContext.execution_options.resource_limits.cpu``) and the actor pool's size are the trial's CPU
count, the sweep axis that ``num_workers`` is for the DataLoader.

Only this module and ``pipeprof.trials.ray_trials`` import ray, lazily: without the extra nothing else changes.
"""

from __future__ import annotations

import gc
import os
import time
from typing import Any, Iterator, Optional

import numpy as np

EXTRA = 'pip install "pipeprof[ray]"'
#: batches of the index dataset (each row ``index % len(source)``): more than a trial takes in its time cap at the
#: rates seen (2,000 batches), so no pass ends inside a window, where a new pass would restart the actors
BLOCKS = 2000
THREAD_ENV = {"OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1", "OPENBLAS_NUM_THREADS": "1"}


def require_ray():
    """The ray module, or a clear error naming the extra."""
    try:
        import ray
        import ray.data  # noqa: F401
    except ImportError as exc:
        raise RuntimeError(f"data.engine: ray needs Ray Data, which is not installed ({exc}): {EXTRA}") from None
    return ray


def ensure_cluster(object_store_mb: Optional[int] = None) -> dict:
    """Join the cluster ``RAY_ADDRESS`` names, else start a local one (once per process); returns its facts.

    Without ``RAY_ADDRESS`` the address is ``local``: a new cluster of this process's own, never one that ``ray
    start`` left running on the machine (which ``ray.init()`` alone would join, another job's included).
    ``object_store_mb``: the local cluster's object store (None: Ray's default); ignored when joining."""
    ray = require_ray()
    if not ray.is_initialized():
        address = os.environ.get("RAY_ADDRESS") or "local"
        kw: dict[str, Any] = {"runtime_env": {"env_vars": THREAD_ENV}, "log_to_driver": False}
        if address == "local":
            kw |= {"include_dashboard": False}
            if object_store_mb:
                kw["object_store_memory"] = int(object_store_mb) * 1024 * 1024
        ray.init(address=address, **kw)
    return cluster_facts()


def cluster_facts() -> dict:
    """Ray's version, the cluster's live nodes and their CPUs (run.json's ``ray``, each Ray trial's columns)."""
    ray = require_ray()
    nodes = [n for n in ray.nodes() if n.get("Alive")]
    cpus = [float(n.get("Resources", {}).get("CPU", 0.0)) for n in nodes]
    return {
        "ray_version": ray.__version__,
        "ray_nodes": len(nodes),
        "ray_cpus": float(sum(cpus)),
        "ray_node_cpus": ",".join(f"{c:g}" for c in cpus),
        "ray_address": os.environ.get("RAY_ADDRESS") or "local",
    }


def node_key(node_id: str) -> int:
    """A Ray node id (hex) as a number a batch column can carry (its first 60 bits)."""
    return int(node_id[:15], 16)


def local_node_keys() -> set[int]:
    """The :func:`node_key` of every live node on this machine (its address the driver's node's): an actor on one of
    them is a process here, which the monitor can read; a remote actor's process id names nothing here."""
    ray = require_ray()
    nodes = [n for n in ray.nodes() if n.get("Alive")]
    mine = ray.get_runtime_context().get_node_id()
    here = {n.get("NodeManagerAddress") for n in nodes if n["NodeID"] == mine}
    return {node_key(n["NodeID"]) for n in nodes if n.get("NodeManagerAddress") in here}


def _single_thread() -> None:
    """One thread in an actor, as pipeprof's DataLoader workers run (measure.loader.worker_init)."""
    import cv2
    import torch

    cv2.setNumThreads(1)
    torch.set_num_threads(1)


class PipelineActor:
    """A Ray Data actor: read, decode and augment each batch of indices with pipeprof's pipeline.

    Besides ``image`` and ``label`` each row carries the actor's process id, its node (:func:`node_key`) and its
    process CPU seconds so far (``cpu_s``, read after its batch: Ray's own threads in the actor included), from which
    the training process takes the pipeline's CPU cost a sample over the measured windows, wherever the actor runs,
    and the nodes its actors ran on."""

    def __init__(self, source, decoder: str, preset: str, image_size: int, policy):
        import ray

        from .augment import load_preset
        from .dataset import PipelineDataset

        _single_thread()
        self.dataset = PipelineDataset(source, decoder, load_preset(preset, image_size), False, policy)
        self.pid = os.getpid()
        self.node = node_key(ray.get_runtime_context().get_node_id())

    def __call__(self, batch: dict) -> dict:
        n = len(self.dataset)
        samples = [self.dataset[int(i) % n] for i in batch["id"]]
        return _rows(
            np.stack([np.asarray(s.image) for s in samples]),
            np.asarray([s.label for s in samples], dtype=np.int64),
            self.pid,
            self.node,
        )


class PrebuiltActor:
    """The hand-off's actor: one real batch built once, returned for every batch of indices (no read, decode or
    augment), so the trial times only what carries it: the object store, the iterator, the pinning."""

    def __init__(self, source, decoder: str, preset: str, image_size: int, policy):
        self.inner = PipelineActor(source, decoder, preset, image_size, policy)
        self.held: Optional[dict] = None

    def __call__(self, batch: dict) -> dict:
        k = len(batch["id"])
        if self.held is None or len(self.held["label"]) < k:
            self.held = self.inner(batch)
        return _rows(self.held["image"][:k], self.held["label"][:k], self.inner.pid, self.inner.node)


def _rows(images: np.ndarray, labels: np.ndarray, pid: int, node: int) -> dict:
    k = len(labels)
    return {
        "image": images,
        "label": labels,
        "pid": np.full(k, pid, dtype=np.int64),
        "node": np.full(k, node, dtype=np.int64),
        "cpu_s": np.full(k, time.process_time(), dtype=np.float64),
    }


_INDEX: dict[tuple[str, int], Any] = {}  # (the cluster's address, batch size) -> its index dataset


def index_dataset(batch_size: int):
    """The sample indices in the object store, in :data:`BLOCKS` blocks of one batch each (column ``id``).

    In the object store, not read by tasks: no read task waits for a CPU (at the limit the actors hold every CPU, and
    a read needing one stalls the stream), and each block goes to any actor. Made once per cluster and batch size in
    a process (``from_items`` builds the blocks here: 2,000 blocks took 2.3 s on the 2-core machine, where
    ``from_numpy``'s metadata task per block took 7-11 s, a trial's start-up): each trial's pipeline is a new
    ``map_batches`` over the same blocks."""
    import ray
    import ray.data

    key = (ray.get_runtime_context().gcs_address, int(batch_size))
    if key not in _INDEX:
        _INDEX[key] = ray.data.from_items([{"id": i} for i in range(BLOCKS * batch_size)], override_num_blocks=BLOCKS)
    return _INDEX[key]


class RayStream:
    """Endless batches ``{"image", "label", "pid", "node", "cpu_s"}`` (torch tensors) from Ray Data at ``cpus`` CPUs.

    ``prebuilt``: the hand-off's stream (one batch built once). ``close()`` stops the streaming executor and its
    actors, so the next trial starts from none."""

    def __init__(
        self,
        source,
        spec,
        policy,
        cpus: int,
        pin_memory: bool,
        prefetch_batches: int,
        prebuilt: bool = False,
    ):
        require_ray()
        from ray.data import DataContext
        from ray.data._internal.execution.interfaces.execution_options import ExecutionResources

        if cpus < 1:
            raise ValueError(f"data.engine ray: a trial needs at least 1 CPU for Ray Data, not {cpus}")
        context = DataContext.get_current()
        context.execution_options.resource_limits = ExecutionResources(cpu=float(cpus))
        context.enable_progress_bars = False
        context.print_on_execution_start = False
        actor = PrebuiltActor if prebuilt else PipelineActor
        ds = index_dataset(spec.batch_size).map_batches(
            actor,
            fn_constructor_args=(source, spec.decoder, spec.preset, spec.image_size, policy),
            batch_size=spec.batch_size,
            batch_format="numpy",
            concurrency=cpus,
            num_cpus=1,
        )
        self.cpus = cpus
        self._it: Iterator = iter(
            ds.iter_torch_batches(
                batch_size=spec.batch_size,
                prefetch_batches=prefetch_batches,
                pin_memory=pin_memory,
                drop_last=True,
                device="cpu",
            )
        )

    def __iter__(self):
        return self

    def __next__(self) -> dict:
        return next(self._it)

    def close(self) -> None:
        close = getattr(self._it, "close", None)
        if close is not None:
            close()
        self._it = iter(())
        gc.collect()  # the executor's shutdown runs when its iterator is collected: its actors go now


class ActorCpu:
    """The actors' CPU over the measured batches: per actor (its process id and node: two nodes may hold the same
    id), the CPU seconds between the first row it produced inside the windows and its last, over the rows it
    produced after that first one (s a sample)."""

    def __init__(self):
        self.first: dict[tuple[int, int], float] = {}
        self.last: dict[tuple[int, int], float] = {}
        self.rows: dict[tuple[int, int], int] = {}

    def add(self, batch: dict) -> None:
        pids, nodes, cpu = batch["pid"].numpy(), batch["node"].numpy(), batch["cpu_s"].numpy()
        for pid, node in set(zip(pids.tolist(), nodes.tolist())):
            mine = cpu[(pids == pid) & (nodes == node)]
            p = (pid, node)
            if p not in self.first:
                self.first[p] = float(mine.min())
            after = mine > self.first[p]
            self.rows[p] = self.rows.get(p, 0) + int(after.sum())
            self.last[p] = max(self.last.get(p, 0.0), float(mine.max()))

    def per_sample_s(self) -> Optional[float]:
        rows = sum(self.rows.values())
        spent = sum(self.last[p] - self.first[p] for p in self.first)
        return spent / rows if rows else None
