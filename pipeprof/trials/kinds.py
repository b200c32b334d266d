"""The trial kinds, each registered once in :data:`KINDS`.

| kind           | timed region of one step                                   |
|----------------|------------------------------------------------------------|
| end_to_end     | next(loader) + host→device copy + model step               |
| gpu_ceiling    | model step on a batch already on the device (no loader)    |
| cpu_pipeline   | next(loader): read → decode → augment → collate (→ pin)    |
| storage_fetch  | next(loader) over a dataset that only reads the bytes      |
| handoff        | next(loader) over pre-built samples: collate, receive, pin |

To add a kind: write ``fn(ctx, spec) -> dict`` here and add one :class:`Kind` entry to
:data:`KINDS` (its timed region, and which axes of the sweep it takes); ``sweep.expand``
plans it from the entry and run.json's ``timed_regions`` lists it.
"""

from __future__ import annotations

import math
import os
import time
from dataclasses import dataclass
from typing import Callable, Optional

import numpy as np
import torch

from pipeprof.data.augment import load_preset
from pipeprof.data.dataset import (
    PipelineDataset,
    PrebuiltDataset,
    RawBytesDataset,
    SampleTally,
    TimingSwitch,
    collate_bytes,
    collate_pipeline,
)
from pipeprof.data.encoded import EncodedDataset, collate_encoded
from pipeprof.env import confine, cpu_groups, mask_for
from pipeprof.measure.confounders import step_threads, torch_threads
from pipeprof.measure.loader import prefetch_depth, worker_pids
from pipeprof.measure.monitors import windows_cpu
from pipeprof.measure.windows import alternating, rotating, summarize_rates
from pipeprof.schema import TIMED_REGIONS, TrialKind

from .columns import StepRecord, sample_columns, stage_totals, step_columns
from .device_side import device_side, feed, gpu_feed, overlap_columns, pipeline_wait_columns
from .skeleton import (
    close_loader,
    collate_for,
    loader_columns,
    loader_trial,
    loop_with,
    make_step,
    open_loader,
    pipeline_dataset,
)
from .spec import TrialContext, TrialSpec


def end_to_end(ctx: TrialContext, spec: TrialSpec) -> dict:
    dataset = pipeline_dataset(ctx, spec)
    step = make_step(ctx, spec)
    fed = feed(ctx, spec)  # augment.device cuda: the step's device decodes and augments, before or beside the step
    records: list = []

    def one_batch(it, measuring: bool) -> int:
        batch, wait = fed.take(it, measuring)
        marks = step.run(batch["image"], batch["label"])
        if measuring:
            records.append(StepRecord(wait, marks, batch.get("stage_s")))
        return batch["image"].shape[0]

    m, extra = loader_trial(ctx, spec, dataset, one_batch, step.clock.sync, before_close=fed.close)
    overlap = overlap_columns(step.clock, [r.marks[1:] for r in records], fed.side.marks) if fed.side else {}
    overlap |= pipeline_wait_columns(fed, m.t_measure_end - m.t_measure_start)
    return (
        m.stats()
        | step_columns(step, records, m)
        | stage_totals(dataset, records, m)
        | extra
        | _side(fed.side, m)
        | overlap
    )


def gpu_ceiling(ctx: TrialContext, spec: TrialSpec) -> dict:
    step = make_step(ctx, spec)
    x, y = step.synthetic_batch(spec.batch_size, spec.image_size, getattr(torch, spec.input_dtype))
    records: list = []
    phase = {"now": "warmup"}

    def one() -> int:
        marks = step.run(x, y, on_device=True)
        if phase["now"] == "measure":
            records.append(StepRecord(None, marks))
        return spec.batch_size

    m = loop_with(ctx, spec, one, phase, step.clock.sync, 0)
    return m.stats() | step_columns(step, records, m)


#: gpu_shared's sides, in the rotation's numbering (0 the baseline, whose rate is the trial's)
TOGETHER, STEP_ALONE, PIPELINE_ALONE = 0, 1, 2


