"""A whole run: resolve the config for this machine, prepare the data, run the
sweep under the monitor, analyse, and save the run folder as it goes.

This is the only module that wires the others together; the CLI and the Python
API (``pipeprof.profile`` / ``pipeprof.run``) both come through :func:`execute`.
"""

from __future__ import annotations

import contextlib
import os
import time
from typing import Callable, NamedTuple, Optional

import pandas as pd
import torch
from torch.utils.data import IterableDataset

from pipeprof._version import __version__
from pipeprof.analysis import analyse
from pipeprof.config import CPU_BATCH, ConfigError, RunConfig, resolve
from pipeprof.data.augment import A, load_preset
from pipeprof.data.gpu_augment import ops_of as gpu_ops
from pipeprof.data.prepare import build_sources, dataset_folder, storage_facts
from pipeprof.data.user_samples import FIRST_BATCH_MOST, check_user_dataset, collate_fix
from pipeprof.env import snapshot, spread_gpu_streams
from pipeprof.measure import reference
from pipeprof.measure.confounders import WORKER_POLICY
from pipeprof.measure.decoders import TIMED_REGION as DECODE_TIMED_REGION
from pipeprof.measure.decoders import decode_costs
from pipeprof.measure.loader import USER_WORKER_POLICY_NOTE, EndlessIter, shutdown, user_batch
from pipeprof.measure.monitors import Monitor, summarize
from pipeprof.models import input_size
from pipeprof.results import DiskFull, Run, check_out_dir, load_run, new_run_dir
from pipeprof.schema import SCHEMA_VERSION
from pipeprof.trials import TrialContext, timed_regions
from pipeprof.trials.heap import trial_heap
from pipeprof.trials.skeleton import collate_user

from .action_trials import confirm_answers, run_actions
from .batchsize import MOST, auto_batch_size, confirm
from .distributed import kept_jobs
from .limits import check_plan, check_workers, shm_free
from .resume import differences, kept_rows
from .search import run_adaptive
from .sweep import expand, preset_probe, run_sweep


class Plan(NamedTuple):
    """A resolved config and everything prepared before the first trial."""

    cfg: RunConfig
    machine: dict
    user_dataset: object
    sources: dict
    specs: list
    meta: dict
    user_loader: object = None  # fn(num_workers) -> the user's DataLoader; None: pipeprof builds the loaders
    job: Optional[dict] = None  # N-GPU trials: what each torchrun job rebuilds its context from
    probe: object = None  # what the loader hands the step, for planning more specs (search)


def prepare(
    cfg: RunConfig,
    user_dataset=None,
    log: Callable[[str], None] = print,
    user_loader=None,
    models: Optional[dict] = None,
    loss_fn: Optional[Callable] = None,
) -> Plan:
    """Resolve ``cfg`` for this machine, open the data and plan the trials; nothing is measured yet but
    the step's memory when ``loader.batch_size`` is auto on a GPU (``batchsize``). Bad input (config,
    paths, import paths) raises ConfigError before any run folder exists.

    ``user_loader``: fn(num_workers) -> the user's own DataLoader (``data.kind: loader`` names one);
    its first batch fixes the batch size, image dtype and side."""
    _check_early(cfg)
    env = snapshot(cfg.data.path)
    if user_loader is None and cfg.data.kind == "loader":
        user_loader = _load_loader_factory(cfg.data.factory)
    loader_probe = None
    if user_loader is not None:
        loader_probe, batch = _loader_probe(user_loader)
        cfg = _with_batch_size(cfg, batch)
    cfg, sweep_note = _sweep_policy(cfg)
    auto = cfg.loader.batch_size == "auto"
    cuda = torch.cuda.is_available()
    cfg = resolve(
        cfg,
        cuda,
        bool(cuda and torch.cuda.is_bf16_supported()),
        env["cores"]["usable"],
        torch.cuda.device_count() if cuda else 0,
    )
    check_workers(cfg, env["cores"]["usable"])  # before any dataset is made or loaded
    user_dataset = _factory_dataset(cfg) if user_dataset is None and cfg.data.kind == "factory" else user_dataset
    user = user_dataset is not None or user_loader is not None
    if user and cfg.data.storage_swept:
        raise ConfigError(
            "data.source/data.cache: storage axes need pipeprof's own pipeline; a user Dataset hides its storage"
        )
    facts = {"kind": "user"} | ({"form": "loader"} if user_loader is not None else {})
    folder, data_facts = (None, facts) if user else dataset_folder(cfg, log)
    sources = {} if user else build_sources(cfg, folder, log)
    probe = loader_probe or (_user_probe(user_dataset, cfg) if user else None)
    samples = _samples(sources, user_dataset)
    cfg, batch_search = _batch_size(cfg, auto, probe, user, env, models, loss_fn, log, samples)
    specs = expand(cfg, probe, user_dataset=user, user_loader=user_loader is not None)
    check_plan(cfg, specs, probe or preset_probe, samples, _available_bytes(env), shm_free())
    meta = _meta(cfg, env, data_facts, sources, len(specs), user_loader is not None)
    if batch_search:
        meta["batch_size_search"] = batch_search
    if sweep_note and cfg.sweep != "adaptive":
        meta["search"] = {"policy": "exhaustive", "why": sweep_note}
    job = _job(cfg, folder, user_dataset, user_loader, models, loss_fn) if max(cfg.distributed.gpus) > 1 else None
    return Plan(cfg, env, user_dataset, sources, specs, meta, user_loader, job, probe)


