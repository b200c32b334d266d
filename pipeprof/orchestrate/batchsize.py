"""``loader.batch_size: auto``: the largest batch whose step fits in the device's memory.

The gpu_ceiling trial's work (the step on a batch already on the device, two steps: the second also
holds the optimizer's state) is tried at 32, 64, ... up to :data:`MOST` until one runs out of memory,
then the sizes between the last that fitted and the first that did not are bisected. Every size tried
is recorded with the peak memory it took (run.json ``batch_size_search``). With several models,
precisions or modes each is searched, and the smallest answer is the run's batch (the sweep has one
batch axis). On a CPU device ``auto`` is the CPU default (``config.resolve``): host memory is not what
decides a CPU step's batch.

:func:`largest_batch` is the search alone, over any ``fits(batch)``; :func:`step_fits` is the real one.
"""
from __future__ import annotations

from dataclasses import replace
from typing import Callable, Optional

import psutil
import torch

from pipeprof.config import ConfigError
from .sweep import expand, release
from pipeprof.trials import TrialContext, TrialSpec
from pipeprof.trials.columns import is_oom
from pipeprof.trials.skeleton import make_step

START, MOST = 32, 4096
FIT_STEPS = 2
_MIB = 2 ** 20

Fits = Callable[[int], tuple[bool, Optional[float]]]  # batch -> (it fits, peak memory in MiB)


def largest_batch(fits: Fits, start: int = START, most: int = MOST) -> tuple[int, list[dict]]:
    """The largest batch ``b`` for which ``fits(b)`` holds, when every smaller batch fits too: doubling from
    ``start`` while it fits (up to ``most``), then bisecting between the last size that fitted and the first
    that did not. Returns (that size, or 0 when not even 1 fits; each size tried, in order, with its peak)."""
    tried: list[dict] = []

    def ok(batch: int) -> bool:
        fit, peak = fits(batch)
        tried.append({"batch_size": batch, "fits": fit, "peak_mb": peak})
        return fit

    low, high, batch = 0, None, start
    while batch <= most:
        if not ok(batch):
            high = batch
            break
        low, batch = batch, batch * 2
    if high is None:  # everything up to the most fits: the search stops there
        return low, tried
    while high - low > 1:
        mid = (low + high) // 2
        low, high = (mid, high) if ok(mid) else (low, mid)
    return low, tried


def peak_mb(device: torch.device) -> float:
    """The most device memory allocated since the last reset (CUDA), or the process's RSS (CPU)."""
    if device.type == "cuda":
        return torch.cuda.max_memory_allocated(device) / _MIB
    return psutil.Process().memory_info().rss / _MIB


def _two_steps(ctx: TrialContext, spec: TrialSpec) -> float:
    if ctx.device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(ctx.device)
    step = make_step(ctx, spec)
    x, y = step.synthetic_batch(spec.batch_size, spec.image_size, getattr(torch, spec.input_dtype))
    for _ in range(FIT_STEPS):
        step.run(x, y, on_device=True)
    step.clock.sync()
    return peak_mb(ctx.device)


def step_fits(ctx: TrialContext, spec: TrialSpec) -> Fits:
    """``fits(batch)``: the step of ``spec`` at that batch ran without running out of memory; any other
    failure is raised."""
    def fits(batch: int) -> tuple[bool, Optional[float]]:
        try:
            return True, _two_steps(ctx, replace(spec, batch_size=batch))
        except Exception as exc:  # noqa: BLE001 - only running out of memory answers the question
            if not is_oom(exc):
                raise
            return False, peak_mb(ctx.device)
        finally:
            release(ctx.device)
    return fits


def auto_batch_size(ctx: TrialContext, cfg, probe, user: bool, log: Callable[[str], None]) -> tuple[int, dict]:
    """The batch of a resolved ``cfg`` whose ``loader.batch_size`` is auto, and the record of the search
    (run.json ``batch_size_search``); ConfigError when the step fails otherwise, or no batch fits."""
    one = cfg.model_copy(update={"trials": ["gpu_ceiling"], "loader": cfg.loader.model_copy(update={"batch_size": [1]}),
                                 "distributed": cfg.distributed.model_copy(update={"gpus": [1]})})
    searches = []
    for spec in expand(one, probe, user_dataset=user):
        log(f"loader.batch_size auto: the largest batch of {spec.model} {spec.precision} {spec.mode} on "
            f"{cfg.device}")
        try:
            best, tried = largest_batch(step_fits(ctx, spec))
        except Exception as exc:  # noqa: BLE001 - the user's model: say which and why, before any run
            raise ConfigError(f"loader.batch_size: auto: the step of {spec.model} failed "
                              f"({type(exc).__name__}: {exc})") from None
        searches.append({"model": spec.model, "precision": spec.precision, "mode": spec.mode,
                         "image_size": spec.image_size, "largest": best, "tried": tried})
    chosen = min(s["largest"] for s in searches)
    if chosen < 1:
        raise ConfigError("loader.batch_size: auto: not even a batch of 1 fits in the device's memory")
    return chosen, {"policy": "auto", "start": START, "most": MOST, "chosen": chosen, "searches": searches,
                    "basis": f"the largest batch whose step ({FIT_STEPS} steps on a device-resident batch) ran "
                             "without running out of memory; the smallest over the models, precisions and modes"}
