"""``loader.batch_size: auto``: the largest batch whose step fits in the device's memory, with headroom.

The gpu_ceiling trial's work (the step on a batch already on the device, two steps: the second also
holds the optimizer's state) is tried at a few sizes, each recorded with the peak memory the device held
for it (run.json ``batch_size_search``). A size fits when it ran without running out of memory and its
peak stayed under :data:`HEADROOM` of the device's memory: the trial that then runs at that size holds a
little more than two bare steps (cuDNN's workspaces chosen again, the allocator's fragments, the
loader's pinned batches), and a batch searched to the last byte ran out there (docs/measured.md).

The search (:func:`largest_batch`, over any ``fits(batch)``; :func:`next_size` is its rule):

- sizes are multiples of :data:`MULTIPLE` (and so is the answer, above 8); it starts at :data:`START`;
- peak memory grows in a line with the batch (activations per sample over a fixed part: weights,
  gradients, optimizer state), so once two sizes fit, the line through the two largest says where the
  headroom ends, and that size is tried next; until then it doubles, up to :data:`MOST`;
- it stops when the largest size that fits and the smallest that does not are within an eighth of the
  former (:data:`PRECISION`): finer steps cost a try each for a few percent of batch;
- when the line misses (a size it predicts fails), it bisects.

So it tries a few sizes, not one per multiple of 8. The chosen size is then confirmed by the
gpu_ceiling trial that uses it (:func:`confirm`): one that runs out of memory there gives way to the
next size down (an eighth smaller), with a line saying so, up to :data:`FALLBACKS` times.

With several models, precisions or modes each is searched, and the smallest answer is the run's batch
(the sweep has one batch axis). On a CPU device ``auto`` is the CPU default (``config.resolve``): host
memory is not what decides a CPU step's batch.
"""

from __future__ import annotations

import time
from dataclasses import replace
from typing import Callable, Optional

import psutil
import torch

from pipeprof.config import ConfigError
from pipeprof.trials import TrialContext, TrialSpec
from pipeprof.trials.columns import is_oom
from pipeprof.trials.heap import release, trial_heap
from pipeprof.trials.skeleton import make_step

from .sweep import expand, run_one

START, MOST = 32, 4096
MULTIPLE = 8  # sizes tried and chosen: tensor cores and most kernels work in multiples of 8
PRECISION = 8  # stop when the bracket is within 1/PRECISION of the size that fits
HEADROOM = 0.90  # share of the device's memory a chosen batch's step may hold at its peak
FALLBACKS = 3  # sizes the confirming trial may step down before the run gives up
FIT_STEPS = 2
_MIB = 2**20

Fits = Callable[[int], tuple[bool, Optional[float]]]  # batch -> (it ran, peak memory the device held in MiB)


def _down(batch: float) -> int:
    """``batch`` rounded down to a multiple of :data:`MULTIPLE` (sizes below it stay whole)."""
    return int(batch) // MULTIPLE * MULTIPLE if batch >= MULTIPLE else max(int(batch), 0)


def _edge(tried: list[dict], budget_mb: Optional[float]) -> Optional[float]:
    """Where the line through the two largest sizes that fit reaches ``budget_mb``; None without two
    such sizes with peaks, a budget, or a line that rises."""
    points = sorted((t["batch_size"], t["peak_mb"]) for t in tried if t["fits"] and t["peak_mb"] is not None)
    if budget_mb is None or len(points) < 2:
        return None
    (b1, p1), (b2, p2) = points[-2:]
    slope = (p2 - p1) / (b2 - b1)
    return b2 + (budget_mb - p2) / slope if slope > 0 else None