def _meta(cfg: RunConfig, env: dict, data_facts: dict, sources: dict, planned: int, own_loader: bool) -> dict:
    """run.json as the run starts: what it measures, on what, and how."""
    policy = {"user's DataLoader": USER_WORKER_POLICY_NOTE} if own_loader else WORKER_POLICY
    source = next(iter(sources.values()), None)
    return {
        "schema_version": SCHEMA_VERSION,
        "pipeprof_version": __version__,
        "status": "running",
        "config": cfg.model_dump(),
        "machine": env,
        "dataset": data_facts,
        "source": source.describe() if source is not None else None,
        "storage": storage_facts(cfg, sources),
        "timed_regions": timed_regions(),
        "worker_policy": policy,
        "trials_planned": None if cfg.sweep == "adaptive" else planned,
    } | (_ray_meta() if cfg.data.engine == "ray" else {})  # adaptive: decided as it measures


def _ray_meta() -> dict:
    """data.engine ray: the cluster it joins or starts (Ray's version, nodes, CPUs) and the Ray trials' regions."""
    from pipeprof.data.ray_engine import ensure_cluster
    from pipeprof.trials.ray_trials import TIMED_REGIONS

    return {"ray": ensure_cluster(), "ray_timed_regions": TIMED_REGIONS}


def _check_early(cfg: RunConfig) -> None:
    """What fails fast, before a dataset is made or anything measured: an out_dir that cannot hold the run
    (created, a probe file written and removed), a preset file albumentations cannot load, and (with
    augment.device cuda) a preset transform the GPU pipeline cannot run."""
    check_out_dir(cfg.out_dir)
    for preset in cfg.augment.preset:
        load_preset(preset)
        if "cuda" in cfg.augment.device:  # a transform without a torchvision counterpart: named, exit 2
            gpu_ops(A.to_dict(load_preset(preset))["transform"]["transforms"], f"preset {preset!r}")


