"""A whole run: resolve the config for this machine, prepare the data, run the
sweep under the monitor, analyse, and save the run folder as it goes.

This is the only module that wires the others together; the CLI and the Python
API (``pipeprof.profile`` / ``pipeprof.run``) both come through :func:`execute`.
"""
from __future__ import annotations

import time
from pathlib import Path
from typing import Callable, Optional

import torch

from . import __version__
from .analysis import analyse
from .config import RunConfig, resolve
from .confounders import WORKER_POLICY
from .data.sources import source_class
from .env import snapshot
from .monitors import Monitor, summarize
from .results import Run, new_run_dir
from .sweep import expand, run_sweep
from .trials import TIMED_REGIONS, Bench, TrialSpec


def prepare_source(cfg: RunConfig, log: Callable[[str], None]):
    """(source, dataset facts) for a config's data section; None source for a factory dataset."""
    data = cfg.data
    if data.kind == "factory":
        return None, {"kind": "factory", "factory": data.factory}
    if data.kind == "folder":
        if not data.path:
            raise ValueError("data.path: required when data.kind is 'folder'")
        return source_class("files")(data.path), {"kind": "folder", "path": data.path}
    from .data.synthetic import cached_dataset

    log(f"synthetic dataset: {data.images} images, {data.classes} classes (cached under {data.cache_dir})")
    path, stats = cached_dataset(data.cache_dir, data.images, data.classes, data.seed)
    return source_class("files")(path), {"kind": "synthetic", **stats.to_dict()}


def execute(cfg: RunConfig, *, user_dataset=None, models: Optional[dict] = None,
            log: Callable[[str], None] = print, progress=None) -> Run:
    """Run every trial of ``cfg`` and return the saved :class:`Run`."""
    started = time.time()
    env = snapshot(cfg.data.path)
    cuda = torch.cuda.is_available()
    bf16 = bool(cuda and torch.cuda.is_bf16_supported())
    cfg = resolve(cfg, cuda, bf16, env["cores"]["usable"])
    if user_dataset is None and cfg.data.kind == "factory":
        from .models import load_callable

        user_dataset = load_callable(cfg.data.factory)()
    source, data_facts = (None, {"kind": "user"}) if user_dataset is not None else prepare_source(cfg, log)
    user = user_dataset is not None
    specs = expand(cfg, _user_probe(user_dataset) if user else None, user_dataset=user)
    run = Run(new_run_dir(cfg.out_dir, cfg.name))
    run.meta = {"pipeprof_version": __version__, "status": "running", "started": started,
                "config": cfg.model_dump(), "machine": env, "dataset": data_facts,
                "source": source.describe() if source is not None else None,
                "timed_regions": TIMED_REGIONS, "worker_policy": WORKER_POLICY,
                "trials_planned": len(specs)}
    run.save_meta()
    log(f"run folder: {run.path}  ({len(specs)} trials on {cfg.device})")
    with Monitor(hz=cfg.monitor_hz, gpu=cuda) as monitor:
        bench = Bench(torch.device(cfg.device), source, cfg.measure, monitor, user_dataset=user_dataset,
                      stage_timing=cfg.stage_timing, prefetch_factor=cfg.loader.prefetch_factor,
                      num_classes=cfg.model.num_classes, channels_last=cfg.model.channels_last,
                      seed=cfg.data.seed, models=models or {})
        timeline_of = lambda tid, t0, t1: summarize(monitor.timeline(), tid, t0, t1)  # noqa: E731
        rows, interrupted = run_sweep(bench, specs, timeline_of, on_row=run.save_trials,
                                      progress=progress or (lambda spec, i, n: None))
        run.meta["monitor_gpu_error"] = monitor.gpu_error
    run.save_trials(rows)
    run.save_timeline(monitor.timeline())
    run.meta |= {"status": "interrupted" if interrupted else "complete", "finished": time.time(),
                 "wall_s": time.time() - started, "analysis": analyse(run.trials, cores=env["cores"]["usable"])}
    run.save_meta()
    return run


def _user_probe(dataset) -> Callable[[str, int], tuple[str, int]]:
    """The user's samples fix dtype and side, whatever the model's native size."""
    image = torch.as_tensor(dataset[0][0])
    if image.ndim != 3:
        raise ValueError(f"dataset[0][0] must be a CHW image tensor, got shape {tuple(image.shape)}")
    dtype = str(image.dtype).removeprefix("torch.")
    return lambda preset, size: (dtype, int(image.shape[-1]))
