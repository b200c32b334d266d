"""Action trials inside ``--tune``'s pause: the user's loader and changed copies of it, each timed alone.

The parent plans the actions (``pipeprof.actions.plan`` on the watched answer) and asks for one side at a time
at the worker count it recommends: the user's loader (the baseline), each action's variant, then the baseline
again (``watch.tune.bracketed``: the baseline's two readings bound the machine's drift between them). Each side
is measured as the pause's curve points are (``pause.measure``: steady-state windows of whole worker rounds,
median and 95% interval), with no step: the loop is paused, so a side is its loader alone plus what the
training process does to a batch before the step (the copy to the job's device; for uint8 the normalisation
there, for the GPU path the decode and augment), closed by the device's sync at each window's end. That work is
also clocked per sample (CUDA events on a GPU, the wall clock on a CPU), so the parent can add it to the step
where it runs serially with it (``watch.tune.with_step``).

Why sides in turn and not the sweep's alternating windows: within the pause's budget a rotation fits only a few
pairs of short windows, and a pass's end falls inside some of them and not others, which left the gain's interval
far wider than the gain (docs/measured.md, "``pipeprof watch --tune`` with actions"); a side's own steady-state
windows take the median over many rounds in the same time.

A side is built from the user's own DataLoader arguments (``pause.rebuild``): a knob's variant with other
keywords, a pipeline's variant (``data.user_actions``) with a changed copy of the dataset and, where it
needs one, its collate. The user's loader and its iterator are never touched.
"""

from __future__ import annotations

import functools
from typing import Callable, Optional

import torch

from pipeprof.data.user_actions import BUILDERS
from pipeprof.measure.step import DeviceClock


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


class WorkClock:
    """Per-sample time of the training process's work on a batch (the ``on_device`` call), marked on the step's
    device by ``measure.step.DeviceClock`` (CUDA events on a GPU, read after the trial so nothing waits per
    batch; the host clock on a CPU)."""

    def __init__(self, device: str):
        self.clock = DeviceClock(torch.device(device))
        self.marks: list = []
        self.samples = 0

    def timed(self, fn: Callable, n: int):
        start = self.clock.mark()
        out = fn()
        self.marks.append((start, self.clock.mark()))
        self.samples += n
        return out

    def us_per_sample(self) -> Optional[float]:
        if not self.samples:
            return None
        self.clock.sync()
        return sum(self.clock.elapsed_ms(a, b) for a, b in self.marks) * 1e3 / self.samples


def changes_for(loader, action: Optional[str], params: dict) -> tuple[dict, Optional[Callable]]:
    """(the DataLoader keywords ``action``'s variant changes, its work on the device or None) (None: the
    baseline, the user's loader as it is)."""
    if action is None or action not in BUILDERS:  # the baseline, or a knob: the user's dataset as it is
        return dict(params), None  # (a knob's figures: the watch plans them on the loader's own settings)
    variant = BUILDERS[action](loader.dataset)
    return {"dataset": variant.dataset} | (
        {"collate_fn": variant.collate} if variant.collate else {}
    ), variant.on_device


def side_stats(loader, cmd: dict, count: Callable, measure: Callable, on_workers: Callable = lambda pids: None) -> dict:
    """One side (``cmd["action"]``, None: the baseline) at ``cmd["workers"]``: ``measure``'s stats with the
    side's work on each batch and its device time per sample; ``on_workers(pids)`` as each pass starts them."""
    device = cmd.get("device") or "cpu"
    changes, on_device = changes_for(loader, cmd.get("action"), cmd.get("params") or {})
    built = cmd.get("action") in BUILDERS
    phase, kept = {"now": "warmup"}, []

    def on(batch):  # the side's work in the training process on one batch
        return (on_device or copy_to)(images_of(batch), device)

    def work(batch) -> int:
        # a variant's (images, targets) (the GPU path's images are packed bytes); else as the user's batches count
        n = len(batch[1]) if built and isinstance(batch, (list, tuple)) else count(batch) or len(batch[1])
        on(batch)
        if phase["now"] == "measure" and len(kept) < KEPT:
            kept.append((batch, n))
        return n

    work.on_phase = lambda p: phase.update(now=p)
    sync = torch.cuda.synchronize if str(device).startswith("cuda") else None
    stats = measure(loader, int(cmd["workers"]), cmd["policy"], on_workers, count, changes, work, sync)
    # the work timed alone, on batches the windows took, once the side's workers have stopped. In the windows the
    # workers run flat out beside it, more than in the loop whose step it is added to, and on a CPU its wall clock
    # read their load, not the work (docs/watch.md, "--tune")
    clock = WorkClock(device)
    for batch, n in kept:
        clock.timed(functools.partial(on, batch), n)
    return stats | {"device_us_per_sample": clock.us_per_sample()}


#: batches of a side's windows kept to time its training-process work alone after them
KEPT = 4


def user_workers() -> list[int]:
    """The PIDs of the DataLoader workers this process has running (the user's loaders' iterators: persistent
    workers, or those of the pass the loop was in), for the pause to stop while it measures. Found among the
    live objects once per pause: a worker process does not keep what it runs (``Process._target`` is dropped
    at start), and the hook keeps no iterator (it must not hold the user's objects alive)."""
    import gc

    from torch.utils.data.dataloader import _MultiProcessingDataLoaderIter as Iter

    its = [o for o in gc.get_objects() if issubclass(type(o), Iter)]  # type(): a lazy module warns on isinstance
    return [w.pid for it in its if not it._shutdown for w in it._workers if w.pid is not None and w.is_alive()]
