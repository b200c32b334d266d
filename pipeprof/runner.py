"""A whole run: resolve the config for this machine, prepare the data, run the
sweep under the monitor, analyse, and save the run folder as it goes.

This is the only module that wires the others together; the CLI and the Python
API (``pipeprof.profile`` / ``pipeprof.run``) both come through :func:`execute`.
"""
from __future__ import annotations

import hashlib
import json
import time
from pathlib import Path
from typing import Callable, Optional

import torch

from . import reference
from ._version import __version__
from .analysis import analyse, epoch_estimates
from .config import ConfigError, RunConfig, resolve
from .confounders import WORKER_POLICY
from .data import cache
from .data.sources import source_class
from .env import snapshot
from .monitors import Monitor, summarize
from .results import Run, new_run_dir
from .sweep import expand, run_sweep
from .trials import TrialContext, timed_regions


def dataset_folder(cfg: RunConfig, log: Callable[[str], None]) -> tuple[Optional[str], dict]:
    """(folder or file list, dataset facts) of the data section; None for a factory dataset."""
    data = cfg.data
    if data.kind == "factory":
        return None, {"kind": "factory", "factory": data.factory}
    if data.kind == "folder":
        if not data.path:
            raise ConfigError("data.path: required when data.kind is 'folder'")
        return data.path, {"kind": "folder", "path": data.path}
    from .data.synthetic import cached_dataset

    log(f"synthetic dataset: {data.images} images, {data.classes} classes (cached under {data.cache_dir})")
    path, stats = cached_dataset(data.cache_dir, data.images, data.classes, data.seed)
    return str(path), {"kind": "synthetic", **stats.to_dict()}


PACK_MARKER = ".pipeprof-pack.json"


def auto_shard_size_mb(total_bytes: int) -> float:
    """~8 shards for a small dataset, 100 MB shards (a common WebDataset size) for a large one."""
    return min(100.0, max(float(f"{total_bytes / 8 / 1e6:.2g}"), 0.1))


def packed_shards(folder: str, cache_dir: str, shard_size_mb: Optional[float], seed: int,
                  log: Callable[[str], None]) -> Path:
    """Tar shards of ``folder`` under ``cache_dir/shards/``, packed once and reused while the folder is unchanged."""
    from .data.sources.shards import pack_folder

    files = source_class("files")(folder)
    total = files.total_bytes()
    size = shard_size_mb or auto_shard_size_mb(total)
    src = str(Path(folder).resolve())
    key = hashlib.sha1(src.encode()).hexdigest()[:8]
    dst = Path(cache_dir) / "shards" / f"{Path(src).name}-{key}-{size:g}MB"
    want = {"src": src, "samples": len(files), "bytes": total, "shard_size_mb": size, "seed": seed}
    marker = dst / PACK_MARKER
    try:
        if json.loads(marker.read_text()) == want:
            return dst
    except (OSError, ValueError):
        pass
    log(f"packing {len(files)} samples of {folder} into {size:g} MB tar shards under {dst}")
    pack_folder(folder, dst, shard_size_mb=size, seed=seed, overwrite=True)
    marker.write_text(json.dumps(want))  # last: its presence means "complete"
    return dst


def build_sources(cfg: RunConfig, folder: Optional[str], log: Callable[[str], None]) -> dict:
    """label -> Source for every spec of ``data.source``, built once per sweep.

    A source that cannot be opened (missing folder, no shards, a URL that refuses or
    answers 404) is bad input: ConfigError naming it, before any trial runs.
    """
    built: dict = {}
    made: dict = {}  # every source made, inner ones too: a throttle over a swept source shares its object

    def build(spec):
        key = json.dumps(spec.model_dump(), sort_keys=True)
        if key not in made:
            made[key] = make(spec)
        return made[key]

    def make(spec):
        path = getattr(spec, "path", None) or folder
        if spec.kind in ("files", "memory") or (spec.kind == "shards" and spec.path is None):
            if path is None:
                raise ConfigError(f"data.source: {spec.label} needs a path (data.kind is {cfg.data.kind})")
        if spec.kind == "files":
            source = source_class("files")(path)
        elif spec.kind == "memory":  # refuses a dataset larger than half the available RAM
            source = source_class("memory")(source_class("files")(path))
        elif spec.kind == "shards":
            where = spec.path or packed_shards(folder, cfg.data.cache_dir, spec.shard_size_mb, cfg.data.seed, log)
            source = source_class("shards")(where)
        elif spec.kind == "url":
            source = source_class("url")(spec.base_url, spec.index, spec.timeout_s, spec.retries)
        else:
            source = source_class("throttled")(build(spec.inner), spec.mb_s, spec.latency_ms, spec.reads_s)
        return source

    for spec in cfg.data.source:
        try:
            built[spec.label] = build(spec)
        except ConfigError:
            raise
        except (OSError, ValueError) as exc:  # SourceError is an OSError
            raise ConfigError(f"data.source: {spec.label}: {exc}") from None
    if "cold-system" in cfg.data.cache and any(s.file_backed for s in cfg.data.source):
        ok, why = cache.can_drop_all_caches()
        if not ok:
            raise ConfigError(f"data.cache: 'cold-system' drops the whole machine's page cache and cannot here: "
                              f"{why}; 'cold' evicts just the dataset's files, without root")
    return built


def source_info(cfg: RunConfig, sources: dict) -> dict:
    """label -> the columns every trial on that source carries."""
    return {spec.label: {"emulated": bool(sources[spec.label].emulated), "source_kind": spec.base_kind,
                         "throttle": spec.throttle} for spec in cfg.data.source}