def gpu_shared(ctx: TrialContext, spec: TrialSpec) -> dict:
    """The GPU pipeline and the step on one device, no loader: one batch of the source's JPEG bytes, read once and
    held in memory, decoded and augmented as the spec says (serial or overlapped, its decoder), and the step
    trained on what comes out. Windows of the two together rotate with windows of the step alone (on a resident
    batch) and of the pipeline alone, so each is measured alone and together in one trial: the model of the GPU
    pipeline's end-to-end rate (``analysis.bounds``) reads all three, and the overlap achieved comes from the
    events of the together windows."""
    step = make_step(ctx, spec)
    side = device_side(ctx, spec)
    if side is None:
        raise ValueError("gpu_shared runs the GPU pipeline: augment.device cuda")
    source = EncodedDataset(ctx.source_for(spec), False, ctx.sample_policy)
    samples = [source[i % len(source)] for i in range(spec.batch_size)]  # read once, outside any timer
    bytes_batch = collate_encoded(samples)
    x, y = step.synthetic_batch(spec.batch_size, spec.image_size, getattr(torch, spec.input_dtype))
    fed = gpu_feed(side, ctx.device, spec)
    held = _Endless(bytes_batch)
    now = {"side": TOGETHER}
    taken: list = []  # together batches: (host time taken, the step's marks, the place of the pipeline's marks)

    def one() -> int:
        if now["side"] == STEP_ALONE:
            step.run(x, y, on_device=True)
            return spec.batch_size
        kept = len(side.marks)
        batch, _ = fed.take(held, now["side"] == TOGETHER)
        if now["side"] == TOGETHER:
            marks = step.run(batch["image"], y, on_device=True)  # the held batch's labels stay on the host
            taken.append((ctx.clock(), marks[1:], kept if len(side.marks) > kept else None))
        return spec.batch_size

    def on_phase(p: str) -> None:
        ctx.monitor.set_trial(spec.trial_id if p != "done" else None, p if p != "done" else None)

    def set_side(s: int) -> None:
        now["side"] = s
        fed.turn(s != STEP_ALONE)  # a producer thread prepares nothing beside the step alone

    try:
        for _ in range(fed.held + 2):  # the pipeline's first batches (nvJPEG's start, the allocator's growth)
            one()
        r = rotating(
            one,
            set_side,
            2,
            ctx.measure,
            drain_batches=fed.held + 1,  # a producer's queued batches were made beside the side before
            sync=step.clock.sync,
            clock=ctx.clock,
            on_phase=on_phase,
            # the together rate is the GPU pipeline's bound, read against end-to-end trials timed apart from it:
            # cycles until its own interval meets the run's target, as a trial's windows do (the planned two alone
            # left it wider than the errors its prediction is checked for: docs/measured.md)
            rate_half=ctx.measure.ci_target,
        )
        on_phase("done")
    finally:
        fed.close()
    step.clock.sync()
    return _shared_columns(r) | _side_columns(side, step, _in_windows(taken, r), r)


def _in_windows(taken: list, r) -> list:
    """The together batches taken inside a together window (not the drains after a switch, nor a window the time
    cap left out of its cycles)."""
    spans = [(c[TOGETHER].t_start, c[TOGETHER].t_end) for c in r.cycles]
    return [t for t in taken if t[2] is not None and any(a <= t[0] <= b for a, b in spans)]


class _Endless:
    """The same batch of bytes for ever: the iterator a producer thread reads in gpu_shared."""

    def __init__(self, batch: dict):
        self.batch = batch

    def __next__(self) -> dict:
        return self.batch


def _shared_columns(r) -> dict:
    """The together windows' rate as the trial's (its summary, interval and windows), each side's median rate,
    and the serial model's figure from the two alone: 1 / (1/step + 1/pipeline)."""
    rates = {s: [c[s].rate for c in r.cycles] for s in (TOGETHER, STEP_ALONE, PIPELINE_ALONE)}
    out = summarize_rates(rates[TOGETHER]) | {"pairs": len(r.cycles), "time_capped": r.time_capped}
    step, pipe = (float(np.median(rates[s])) if rates[s] else float("nan") for s in (STEP_ALONE, PIPELINE_ALONE))
    out |= {
        "step_alone_samples_per_s": step,
        "pipeline_alone_samples_per_s": pipe,
        "serial_model_samples_per_s": 1 / (1 / step + 1 / pipe) if step > 0 and pipe > 0 else float("nan"),
    }
    return out


