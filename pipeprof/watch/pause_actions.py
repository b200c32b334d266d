"""Action trials inside ``--tune``'s pause: the user's loader against changed copies of it, windows alternated.

The parent plans the actions (``pipeprof.actions.plan`` on the watched answer) and sends them with the worker
count it recommends; :func:`run` builds each side in the watched process and times them as a sweep's action
trial times its sides (``trials.action_trial``: one or two variants and the baseline in one rotation, ABBA
windows, the side not timed has its workers stopped, each side started untimed first), with no step: the
loop is paused, so each side is its loader alone plus what the training process does to a batch before the
step (the copy to the job's device; for uint8 the normalisation there, for the GPU path the decode and
augment). That work is clocked apart per sample (CUDA events on a GPU, the process clock's wall time on a
CPU), so the parent can add it to the step where it runs serially with it (``watch.tune.with_actions``).

A side is built from the user's own DataLoader arguments (``pause.rebuild``): a knob's variant with other
keywords, a pipeline's variant (``data.user_pipeline``) with a changed copy of the dataset and, where it
needs one, its collate. The user's loader and its iterator are never touched.
"""

from __future__ import annotations

import time
from types import SimpleNamespace
from typing import Callable, Optional

import torch

from pipeprof.data.user_pipeline import BUILDERS
from pipeprof.measure.loader import EndlessIter, Pause, prefetch_depth, shutdown
from pipeprof.measure.windows import rotating
from pipeprof.trials.action_trial import paired_columns, start_sides


def images_of(batch):
    """The images of a batch as a training loop takes them: the first element, or the first tensor of a dict."""
    if isinstance(batch, (list, tuple)):
        return batch[0]
    if isinstance(batch, dict):
        return next((v for v in batch.values() if isinstance(v, torch.Tensor)), None)
    return batch


def copy_to(images, device):
    """The baseline's work before the step: the images to the job's device, as the user's loop does."""
    return images.to(device, non_blocking=True) if isinstance(images, torch.Tensor) else images


class DeviceClock:
    """Per-sample time of the training process's work on a batch (the ``on_device`` call): CUDA events on a
    GPU (read after the trial, so nothing waits per batch), the wall clock on a CPU."""

    def __init__(self, device: str):
        self.cuda = str(device).startswith("cuda")
        self.pairs: list = []
        self.samples = 0

    def timed(self, fn: Callable, n: int):
        if self.cuda:
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            out = fn()
            end.record()
            self.pairs.append((start, end))
        else:
            t0 = time.perf_counter()
            out = fn()
            self.pairs.append(time.perf_counter() - t0)
        self.samples += n
        return out

    def us_per_sample(self) -> Optional[float]:
        if not self.samples:
            return None
        if self.cuda:
            torch.cuda.synchronize()
            total = sum(s.elapsed_time(e) for s, e in self.pairs) / 1e3
        else:
            total = sum(self.pairs)
        return total / self.samples * 1e6


def build_side(rebuild: Callable, loader, workers: int, action: Optional[str], params: dict):
    """(the side's DataLoader, its on_device work, its sample count rule or None) for ``action`` (None: the
    baseline, the user's loader rebuilt as it is)."""
    if action is None or action not in BUILDERS:  # the baseline, or a knob: the user's dataset as it is
        return rebuild(loader, workers, **_knobs(loader, params)), None
    variant = BUILDERS[action](loader.dataset)
    changes = {"dataset": variant.dataset} | ({"collate_fn": variant.collate} if variant.collate else {})
    return rebuild(loader, workers, **changes), variant.on_device


def _knobs(loader, params: dict) -> dict:
    if params.get("prefetch_factor") == "2x":
        return params | {"prefetch_factor": 2 * (loader.prefetch_factor or 2)}
    return dict(params)


def run(rebuild: Callable, loader, cmd: dict, count: Callable) -> list[dict]:
    """The variants of ``cmd["actions"]`` (one or two ``[id, params]``) against the user's loader at
    ``cmd["workers"]``, in one rotation; each variant's columns (``trials.action_trial.paired_columns``) and
    both sides' device work per sample."""
    workers, device = int(cmd["workers"]), cmd.get("device") or "cpu"
    policy = SimpleNamespace(**cmd["policy"])
    started = time.perf_counter()
    specs = [(None, {})] + [(a, p) for a, p in cmd["actions"]]
    sides, its, pauses = [], {}, {}
    try:
        for k, (action, params) in enumerate(specs):
            dl, on_device = build_side(rebuild, loader, workers, action, params)
            sides.append(SimpleNamespace(loader=dl, on_device=on_device, clock=DeviceClock(device), own=action))
            its[k] = EndlessIter(dl)  # a pass that ends starts again (the user's dataset is finite)
            pauses[k] = Pause(its[k])
        turns = SimpleNamespace(side=0, phase="warmup")

        def switch(k: int) -> None:
            if k != turns.side:
                pauses[turns.side].stop()
                pauses[k].resume()
            turns.side = k

        def one() -> int:
            side = sides[turns.side]
            batch = next(its[turns.side])
            n = (count(batch) if side.own not in BUILDERS else None) or len(batch[1])
            work = lambda: (side.on_device or copy_to)(images_of(batch), device)  # noqa: E731
            if turns.phase == "measure":
                side.clock.timed(work, n)
            else:
                work()
            return n

        sync = torch.cuda.synchronize if str(device).startswith("cuda") else (lambda: None)
        pf = max(s.loader.prefetch_factor or 2 for s in sides)
        depth = prefetch_depth(workers, pf)
        drain = start_sides(one, switch, pauses, SimpleNamespace(num_workers=workers), depth, pf, sync, len(specs) - 1)
        rotated = rotating(
            one,
            switch,
            len(specs) - 1,
            policy,
            drain_batches=drain,
            batch_multiple=max(workers, 1),
            sync=sync,
            on_phase=lambda p: setattr(turns, "phase", p),
            half_width=policy.ci_target,
            started=started,
        )
    finally:
        for k, it in its.items():
            pauses[k].resume()  # a stopped worker cannot exit
            shutdown(it)
    base_us = sides[0].clock.us_per_sample()
    return [
        paired_columns(rotated.paired(k), policy.max_trial_s, policy.ci_target)
        | {
            "action": specs[k][0],
            "num_workers": workers,
            "device_us_per_sample": sides[k].clock.us_per_sample(),
            "baseline_device_us_per_sample": base_us,
        }
        for k in range(1, len(specs))
    ]


def user_workers() -> list[int]:
    """The PIDs of the DataLoader workers this process has running (the user's loaders' iterators: persistent
    workers, or those of the pass the loop was in), for the pause to stop while it measures. Found among the
    live objects once per pause: a worker process does not keep what it runs (``Process._target`` is dropped
    at start), and the hook keeps no iterator (it must not hold the user's objects alive)."""
    import gc

    from torch.utils.data.dataloader import _MultiProcessingDataLoaderIter as Iter

    its = [o for o in gc.get_objects() if issubclass(type(o), Iter)]  # type(): a lazy module warns on isinstance
    return [w.pid for it in its if not it._shutdown for w in it._workers if w.pid is not None and w.is_alive()]