def next_size(tried: list[dict], budget_mb: Optional[float], start: int = START, most: int = MOST) -> Optional[int]:
    """The next batch to try after ``tried`` (each ``{"batch_size", "fits", "peak_mb"}``), or None when the
    search is done: see the module's docstring."""
    if not tried:
        return start
    over = [t["batch_size"] for t in tried if not t["fits"]]
    high = min(over, default=None)
    low = max((t["batch_size"] for t in tried if t["fits"] and (high is None or t["batch_size"] < high)), default=0)
    if low == 0:  # not even the smallest tried fits: halve towards 1
        return high // 2 if high > 1 else None
    step, edge = max(MULTIPLE, _down(low / PRECISION)), _edge(tried, budget_mb)
    if high is None:
        if low >= most:
            return None
        grow = low * 2 if edge is None else max(_down(edge), low + step)  # at least an eighth more
        return min(grow, most)
    if high - low <= step:
        return None
    if edge is not None:
        # at least an eighth above the size that fits: memory that grows faster than the line (vgg16 fp32's
        # convolution workspaces) kept the line's edge just above it, and the search crept up in steps of a
        # few percent (docs/measured.md)
        nxt = max(_down(edge), low + step)
        if nxt < high:
            return nxt
    mid = _down((low + high) / 2)
    return mid if low < mid < high else None


def largest_batch(
    fits: Fits, start: int = START, most: int = MOST, budget_mb: Optional[float] = None
) -> tuple[int, list[dict]]:
    """The largest batch that fits (``fits(b)`` ran, its peak at most ``budget_mb``), to within an eighth,
    when every smaller batch fits too. Returns (that size, or 0 when not even 1 fits; each size tried, in
    order, with its peak, why it did not fit and its seconds)."""
    tried: list[dict] = []
    while (batch := next_size(tried, budget_mb, start, most)) is not None:
        t0 = time.perf_counter()
        ran, peak = fits(batch)
        over = ran and budget_mb is not None and peak is not None and peak > budget_mb
        why = (
            None
            if ran and not over
            else ("out of memory" if not ran else f"peak {peak:,.0f} MiB above the headroom's {budget_mb:,.0f} MiB")
        )
        tried.append(
            {
                "batch_size": batch,
                "fits": ran and not over,
                "peak_mb": peak,
                "why": why,
                "seconds": time.perf_counter() - t0,
            }
        )
    return max((t["batch_size"] for t in tried if t["fits"]), default=0), tried


def peak_mb(device: torch.device) -> float:
    """The most memory the device held since the last reset: the CUDA allocator's reserved peak (what the
    device gave, fragments included, not only what tensors used), or the process's RSS (CPU)."""
    if device.type == "cuda":
        return torch.cuda.max_memory_reserved(device) / _MIB
    return psutil.Process().memory_info().rss / _MIB


def budget_mb(device: torch.device) -> Optional[float]:
    """:data:`HEADROOM` of the device's memory, less what is held on it outside this process's allocator
    (other processes, this process's CUDA context); None on a CPU device."""
    if device.type != "cuda":
        return None
    free, total = torch.cuda.mem_get_info(device)
    elsewhere = total - free - torch.cuda.memory_reserved(device)
    return (HEADROOM * total - elsewhere) / _MIB


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
    """``fits(batch)``: the step of ``spec`` at that batch ran without running out of memory (and its peak);
    any other failure is raised."""

    def fits(batch: int) -> tuple[bool, Optional[float]]:
        # release's collection walks only what this try made, not the whole heap (a full one walks every object
        # the process holds, at each try); on a GPU the garbage already there is freed first (it may hold device
        # memory); inside the runner's search (``runner._batch_size``) its policy holds
        with trial_heap(collect_first=ctx.device.type == "cuda"):
            try:
                return True, _two_steps(ctx, replace(spec, batch_size=batch))
            except Exception as exc:  # noqa: BLE001 - only running out of memory answers the question
                if not is_oom(exc):
                    raise
                return False, peak_mb(ctx.device)
            finally:
                release(ctx.device)

    return fits


def _one_gpu(cfg, batch: int):
    """``cfg`` planning only the one-GPU gpu_ceiling trials, at ``batch``."""
    return cfg.model_copy(
        update={
            "trials": ["gpu_ceiling"],
            "loader": cfg.loader.model_copy(update={"batch_size": [batch]}),
            "distributed": cfg.distributed.model_copy(update={"gpus": [1]}),
        }
    )