def _side_columns(side, step, taken: list, r) -> dict:
    """The pipeline's device times over the together windows' batches, the step's compute time there, and the
    overlap achieved (read after the last sync)."""
    measured = sum(c[TOGETHER].t_end - c[TOGETHER].t_start for c in r.cycles)
    side.marks, side.host_s = [side.marks[t[2]] for t in taken], [side.host_s[t[2]] for t in taken]
    out = side.columns(measured)
    if taken:
        compute = [step.clock.elapsed_ms(*t[1]) for t in taken]
        out["step_together_compute_ms_p50"] = float(np.median(compute))
    return out | overlap_columns(step.clock, [t[1] for t in taken], side.marks)


def cpu_pipeline(ctx: TrialContext, spec: TrialSpec) -> dict:
    if spec.stage_timing is False:
        return clock_overhead(ctx, spec)
    dataset = pipeline_dataset(ctx, spec)
    fed = feed(ctx, spec)  # augment.device cuda: the loader's output is decoded batches on the device
    records: list = []

    def one_batch(it, measuring: bool) -> int:
        batch, _ = fed.take(it, measuring)
        if measuring:
            records.append(StepRecord(None, (), batch.get("stage_s")))
        return batch["image"].shape[0]

    sync = fed.side.sync if fed.side else lambda: None
    m, extra = loader_trial(ctx, spec, dataset, one_batch, sync, before_close=fed.close)
    return m.stats() | stage_totals(dataset, records, m) | extra | _side(fed.side, m)


def _side(side, m) -> dict:
    """The device's decode/augment columns of a trial whose workers only read bytes ({} otherwise)."""
    return side.columns(m.t_measure_end - m.t_measure_start) if side is not None else {}


def handoff(ctx: TrialContext, spec: TrialSpec) -> dict:
    """The loader's hand-off limit, measured: the same loader (workers, collate, pinning, prefetch) over
    one real sample built once and returned for every index, so no read, decode or augment is left.
    The rate at which batches get through the main process then bounds any pipeline of these samples:
    no count of workers or cores raises a real loader above it."""
    real = pipeline_dataset(ctx, spec)
    if real is None:
        raise ValueError("handoff needs the samples of a Dataset; a user's own DataLoader builds its batches itself")
    sample = real[0]  # built outside any timer
    dataset = PrebuiltDataset(sample, len(real))

    def one_batch(it, measuring: bool) -> int:
        return len(next(it)["label"])  # a batch of bytes (augment.device cuda) has no "image" yet

    m, extra = loader_trial(ctx, spec, dataset, one_batch, collate=collate_for(real))
    image = sample[0]
    return (
        m.stats() | extra | {"sample_kb": torch.as_tensor(image).element_size() * torch.as_tensor(image).numel() / 1e3}
    )


