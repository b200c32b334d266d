"""The sweep: expand the config's axes into trials, run each in turn, keep every row.

Trials are interleaved per worker count (storage_fetch, cpu_pipeline, end_to_end at
w workers, then the next w) so slow drift of the machine (heat, page cache) spreads
over the curve instead of biasing one kind. The storage axes (``data.source`` ×
``data.cache``) multiply those three kinds, not gpu_ceiling; the cache axis applies to
sources that read local files, the others get one point with cache_state 'n/a'. An
isolation trial whose settings repeat (e.g. a cpu_pipeline shared by two precisions)
is run once. A failing trial becomes a row: ``status`` 'error', 'oom' (it ran out of memory: the
row has the memory held then) or 'timeout' (it ran past its cap: the row has the hung code's
stack; see ``trials.watchdog``); Ctrl-C (and SIGTERM under ``pipeprof run``) stops the sweep and
keeps what was measured.
"""

from __future__ import annotations

import functools
import time
from dataclasses import replace
from itertools import product
from typing import Callable, Optional

import torch

from pipeprof.data.augment import load_preset, output_dtype
from pipeprof.env import usable_cores
from pipeprof.measure import noise
from pipeprof.models import input_size
from pipeprof.schema import TrialKind, overlap_settings
from pipeprof.trials import KINDS, TrialContext, TrialSpec, run_trial, spec_key
from pipeprof.trials.columns import is_oom, oom_columns
from pipeprof.trials.heap import release
from pipeprof.trials.ray_trials import RAY_KINDS
from pipeprof.trials.watchdog import Leash, TrialTimeout, run_bounded

from .distributed import close_job, run_job

#: a trial's cap beyond measure.max_trial_s: its set-up (model, workers, page cache) and the last window
SETUP_MARGIN_S = 30.0


@functools.cache  # it runs the preset on an image: once per (preset, size), not per model x precision x batch
def preset_probe(preset: str, size: int) -> tuple[str, int]:
    """(dtype, side) of what a preset hands the step when cropping for a model of input ``size``."""
    return output_dtype(load_preset(preset, size)), size


def storage_points(cfg) -> list[tuple[str, str]]:
    """(source label, cache state) pairs of a config, in config order."""
    return [
        (spec.label, state) for spec in cfg.data.source for state in (cfg.data.cache if spec.file_backed else ["n/a"])
    ]


def _planned(k: TrialKind, kind, cfg, user_dataset: bool, user_loader: bool) -> bool:
    """Whether a kind is planned: asked for, applicable to the user's data, an overhead check only when
    asked; the hand-off trial by default only where a GPU is fed (on a CPU the step shares the cores,
    which bind first), and wherever ``trials`` names it."""
    default_off = k == TrialKind.HANDOFF and cfg.device != "cuda" and "trials" not in cfg.model_fields_set
    if cfg.data.engine == "ray" and kind.loader and k.value not in RAY_KINDS:  # no Ray form (trials.ray_trials)
        return False
    return (
        k in set(cfg.trials)
        and not (user_dataset and kind.own_source)
        and not (user_loader and kind.own_samples)
        and kind.check <= cfg.overhead_checks
        and not default_off
    )


def augment_devices(cfg, user_dataset: bool) -> list[dict]:
    """The augment.device axis as specs carry it, with the GPU pipeline's own axes (overlap, decoder) under
    'cuda': {} for the workers' pipeline (the default, so trial ids stay as they were); a user's Dataset has no
    pipeline of ours to move."""
    if user_dataset:
        return [{}]
    out: list[dict] = []
    for d in cfg.augment.device:
        if d == "cpu":
            out.append({})
            continue
        out += [
            {"augment_device": d, "gpu_decoder": dec} | overlap_settings(o)
            for dec, o in product(cfg.augment.gpu_decoder, cfg.augment.overlap)
        ]
    return out


def _once_per_pipeline(cfg, kinds: dict, devices: list, pipe_at: Callable, step: dict, dtype) -> list[TrialSpec]:
    """The kinds planned once per pipeline at the first storage point: the hand-off limit and an overhead check
    at the most workers (the hand-off passes bytes alike whichever decoder and overlap the GPU pipeline has: once
    per device), and the GPU pipeline beside the step on one batch of bytes held in memory (once per setting)."""
    once = [
        TrialSpec(
            k.value,
            num_workers=max(cfg.loader.num_workers),
            **pipe_at({key: v for key, v in dev.items() if key == "augment_device"}),
        )
        for k, kind in kinds.items()
        if kind.once
        for dev in devices
    ]
    beside = [
        TrialSpec(k.value, input_dtype=dtype, **pipe_at(dev), **step)
        for k, kind in kinds.items()
        if kind.gpu_pipeline
        for dev in devices
        if dev
    ]
    return once + beside