def auto_batch_size(
    ctx: TrialContext, cfg, probe, user: bool, log: Callable[[str], None], most: int = MOST
) -> tuple[int, dict]:
    """The batch of a resolved ``cfg`` whose ``loader.batch_size`` is auto (at most ``most``: the dataset's
    samples), and the record of the search (run.json ``batch_size_search``); ConfigError when the step fails
    otherwise, or no batch fits."""
    searches, budget = [], budget_mb(ctx.device)
    for spec in expand(_one_gpu(cfg, 1), probe, user_dataset=user):
        t0 = time.perf_counter()
        try:
            best, tried = largest_batch(step_fits(ctx, spec), min(START, most), most, budget)
        except Exception as exc:  # noqa: BLE001 - the user's model: say which and why, before any run
            raise ConfigError(
                f"loader.batch_size: auto: the step of {spec.model} failed ({type(exc).__name__}: {exc})"
            ) from None
        searches.append(
            {
                "model": spec.model,
                "precision": spec.precision,
                "mode": spec.mode,
                "image_size": spec.image_size,
                "largest": best,
                "tried": tried,
                "seconds": time.perf_counter() - t0,
            }
        )
        log(
            f"loader.batch_size auto: {spec.model} {spec.precision} {spec.mode} on {cfg.device}: {best} "
            f"({len(tried)} sizes tried in {searches[-1]['seconds']:.1f} s: {', '.join(_tried(t) for t in tried)})"
        )
    chosen = min(s["largest"] for s in searches)
    if chosen < 1:
        raise ConfigError("loader.batch_size: auto: not even a batch of 1 fits in the device's memory")
    return chosen, {
        "policy": "auto",
        "start": START,
        "most": most,
        "headroom": HEADROOM,
        "budget_mb": budget,
        "precision": f"1/{PRECISION}",
        "chosen": chosen,
        "searches": searches,
        "basis": f"the largest multiple of {MULTIPLE} (within an eighth) whose step ({FIT_STEPS} steps "
        f"on a device-resident batch) ran with its peak under {HEADROOM:.0%} of the device's "
        "memory; the smallest over the models, precisions and modes",
    }


def _tried(t: dict) -> str:
    return f"{t['batch_size']}{'' if t['fits'] else ' ✗'}"


def confirm(
    ctx: TrialContext, cfg, probe, user: bool, chosen: int, log: Callable[[str], None]
) -> tuple[int, list[dict]]:
    """Run the gpu_ceiling trial at ``chosen`` for each model, precision and mode, as the sweep runs it
    (``sweep.run_one``, under ``ctx.monitor``); on out of memory step down an eighth (to a multiple of 8),
    with a line saying so, at most :data:`FALLBACKS` times. Returns (the batch that ran; each attempt: batch,
    trial, status, rate, error). A ConfigError when the last size tried still ran out of memory: no batch
    that did not run is handed to the sweep."""
    batch, attempts, steps = chosen, [], 0
    while True:
        # as in ``step_fits``: each trial's release walks the objects the trial made, not the whole heap
        with trial_heap(collect_first=ctx.device.type == "cuda"):
            rows = [
                run_one(ctx, spec, lambda *a: {}) for spec in expand(_one_gpu(cfg, batch), probe, user_dataset=user)
            ]
        attempts += [
            {
                "batch_size": batch,
                "trial_id": r["trial_id"],
                "status": r["status"],
                "samples_per_s": r.get("samples_per_s"),
                "error": r.get("error"),
            }
            for r in rows
        ]
        oom = next((r for r in rows if r["status"] == "oom"), None)
        if oom is None:
            return batch, attempts
        smaller = _down(batch - max(1, batch // PRECISION))
        if smaller < 1 or steps == FALLBACKS:
            raise ConfigError(
                f"loader.batch_size: auto: {batch} still ran out of memory in the trial that uses it "
                f"({oom['trial_id']}) after {steps} step(s) down from {chosen}: set loader.batch_size "
                "to a size that fits"
            )
        log(
            f"loader.batch_size auto: {batch} ran out of memory in the trial that uses it ({oom['trial_id']}); "
            f"falling back to {smaller}"
        )
        batch, steps = smaller, steps + 1