def cores_pair(ctx: TrialContext, spec: TrialSpec) -> dict:
    """The end-to-end loop at ``spec``'s workers, its windows alternating between all of the job's CPUs and a
    mask of as many CPUs as workers (``env.mask_for``: one a physical core first). At each switch the training
    process (every thread) and its workers are confined together (``env.confine``), so the masked side is the
    job on a machine of that many cores, measured in the same minutes as the unmasked side: the sizing check
    reads its prediction for that many cores against their paired ratio, which the machine's moves between
    separate runs do not enter (``analysis.workstation.masked_pairs``)."""
    allowed = sorted(os.sched_getaffinity(0))
    w = spec.num_workers or 0
    if not 1 <= w < len(allowed):
        raise ValueError(f"cores_pair at {w} workers: a mask of {w} CPUs must be fewer than this job's {len(allowed)}")
    mask = mask_for(w, cpu_groups())
    dataset = pipeline_dataset(ctx, spec)
    step = make_step(ctx, spec)
    fed = feed(ctx, spec)
    it = open_loader(ctx, spec, dataset, collate_for(dataset))
    pids = [os.getpid(), *worker_pids(it)]
    seen: list = []

    def set_mode(masked: bool) -> None:
        confine(pids, mask if masked else allowed)
        if masked and not seen:  # read back once from the last worker: the mask the windows ran under
            seen.extend(sorted(os.sched_getaffinity(pids[-1])))

    def one() -> int:
        batch, _ = fed.take(it, True)
        step.run(batch["image"], batch["label"])
        return len(batch["label"])

    def on_phase(p: str) -> None:
        ctx.monitor.set_trial(spec.trial_id if p != "done" else None, p if p != "done" else None)

    try:
        paired = alternating(
            one,
            set_mode,
            ctx.measure,
            on_phase=on_phase,
            drain_batches=prefetch_depth(w, ctx.prefetch_factor) + w,
            batch_multiple=w,
            sync=step.clock.sync,
        )
        how = loader_columns(ctx, it)
    finally:
        confine(pids, allowed)
        fed.close()
        close_loader(ctx, it)
    # each side's CPU from the monitor's rows inside its own windows: the sizing check reads the all-CPU side's
    # cost a sample, the machine's level in these minutes (analysis.workstation.pair_cpu)
    timeline = ctx.monitor.timeline(since=min((w.t_start for w in paired.a + paired.b), default=None))
    sides = {
        side: windows_cpu(timeline, spec.trial_id, [(w.t_start, w.t_end) for w in windows])
        for side, windows in (("all_cpus", paired.b), ("masked", paired.a))
    }
    return (
        _paired_columns(paired, ctx.measure.max_trial_s, ("masked", "mask_cost", "masked/all-CPU"))
        | how
        | {f"{side}_{k}_mean": v for side, cpu in sides.items() for k, v in cpu.items()}
        | {"mask_cpus": ",".join(map(str, mask)), "mask_cpus_seen": ",".join(map(str, seen)), "pairs": len(paired.a)}
    )


def clock_overhead(ctx: TrialContext, spec: TrialSpec) -> dict:
    """What the stage clocks cost: one loader, clocks switched on and off between windows."""
    switch = TimingSwitch(True)
    dataset = PipelineDataset(
        ctx.source_for(spec), spec.decoder, load_preset(spec.preset, spec.image_size), switch, ctx.sample_policy
    )
    return _paired_trial(
        ctx, spec, dataset, collate_pipeline, switch.set, ("clocked", "stage_clock_overhead", "clocked/unclocked")
    )


def monitor_overhead(ctx: TrialContext, spec: TrialSpec) -> dict:
    """What the monitor's sampling costs: one loader, sampling paused and resumed between windows."""
    dataset = pipeline_dataset(ctx, spec)
    try:
        return _paired_trial(
            ctx,
            spec,
            dataset,
            collate_for(dataset),
            lambda on: ctx.monitor.pause(not on),
            ("monitored", "monitor_overhead", "monitored/unmonitored"),
        )
    finally:
        ctx.monitor.pause(False)


def _paired_trial(ctx: TrialContext, spec: TrialSpec, dataset, collate, set_mode, names: tuple) -> dict:
    """ABBA windows on one loader with ``set_mode(True/False)``: the B windows' rate and the cost of A."""
    it = open_loader(ctx, spec, dataset, collate)
    tally = SampleTally(it)
    rounds = max(spec.num_workers or 1, 1)

    def on_phase(p: str) -> None:
        ctx.monitor.set_trial(spec.trial_id if p != "done" else None, p if p != "done" else None)

    try:
        paired = alternating(
            lambda: next(tally)["image"].shape[0],
            set_mode,
            ctx.measure,
            on_phase=on_phase,
            drain_batches=prefetch_depth(spec.num_workers, ctx.prefetch_factor) + rounds,
            batch_multiple=rounds,
        )
        how = loader_columns(ctx, it) | sample_columns(tally, ctx.sample_policy)
    finally:
        close_loader(ctx, it)
    return _paired_columns(paired, ctx.measure.max_trial_s, names) | how