def execute(
    cfg: RunConfig,
    *,
    user_dataset=None,
    models: Optional[dict] = None,
    log: Callable[[str], None] = print,
    progress=None,
    loss_fn: Optional[Callable] = None,
    user_loader: Optional[Callable] = None,
    resume=None,
    on_answer: Optional[Callable] = None,
) -> Run:
    """Run every trial of ``cfg`` and return the saved :class:`Run`.

    ``on_answer(run)`` is called once the analysis is saved, before the action trials (``actions``) start:
    the CLI prints the answer there, so it does not wait for them.

    ``loss_fn(raw model output, labels) -> scalar tensor`` overrides ``model.loss``.
    ``user_loader``: fn(num_workers) -> the user's own DataLoader, used instead of pipeprof's.
    ``resume``: a run folder made with this config on this machine: its trials that ended ok are kept,
    the others and the missing ones run, in the same folder (``resume``; ConfigError when it differs).
    A KeyboardInterrupt (Ctrl-C; the CLI turns SIGTERM into one) ends the sweep: status 'interrupted'.
    """
    spread_gpu_streams()  # before the run's first CUDA call, where this process has made none yet (see there)
    started = time.time()
    earlier = load_run(resume) if resume is not None else None
    if earlier is not None and cfg.loader.batch_size == "auto":  # the size its search chose, not a new search
        cfg = cfg.model_copy(
            update={
                "loader": cfg.loader.model_copy(
                    update={"batch_size": earlier.meta.get("config", {}).get("loader", {}).get("batch_size")}
                )
            }
        )
    loss_fn = loss_fn if loss_fn is not None else _configured_loss(cfg)  # a bad path fails before the run folder
    plan = prepare(cfg, user_dataset, log, user_loader, models, loss_fn)
    run, kept = _reopen(earlier, plan, log) if earlier is not None else (_new_run(plan, started, log), {})
    try:
        run.reserve()
        with trial_heap(collect_first=plan.cfg.device == "cuda"):  # each trial's release walks its own objects
            _finish(run, plan, models, loss_fn, progress, kept, started, log, on_answer)
    except DiskFull:  # what was saved stays whole; the reserve gives run.json room for its last status
        run.release_reserve()
        run.meta["status"] = "failed: disk full"
        with contextlib.suppress(OSError, DiskFull):
            run.save_meta()
        raise
    finally:  # however the run ends (an interrupt during the analysis too), the reserve goes
        run.release_reserve()
    return run


def _finish(
    run: Run,
    plan: Plan,
    models,
    loss_fn,
    progress,
    kept: dict,
    started: float,
    log=print,
    on_answer: Optional[Callable] = None,
) -> None:
    """The trials, the status, then the analysis, each saved as it lands; then, the answer given, the
    action trials (``orchestrate.action_trials``)."""
    try:
        interrupted = _measure(run, plan, models or {}, loss_fn, progress or (lambda spec, i, n: None), kept, started)
    except KeyboardInterrupt:  # outside the sweep's loop (the CPU reference, the monitor): the same stop
        interrupted = True
    run.meta |= {
        "status": "interrupted" if interrupted else "complete",
        "finished": time.time(),
        "wall_s": (run.meta.get("wall_s") or 0.0) + time.time() - started,
    }
    run.save_meta()  # the measurements are safe before any analysis runs
    try:
        run.meta["analysis"] = analyse(
            run.trials,
            cores=plan.machine["cores"]["usable"],
            device=plan.cfg.device,
            storage=run.meta["storage"],
            decode_costs=run.meta.get("decode_costs"),
            draws=plan.cfg.measure.redraws,
        )
    except KeyboardInterrupt:  # every trial is saved, but a 'complete' run without its analysis would mislead
        run.meta["status"] = "interrupted"
        run.save_meta()
        raise
    judge(run)
    if not interrupted and not run.meta["analysis"]["failures"]["no_answer"]:
        # the pick against its nearest rival, alternating on one step, before the answer is given (answer_after_s)
        try:
            confirm_answers(run, plan, models or {}, loss_fn, log)
        except KeyboardInterrupt:
            interrupted = True
    # when the answer was ready, from this session's start (a run not resumed: its sweep ended at wall_s, the
    # analysis took the rest)
    run.meta["answer_after_s"] = time.time() - started
    run.save_meta()
    if on_answer is not None:
        on_answer(run)
    if not interrupted:
        run_actions(run, plan, models or {}, loss_fn, log, started)


def _new_run(plan: Plan, started: float, log) -> Run:
    run = Run(new_run_dir(plan.cfg.out_dir, plan.cfg.name))
    run.meta = plan.meta | {"started": started, "pid": os.getpid()}  # pid: a resume checks it is not running
    run.save_meta()
    log(f"run folder: {run.path}  ({len(plan.specs)} trials on {plan.cfg.device})")
    return run