def expand(
    cfg,
    probe: Optional[Callable[[str, int], tuple[str, int]]] = None,
    user_dataset: bool = False,
    user_loader: bool = False,
) -> list[TrialSpec]:
    """All trials of a resolved config, deduplicated, in run order, planned from each kind's
    registry entry (``trials.KINDS``): step kinds once per model × precision × preset × batch,
    loader kinds per storage point × worker count.

    ``probe(preset, model_input_size) -> (dtype, side)`` says what the loader will
    produce; with ``user_dataset`` the presets do not apply and the probe answers
    from the user's own samples. With ``user_loader`` (the user's own DataLoader, which implies
    ``user_dataset``) pinning is theirs too: ``pin_memory`` is None in the specs.
    """
    probe = probe or preset_probe
    specs: list[TrialSpec] = []
    kinds = {k: v for k, v in KINDS.items() if _planned(k, v, cfg, user_dataset, user_loader)}
    presets = [None] if user_dataset else cfg.augment.preset
    storage = [(None, None)] if user_dataset else storage_points(cfg)
    devices = augment_devices(cfg, user_dataset)
    usable = usable_cores()["usable"]  # a masked pair at w workers needs fewer than all of the job's CPUs
    for model, precision, mode, preset, bs in product(
        cfg.model.name, cfg.model.precision, cfg.model.mode, presets, cfg.loader.batch_size
    ):
        dtype, size = probe(preset, input_size(model))
        step = dict(model=model, precision=precision, mode=mode)
        specs += [
            TrialSpec(k.value, batch_size=bs, image_size=size, input_dtype=dtype, **step)
            for k, kind in kinds.items()
            if not kind.loader and not kind.gpu_pipeline
        ]

        def pipe_at(source, cache_state, device=None, bs=bs, preset=preset, size=size) -> dict:
            return (device or {}) | dict(
                batch_size=bs,
                preset=preset,
                decoder=None if user_dataset else cfg.data.decoder,
                pin_memory=None if user_loader else cfg.loader.pin_memory,
                image_size=size,
                source=source,
                cache_state=cache_state,
            )

        for (source, cache_state), w, dev in product(storage, cfg.loader.num_workers, devices):
            pipe = pipe_at(source, cache_state, dev)
            bare = dict(batch_size=bs, source=source, cache_state=cache_state)
            # step-first places the step: a kind without one runs as overlap on (the same spec, planned once)
            alone = pipe | {"step_first": None}
            specs += [
                TrialSpec(
                    k.value,
                    num_workers=w,
                    **((pipe if kind.step else alone) if kind.pipeline else bare),
                    **(step if kind.step else {}),
                )
                for k, kind in kinds.items()
                if kind.loader and not kind.once and (not kind.masked or 1 <= w < usable)
            ]
        specs += _once_per_pipeline(cfg, kinds, devices, lambda dev: pipe_at(*storage[0], dev), step, dtype)
        if TrialKind.CPU_PIPELINE in kinds and cfg.stage_timing and cfg.overhead_checks and not user_dataset:
            # the same pipeline at the most workers and the first storage point, stage clocks switched on
            # and off between windows: their cost (once per preset; it does not depend on the storage)
            specs.append(
                TrialSpec(
                    TrialKind.CPU_PIPELINE.value,
                    num_workers=max(cfg.loader.num_workers),
                    stage_timing=False,
                    **pipe_at(*storage[0]),
                )
            )
    one_gpu = specs if 1 in cfg.distributed.gpus else []  # distributed.gpus: [2] runs the 2-GPU form only
    return list(dict.fromkeys(one_gpu + distributed_specs(cfg, specs)))


#: the kinds that have an N-GPU form: the ceiling, every rank's loader at once, and the whole job
DISTRIBUTED_KINDS = (TrialKind.GPU_CEILING.value, TrialKind.CPU_PIPELINE.value, TrialKind.END_TO_END.value)