def _paired_columns(paired, max_trial_s: float, names: tuple) -> dict:
    on, cost_name, what = names
    cost, windows = paired.cost(), paired.a + paired.b
    reasons = paired.reasons(max_trial_s, what)
    return summarize_rates([w.rate for w in paired.b]) | {
        "windows": len(windows),
        "t_measure_start_s": min(w.t_start for w in windows) if windows else None,
        "t_measure_end_s": max(w.t_end for w in windows) if windows else None,
        f"{on}_samples_per_s": summarize_rates([w.rate for w in paired.a])["samples_per_s"],
        f"{cost_name}_frac": cost["cost_frac"],
        f"{cost_name}_ci95_low": cost["cost_ci95_low"],
        f"{cost_name}_ci95_high": cost["cost_ci95_high"],
        "unstable": bool(reasons),
        "unstable_reason": "; ".join(reasons) or None,
    }


def one_pass_plan(
    samples: int,
    batch_size: int,
    workers: int,
    depth: int,
    windows: int,
    window_batches: int,
    warm_rate: Optional[float],
    window_s: float,
) -> dict:
    """Window sizes (in batches) that keep a cold measurement inside the first pass over the dataset.

    Batches consumed in warm-up and windows, plus the ``depth`` batches the workers have
    in flight when the last window closes, must not exceed one pass. Windows aim at
    ``window_s`` at the warm-up's rate (at least ``window_batches``), are shrunk (and
    reduced to no fewer than 2) to fit, and hold whole rounds of ``workers`` batches.
    """
    rounds = max(workers, 1)
    warmup = depth + rounds
    budget = samples // batch_size - warmup - depth
    want = max(window_batches, math.ceil((warm_rate or 0) * window_s / batch_size))
    per_window = -(-want // rounds) * rounds
    fit = (budget // windows) // rounds * rounds if budget > 0 else 0
    if fit >= rounds:
        per_window = min(per_window, fit)
    else:
        windows = max(2, min(windows, budget // rounds if budget > 0 else 0))
        per_window = rounds
    in_pass = (warmup + windows * per_window + depth) * batch_size <= samples
    return {"warmup_batches": warmup, "window_batches": per_window, "windows": windows, "in_first_pass": in_pass}


def _cold_loop(ctx: TrialContext, spec: TrialSpec, samples: int, depth: int, plan: dict):
    """The steady-state loop of a cold storage_fetch: the cache is cold only until each file has been
    read once, so warm up by hand, size the windows from the warm-up's rate and the batches left in
    this pass, then measure (``plan`` receives the sizes)."""

    def loop(one, phase, check, it):
        if not check.cold:
            return loop_with(ctx, spec, one, phase, lambda: None, depth + 2, check=check, it=it)
        ctx.monitor.set_trial(spec.trial_id, "warmup")
        t0, n = time.perf_counter(), 0
        for _ in range(depth + max(spec.num_workers or 1, 1)):
            n += one()
        warm_s = time.perf_counter() - t0
        plan.update(
            one_pass_plan(
                samples,
                spec.batch_size,
                spec.num_workers,
                depth,
                ctx.measure.windows,
                ctx.measure.window_batches,
                n / warm_s if warm_s > 0 else None,
                ctx.measure.window_s,
            )
        )
        policy = ctx.measure.model_copy(
            update={
                "warmup_batches": 0,
                "warmup_s": 0.0,
                "warmup_max_s": 0.0,
                "window_s": 0.0,
                "window_batches": plan["window_batches"],
                "windows": plan["windows"],
                "max_windows": plan["windows"],
            }
        )  # more would leave the pass
        m = loop_with(ctx, spec, one, phase, lambda: None, 0, policy=policy, check=check, it=it)
        m.warmup_batches, m.warmup_s = plan["warmup_batches"], warm_s
        return m

    return loop


def _read_columns(totals: dict, times: list, measured: float) -> dict:
    """Read rate, bytes and latency percentiles of the measured windows' raw reads."""
    lat = np.asarray(times) * 1e3
    cols = {
        "read_latency_ms_mean": totals["read_s"] / max(totals["n"], 1) * 1e3,
        "mean_sample_kb": totals["bytes"] / max(totals["n"], 1) / 1e3,
    }
    if measured > 0:  # no window fits when warm-up spent the whole budget: the row says unstable, no rate
        cols |= {"read_mb_s": totals["bytes"] / 1e6 / measured, "reads_s": totals["n"] / measured}
    if len(lat):
        cols |= {f"read_latency_ms_p{q}": float(np.percentile(lat, q)) for q in (50, 95, 99)}
    return cols


def storage_fetch(ctx: TrialContext, spec: TrialSpec) -> dict:
    source = ctx.source_for(spec)
    if source is None:
        raise ValueError("storage_fetch needs a pipeprof source; a user Dataset hides its storage")
    dataset = RawBytesDataset(source, ctx.sample_policy)
    totals = {"bytes": 0, "read_s": 0.0, "n": 0}
    times: list[float] = []

    def one_batch(it, measuring: bool) -> int:
        batch = next(it)
        if measuring:
            for k in totals:
                totals[k] += batch[k]
            times.extend(batch["read_times"])
        return batch["n"]

    depth, plan = prefetch_depth(spec.num_workers, ctx.prefetch_factor), {}
    m, extra = loader_trial(
        ctx, spec, dataset, one_batch, collate=collate_bytes, loop=_cold_loop(ctx, spec, len(dataset), depth, plan)
    )
    out = m.stats() | _read_columns(totals, times, m.t_measure_end - m.t_measure_start) | extra
    if plan:
        out["in_first_pass"] = plan["in_first_pass"]
    if plan and not plan["in_first_pass"]:
        note = (
            f"dataset too small for a cold measurement within one pass ({len(dataset)} samples, batch "
            f"{spec.batch_size}, {depth} batches in flight): part of the windows re-read cached files"
        )
        out["cache_note"] = "; ".join(filter(None, [out.get("cache_note"), note]))
    return out


@dataclass(frozen=True)
class Kind:
    """A trial kind: how it runs, what its clock sees, and which sweep axes it takes."""

    run: Callable[[TrialContext, TrialSpec], dict]
    timed_region: str
    step: bool  # runs the model (model, precision, mode, batch, image size)
    loader: bool  # runs a DataLoader over the worker counts and storage points
    pipeline: bool = False  # the loader runs the augmentation pipeline (preset, decoder, image size)
    once: bool = False  # planned once per pipeline, at the most workers and the first storage point
    own_source: bool = False  # needs pipeprof's own source (not a user's Dataset)
    check: bool = False  # an overhead check: planned only with ``overhead_checks``
    own_samples: bool = False  # needs the samples of a Dataset (not a user's own DataLoader)
    gpu_pipeline: bool = False  # planned once per GPU-pipeline setting (augment.device cuda), with the step
    masked: bool = False  # masks the job to as many CPUs as workers: planned only at counts below the usable CPUs


KINDS: dict[TrialKind, Kind] = {
    TrialKind.GPU_CEILING: Kind(
        gpu_ceiling,
        "train/inference step on a device-resident synthetic batch, same shape "
        "and dtype as the loader's; windows closed by device sync",
        step=True,
        loader=False,
    ),
    TrialKind.GPU_SHARED: Kind(
        gpu_shared,
        "the GPU pipeline (decode + augment of one batch of the source's JPEG bytes held in memory, serial or "
        "overlapped as set, its decoder) and the step on what it yields, no loader; rotated with windows of the "
        "step alone on a resident batch and of the pipeline alone (each next to a together window); cycles added "
        "while the together rate's 95% CI is wider than ± measure.ci_target (up to measure.max_windows cycles and "
        "max_trial_s); samples_per_s is the together windows'; windows closed by device sync",
        step=True,
        loader=False,
        pipeline=True,
        own_source=True,
        gpu_pipeline=True,
    ),
    TrialKind.STORAGE_FETCH: Kind(
        storage_fetch,
        "next(loader) over a dataset that reads each sample's bytes and "
        "nothing else; same worker count. With cache_state cold/cold-system the page cache "
        "only stays cold for the first pass over the dataset, so warm-up (prefetch depth + "
        "one round of workers) and windows are counted in batches such that warm-up + "
        "windows + the batches in flight stay within one pass (samples_read vs "
        "dataset_samples, in_first_pass); windows then aim at window_s from the warm-up's "
        "rate",
        step=False,
        loader=True,
        own_source=True,
    ),
    TrialKind.CPU_PIPELINE: Kind(
        cpu_pipeline,
        "next(loader) only: read, decode, augment, collate in workers (or main "
        "when 0 workers), plus pinning when pin_memory is on; no model (augment_device "
        "cuda: the workers read bytes and the training process decodes and augments on the "
        "device, windows closed by device sync; for the GPU pipeline's prediction a spin "
        "kernel of stand_in_step_ms is queued before each batch, standing in for the step)",
        step=False,
        loader=True,
        pipeline=True,
    ),
    TrialKind.MONITOR_OVERHEAD: Kind(
        monitor_overhead,
        "cpu_pipeline at the most workers on one loader, the "
        "monitor's sampling paused and resumed between windows (ABBA; the batches in "
        "flight after each switch run untimed): 1 - monitored rate / unmonitored rate "
        "per pair, mean and 95% CI; samples_per_s is the unmonitored windows' median",
        step=False,
        loader=True,
        pipeline=True,
        once=True,
        check=True,
    ),
    TrialKind.HANDOFF: Kind(
        handoff,
        "next(loader) over one real sample built once and returned for every index "
        "(no read, decode or augment): collate in the workers, receive, unpickle and pin in "
        "the main process; same workers, batch, collate and pinning as the pipeline, at the "
        "most workers measured",
        step=False,
        loader=True,
        pipeline=True,
        once=True,
        own_samples=True,
    ),
    TrialKind.CORES_PAIR: Kind(
        cores_pair,
        "end_to_end at the trial's workers (next(loader) + copy + step; windows closed by device sync), its "
        "windows alternating (ABBA) between all of the job's CPUs (B) and a mask of as many CPUs as workers "
        "(A: mask_cpus, one a physical core first), the training process's threads and its workers confined "
        "together at each switch (sched_setaffinity), the batches in flight after a switch run untimed; "
        "samples_per_s is the all-CPU windows' median, masked_samples_per_s the masked ones'; mask_cost = "
        "1 - masked / all-CPU rate per pair, mean and 95% CI; all_cpus_/masked_{workers,main}_cpu_pct_mean: the "
        "monitor's rows inside that side's own windows (its workers' and the training process's CPU, percent of a "
        "core); planned only where trials names it, at counts below the job's CPUs",
        step=True,
        loader=True,
        pipeline=True,
        masked=True,
    ),
    TrialKind.END_TO_END: Kind(
        end_to_end,
        "next(loader) [data wait] + host->device copy + train/inference step; windows closed by device sync",
        step=True,
        loader=True,
        pipeline=True,
    ),
}


def timed_regions() -> dict:
    """run.json's ``timed_regions``: each kind's, then the figures' that are not a kind."""
    return {str(k): v.timed_region for k, v in KINDS.items()} | TIMED_REGIONS


def run_trial(ctx: TrialContext, spec: TrialSpec) -> dict:
    """Run one trial; returns its metrics (raises on failure: the sweep records it).

    The training process's thread count is part of what is measured: set per trial by
    ``confounders.step_threads`` and recorded as ``step_threads`` (None: torch's default).
    """
    n = step_threads(spec.kind, ctx.device.type, ctx.cores, spec.num_workers, ctx.step_threads)
    with torch_threads(n):
        if ctx.engine == "ray" and KINDS[TrialKind(spec.kind)].loader:  # imported here: nothing else imports ray
            from .ray_trials import run as ray_run

            metrics = ray_run(ctx, spec)
        else:
            metrics = KINDS[TrialKind(spec.kind)].run(ctx, spec)
    return metrics | ({"step_threads": n} if n is not None else {})