def _reopen(run: Run, plan: Plan, log) -> tuple[Run, dict]:
    """The earlier ``run`` to resume, checked against ``plan``, with status running again and this session
    recorded (``resumed``); its rows that ended ok, by spec_key. Its analysis is made again at the end."""
    why = differences(run.meta, plan.cfg.model_dump(), plan.machine, plan.meta["dataset"].get("kind"), os.getpid())
    if why:
        raise ConfigError(f"--resume {run.path}: cannot resume: " + "; ".join(why))
    kept = kept_rows(run)
    session = {
        "at": time.time(),
        "previous_status": run.meta.get("status"),
        "trials_kept": len(kept),
        "trials_to_run_again": len(run.trials) - len(kept),
    }
    run.meta = {k: v for k, v in run.meta.items() if k != "analysis"} | {
        "status": "running",
        "pid": os.getpid(),
        "trials_planned": plan.meta["trials_planned"],
        "resumed": [*run.meta.get("resumed", []), session],
    }
    run.save_meta()
    log(
        f"resuming {run.path}: {len(kept)} trials kept, {session['trials_to_run_again']} to run again, "
        f"and those missing"
    )
    return run, kept


def _measure(run: Run, plan: Plan, models: dict, loss_fn, progress, kept: dict, started: float) -> bool:
    """The CPU reference, the sweep, the CPU reference again; True when interrupted. ``started``: this
    session's start (the search's time budget counts from it)."""
    cores, ref_s = plan.machine["cores"]["usable"], plan.cfg.measure.cpu_reference_s
    if ref_s > 0 and "cpu_reference" not in run.meta:  # before the monitor and the trials, so nothing else
        # competes for the cores; a resumed run keeps the one its first session measured
        run.meta["cpu_reference"] = {
            "timed_region": reference.TIMED_REGION,
            "seconds": ref_s,
            "start": reference.measure(int(cores), ref_s),
        }
        run.save_meta()
    if plan.sources and "decode_costs" not in run.meta:  # both decoders on the run's files: the decoder action's basis
        preset = plan.cfg.augment.preset[0]  # what a worker does after decoding: the probe's processes do it too
        run.meta["decode_costs"] = decode_costs(
            next(iter(plan.sources.values())),
            transform=load_preset(preset, input_size(plan.cfg.model.name[0])),
            cores=int(cores),
        )
        run.meta["timed_regions"]["decode_costs"] = DECODE_TIMED_REGION
    interrupted = _sweep(run, plan, models, loss_fn, progress, kept, started)
    if ref_s > 0 and not interrupted:
        ref = run.meta["cpu_reference"]
        ref["end"] = reference.measure(int(cores), ref_s)
        ref["drift"] = reference.drift(ref["start"], ref["end"])
    return interrupted


def _sweep(run: Run, plan: Plan, models: dict, loss_fn, progress, kept: dict, started: float) -> bool:
    """Every planned trial under the monitor, each row saved as it lands; True when interrupted."""
    cfg, cuda = plan.cfg, plan.cfg.device == "cuda"
    with Monitor(hz=cfg.monitor_hz, gpu=cuda) as monitor, kept_jobs():  # an N-GPU job serves its run of trials
        ctx = TrialContext.from_config(
            cfg,
            torch.device(cfg.device),
            monitor,
            plan.sources,
            int(plan.machine["cores"]["usable"]),
            user_dataset=plan.user_dataset,
            user_loader=plan.user_loader,
            loss_fn=loss_fn,
            models=models,
            job=plan.job,
        )
        timeline_of = lambda tid, t0, t1: summarize(monitor.timeline(), tid, t0, t1)  # noqa: E731
        if cfg.sweep == "adaptive":
            user = plan.user_dataset is not None or plan.user_loader is not None
            rows, interrupted, run.meta["search"] = run_adaptive(
                ctx,
                cfg,
                plan.probe,
                user,
                timeline_of,
                on_row=run.save_trials,
                user_loader=plan.user_loader is not None,
                kept=kept,
                started=started,
            )
        else:
            rows, interrupted = run_sweep(
                ctx, plan.specs, timeline_of, on_row=run.save_trials, progress=progress, kept=kept
            )
        run.meta["monitor_gpu_error"] = monitor.gpu_error
    run.save_trials(rows)
    # a resumed run's timeline goes on from its earlier sessions' (t_s is the machine's monotonic clock)
    run.save_timeline(
        pd.concat([run.timeline, monitor.timeline()], ignore_index=True) if len(run.timeline) else monitor.timeline()
    )
    return interrupted