def distributed_specs(cfg, specs: list[TrialSpec]) -> list[TrialSpec]:
    """The one-GPU specs again for each GPU count N > 1 of ``distributed.gpus``: num_workers is per
    rank (counts whose N ranks would need more workers than the usable cores are left out), and the
    step kinds once per ``distributed.p2p`` setting (the loaders do not talk between GPUs). In job
    order: by GPU count, then by link setting, so that one torchrun job runs each run of them
    (``distributed.kept_jobs``; the loaders-only kind in the first)."""
    out = []
    cores = int(usable_cores()["usable"])
    for n in (g for g in cfg.distributed.gpus if g > 1):
        local = max(n // cfg.distributed.nnodes, 1)  # ranks on this machine share its cores
        mine = [
            s
            for s in specs
            if s.kind in DISTRIBUTED_KINDS
            and s.stage_timing is None
            and not (s.num_workers is not None and s.num_workers * local > max(cores, local))
        ]
        for i, p2p in enumerate(cfg.distributed.p2p):
            out += [
                replace(s, gpus=n, p2p=None if s.kind == TrialKind.CPU_PIPELINE.value else p2p == "on")
                for s in mine
                if i == 0 or s.kind != TrialKind.CPU_PIPELINE.value
            ]
    return out


def error_text(exc: BaseException, limit: int = 2000) -> str:
    """One readable line first. A DataLoader worker's exception arrives as "Caught X in DataLoader
    worker process k" + the worker's traceback, whose last line is the actual message: lead with it."""
    text = f"{type(exc).__name__}: {exc}".strip()
    if "Original Traceback" in text:
        lines = [line for line in text.splitlines() if line.strip()]
        head = lines[0].split(": ", 1)[-1].rstrip(".")
        text = f"{lines[-1].strip()} ({head[0].lower() + head[1:]})\n" + text
    return text[:limit]


def failure_columns(exc: Exception, device: Optional[torch.device]) -> dict:
    """The status and error of a trial that raised: timeout, oom (with the memory this process held on
    ``device``; None: not this process's memory), or error."""
    if isinstance(exc, TrialTimeout):
        return {"status": "timeout", "error": error_text(exc)}
    if is_oom(exc):
        held = oom_columns(device) if device is not None else {}
        then = ", ".join(f"{k.removeprefix('oom_')} {v:,.0f}" for k, v in held.items())
        return {"status": "oom", "error": error_text(exc, 1900) + (f" (memory then: {then})" if held else "")} | held
    return {"status": "error", "error": error_text(exc)}


def bounded_trial(ctx: TrialContext, spec: TrialSpec) -> dict:
    """``run_trial`` under the watchdog (``trials.watchdog``): at most measure.max_trial_s + SETUP_MARGIN_S."""
    leash = Leash(ctx.monitor, ctx.clock)
    watched = replace(ctx, monitor=leash, clock=leash.clock)
    return run_bounded(
        lambda: run_trial(watched, spec), leash, ctx.measure.max_trial_s + SETUP_MARGIN_S, f"trial {spec.trial_id}"
    )


def _no_window(metrics: dict, cap_s: float) -> dict:
    """A trial whose warm-up left no time for a single window measured nothing: failed, and why."""
    if metrics.get("windows") != 0:
        return {}
    return {
        "status": "failed",
        "error": f"no timed window fitted in measure.max_trial_s ({cap_s:g} s): the "
        f"warm-up alone took {metrics.get('warmup_s') or 0:.1f} s (a slow first batch: cuDNN "
        "autotuning, slow reads); raise measure.max_trial_s",
    }


def run_one(ctx: TrialContext, spec: TrialSpec, summarize_monitor: Callable) -> dict:
    """One row: the trial's settings, status, error, metrics and monitor summary."""
    t0 = time.perf_counter()
    row = spec.columns() | ctx.source_info.get(spec.source, {}) | {"status": "ok", "error": None}
    if ctx.device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(ctx.device)  # an oom row's peak is this trial's
    try:
        if spec.gpus > 1:  # in a torchrun job, its own process group, bounded and killed by distributed.run_job
            metrics = run_job(ctx, spec)
        else:
            close_job()  # a kept N-GPU job's rank 0 holds this process's GPU
            metrics = bounded_trial(ctx, spec)
        row |= metrics
        seen = summarize_monitor(spec.trial_id, metrics.get("t_measure_start_s"), metrics.get("t_measure_end_s"))
        # an N-GPU job's CPU columns come from its ranks' own monitors; the GPUs and the machine from ours
        row |= {k: v for k, v in seen.items() if metrics.get(k) is None}
        row |= noise.attribute(row) | _no_window(metrics, ctx.measure.max_trial_s)
    except KeyboardInterrupt:
        raise
    except Exception as exc:  # any failure is a row, not a crashed sweep
        # an N-GPU job's memory was its ranks': this process's allocator says nothing of it
        row |= failure_columns(exc, ctx.device if spec.gpus == 1 else None)
    finally:
        ctx.monitor.set_trial(None)
        release(ctx.device)
    row["trial_s"] = time.perf_counter() - t0
    return row


def run_sweep(
    ctx: TrialContext,
    specs: list[TrialSpec],
    summarize_monitor: Callable,
    on_row: Callable[[list[dict]], None] = lambda rows: None,
    progress: Callable[[TrialSpec, int, int], None] = lambda spec, i, n: None,
    kept: Optional[dict] = None,
) -> tuple[list[dict], bool]:
    """Run every trial; ``on_row`` gets all rows so far after each. Returns (rows, interrupted).

    ``kept``: rows of an earlier session of this run by ``spec_key`` (``--resume``): they come first
    and their trials are not run again."""
    kept = kept or {}
    rows: list[dict] = list(kept.values())
    todo = [s for s in specs if spec_key(s.columns()) not in kept]
    try:
        for i, spec in enumerate(todo):
            progress(spec, i, len(todo))
            rows.append(run_one(ctx, spec, summarize_monitor))
            on_row(rows)
    except KeyboardInterrupt:  # wherever it lands in the loop, the rows so far are returned (and saved)
        return rows, True
    progress(None, len(todo), len(todo))
    return rows, False