def storage_facts(cfg: RunConfig, sources: dict) -> dict:
    """Dataset size against RAM, and each source as it describes itself (incl. ``emulated``)."""
    if not sources:
        return {}
    ref = next((s for s in sources.values() if s.kind == "files"), None) or next(iter(sources.values()))
    total = ref.total_bytes()
    return {"sources": {label: s.describe() for label, s in sources.items()},
            "dataset_samples": len(ref), "dataset_total_mb": total / 1e6,
            "fits_in_page_cache": cache.fits_in_page_cache(total), "cache_states": list(cfg.data.cache)}


def execute(cfg: RunConfig, *, user_dataset=None, models: Optional[dict] = None,
            log: Callable[[str], None] = print, progress=None, loss_fn: Optional[Callable] = None) -> Run:
    """Run every trial of ``cfg`` and return the saved :class:`Run`.

    ``loss_fn(raw model output, labels) -> scalar tensor`` overrides ``model.loss``.
    """
    started = time.time()
    env = snapshot(cfg.data.path)
    cuda = torch.cuda.is_available()
    bf16 = bool(cuda and torch.cuda.is_bf16_supported())
    cfg = resolve(cfg, cuda, bf16, env["cores"]["usable"])
    loss_fn = loss_fn if loss_fn is not None else _configured_loss(cfg)  # a bad path fails before the run folder
    if user_dataset is None and cfg.data.kind == "factory":
        from .models import load_callable

        user_dataset = load_callable(cfg.data.factory)()
    user = user_dataset is not None
    if user and cfg.data.storage_swept:
        raise ConfigError("data.source/data.cache: storage axes need pipeprof's own pipeline; "
                          "a user Dataset hides its storage")
    folder, data_facts = (None, {"kind": "user"}) if user else dataset_folder(cfg, log)
    sources = {} if user else build_sources(cfg, folder, log)
    source = next(iter(sources.values()), None)
    specs = expand(cfg, _user_probe(user_dataset) if user else None, user_dataset=user)
    storage = storage_facts(cfg, sources)
    run = Run(new_run_dir(cfg.out_dir, cfg.name))
    run.meta = {"pipeprof_version": __version__, "status": "running", "started": started,
                "config": cfg.model_dump(), "machine": env, "dataset": data_facts,
                "source": source.describe() if source is not None else None, "storage": storage,
                "timed_regions": timed_regions(), "worker_policy": WORKER_POLICY,
                "trials_planned": len(specs)}
    run.save_meta()
    log(f"run folder: {run.path}  ({len(specs)} trials on {cfg.device})")
    cores = env["cores"]["usable"]
    ref_s = cfg.measure.cpu_reference_s
    if ref_s > 0:  # before the monitor and the trials, so nothing else competes for the cores
        run.meta["cpu_reference"] = {"timed_region": reference.TIMED_REGION, "seconds": ref_s,
                                     "start": reference.measure(int(cores), ref_s)}
        run.save_meta()
    with Monitor(hz=cfg.monitor_hz, gpu=cuda) as monitor:
        ctx = TrialContext(torch.device(cfg.device), source, cfg.measure, monitor, user_dataset=user_dataset,
                      stage_timing=cfg.stage_timing, prefetch_factor=cfg.loader.prefetch_factor,
                      num_classes=cfg.model.num_classes, channels_last=cfg.model.channels_last,
                      cudnn_benchmark=cfg.model.cudnn_benchmark, loss_fn=loss_fn,
                      seed=cfg.data.seed, cores=int(env["cores"]["usable"]), step_threads=cfg.model.threads,
                      models=models or {}, sources=sources,
                      source_info=source_info(cfg, sources) if sources else {})
        timeline_of = lambda tid, t0, t1: summarize(monitor.timeline(), tid, t0, t1)  # noqa: E731
        rows, interrupted = run_sweep(ctx, specs, timeline_of, on_row=run.save_trials,
                                      progress=progress or (lambda spec, i, n: None))
        run.meta["monitor_gpu_error"] = monitor.gpu_error
    run.save_trials(rows)
    run.save_timeline(monitor.timeline())
    if ref_s > 0 and not interrupted:
        ref = run.meta["cpu_reference"]
        ref["end"] = reference.measure(int(cores), ref_s)
        ref["drift"] = reference.drift(ref["start"], ref["end"])
    run.meta |= {"status": "interrupted" if interrupted else "complete", "finished": time.time(),
                 "wall_s": time.time() - started}
    run.save_meta()  # the measurements are safe before any analysis runs
    if storage:
        storage["epochs"] = epoch_estimates(run.trials, storage["dataset_samples"],
                                            storage["fits_in_page_cache"]["fits"])
    run.meta["analysis"] = analyse(run.trials, cores=cores, device=cfg.device)
    run.save_meta()
    return run


def _configured_loss(cfg: RunConfig) -> Optional[Callable]:
    """The callable ``model.loss`` names; None when unset."""
    if cfg.model.loss is None:
        return None
    from .models import load_callable

    try:
        return load_callable(cfg.model.loss)
    except ValueError as exc:
        raise ConfigError(f"model.loss: {exc}") from None


def _user_probe(dataset) -> Callable[[str, int], tuple[str, int]]:
    """The user's samples fix dtype and side, whatever the model's native size."""
    image = torch.as_tensor(dataset[0][0])
    if image.ndim != 3:
        raise ValueError(f"dataset[0][0] must be a CHW image tensor, got shape {tuple(image.shape)}")
    dtype = str(image.dtype).removeprefix("torch.")
    return lambda preset, size: (dtype, int(image.shape[-1]))