def _batch_size(
    cfg: RunConfig, auto: bool, probe, user: bool, env: dict, models, loss_fn, log, samples: Optional[int] = None
) -> tuple[RunConfig, Optional[dict]]:
    """``loader.batch_size: auto``: on a GPU the largest batch whose step fits (``batchsize``; at most the
    dataset's ``samples``), confirmed by the gpu_ceiling trial at it, on a CPU device the CPU default
    (resolved already); with the record for run.json (None when not auto)."""
    if not auto:
        return cfg, None
    if cfg.loader.batch_size != "auto":
        return cfg, {
            "policy": "auto",
            "chosen": CPU_BATCH,
            "note": f"on a CPU device auto is the CPU default batch ({CPU_BATCH}): there is no device memory to fill",
        }
    # the confirming trial runs as the sweep's trials do: under the monitor, and each try's release walking only
    # what the try made (trial_heap; the garbage already there, which may hold device memory, freed first)
    with Monitor(hz=cfg.monitor_hz, gpu=True) as monitor, trial_heap(collect_first=True):
        ctx = TrialContext.from_config(
            cfg,
            torch.device(cfg.device),
            monitor,
            {},
            int(env["cores"]["usable"]),
            models=models or {},
            loss_fn=loss_fn,
        )
        reads = set(cfg.trials) - {"gpu_ceiling"}  # a loader trial's batch is made of the dataset's samples
        chosen, record = auto_batch_size(ctx, cfg, probe, user, log, min(MOST, samples or MOST) if reads else MOST)
        chosen, record["confirmed"] = confirm(ctx, cfg, probe, user, chosen, log)
    record["chosen"] = chosen
    c = cfg.model_copy(deep=True)
    c.loader.batch_size = [chosen]
    return c, record


def _job(cfg: RunConfig, folder, user_dataset, user_loader, models, loss_fn) -> dict:
    """What a rank of an N-GPU trial rebuilds its context from: objects cannot cross to the
    processes torchrun starts, so a user's dataset, loader, model or loss must be named by an import
    path (a rank would otherwise fail on the name, or silently train with another loss)."""
    passed = [
        what
        for what, obj in (
            ("dataset", user_dataset is not None and cfg.data.kind != "factory"),
            ("DataLoader", user_loader is not None and cfg.data.kind != "loader"),
            ("model", bool(models)),
            ("loss", loss_fn is not None and cfg.model.loss is None),
        )
        if obj
    ]
    if passed:
        raise ConfigError(
            f"distributed.gpus > 1: each rank is a new process, which the {', '.join(passed)} passed "
            "as a Python object cannot reach; name it by an import path instead (data.kind: factory | "
            "loader with data.factory, model.name, model.loss: pkg.mod:fn)"
        )
    return {
        "config": cfg.model_dump(mode="json"),
        "folder": None if folder is None else str(folder),
        "cpus": sorted(os.sched_getaffinity(0)),
    }


def _sweep_policy(cfg: RunConfig) -> tuple[RunConfig, Optional[str]]:
    """The adaptive search searches num_workers; counts the user named are each measured instead, and
    the nodes of a multi-machine job measure the same grid (searches on two machines would diverge
    and leave one node's trials waiting at a rendezvous the other never joins)."""
    if cfg.sweep == "adaptive" and cfg.loader.num_workers is not None:
        return (
            cfg.model_copy(update={"sweep": "exhaustive"}),
            "loader.num_workers names the worker counts: each is measured (no search)",
        )
    if cfg.sweep == "adaptive" and cfg.distributed.nnodes > 1:
        return (
            cfg.model_copy(update={"sweep": "exhaustive"}),
            "distributed.nnodes > 1: every node measures the same grid of trials",
        )
    return cfg, None


def _configured_loss(cfg: RunConfig) -> Optional[Callable]:
    """The callable ``model.loss`` names; None when unset."""
    if cfg.model.loss is None:
        return None
    from pipeprof.models import load_callable

    try:
        return load_callable(cfg.model.loss)
    except ValueError as exc:
        raise ConfigError(f"model.loss: {exc}") from None


def _user_probe(dataset, cfg: RunConfig) -> Callable[[str, int], tuple[str, int]]:
    """The user's samples, checked on the first sample and the first batch before anything is timed
    (``data.user_samples``; ConfigError saying what fixes them), fix dtype and side, whatever the model's
    native size."""
    sizes = [] if cfg.loader.batch_size == "auto" else cfg.loader.batch_size
    facts = check_user_dataset(dataset, min(sizes, default=FIRST_BATCH_MOST), collate_user, cfg.measure.max_trial_s)
    return lambda preset, size: (facts.dtype, facts.side)


def _factory_dataset(cfg: RunConfig):
    """The Dataset ``data.factory`` makes (``data.kind: factory``)."""
    from pipeprof.models import load_callable

    return load_callable(cfg.data.factory)()


def _samples(sources: dict, user_dataset) -> Optional[int]:
    """The dataset's samples: the first source's, or the user's Dataset's (None: it has no length)."""
    if sources:
        return len(next(iter(sources.values())))
    if user_dataset is None or isinstance(user_dataset, IterableDataset) or not hasattr(user_dataset, "__len__"):
        return None
    return len(user_dataset)


def _available_bytes(env: dict) -> Optional[float]:
    """Memory this run may still take: what the machine has available, under the cgroup's limit."""
    mem = env.get("memory") or {}
    gbs = [g for g in (mem.get("available_gb"), mem.get("cgroup_limit_gb")) if g is not None]
    return min(gbs) * 2**30 if gbs else None


def _load_loader_factory(path: str) -> Callable:
    """The callable ``data.factory`` names for ``data.kind: loader``."""
    from pipeprof.models import load_callable

    try:
        return load_callable(path)
    except ValueError as exc:
        raise ConfigError(f"data.factory: {exc}") from None


def _loader_probe(factory: Callable) -> tuple[Callable[[str, int], tuple[str, int]], int]:
    """Build ``factory(0)`` and take one batch: its images fix dtype, side and batch size.
    Returns (probe for ``sweep.expand``, batch size); a factory that fails is a ConfigError."""
    it = None
    try:
        loader = factory(0)
        if not hasattr(loader, "__iter__"):
            raise TypeError(f"it returned a {type(loader).__name__}, not an iterable DataLoader")
        it = EndlessIter(loader, user_batch)
        images = next(it)["image"]
    except Exception as exc:  # the user's code: any failure means the factory cannot be profiled
        raise ConfigError(
            f"data.factory: fn(num_workers=0) must return a DataLoader (an iterable of batches); "
            f"{type(exc).__name__}: {exc}{collate_fix(str(exc))}"
        ) from None
    finally:
        if it is not None:
            shutdown(it)  # a factory that ignores num_workers=0 may have started workers
    dtype = str(images.dtype).removeprefix("torch.")
    side = int(images[0].shape[-1])
    return (lambda preset, size: (dtype, side)), len(images)


def _with_batch_size(cfg: RunConfig, batch: int) -> RunConfig:
    """The user's DataLoader fixes the batch size (loader.batch_size may only repeat it)."""
    if cfg.loader.batch_size not in (None, [batch]):
        raise ConfigError(
            f"loader.batch_size: {cfg.loader.batch_size}, but the user's DataLoader makes batches of "
            f"{batch}: its factory fixes the batch size"
        )
    c = cfg.model_copy(deep=True)
    c.loader.batch_size = [batch]
    return c


def judge(run: Run) -> None:
    """A run whose analysis found no answer (``analysis.failures``) is ``failed: <cause>`` (the command line
    exits 1 on it), its failed rows kept as they are."""
    found = run.meta["analysis"]["failures"]
    if found["no_answer"] and run.meta["status"] == "complete":
        run.meta["status"] = f"failed: {found['cause']}"
