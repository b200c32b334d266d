"""What every loader-driven trial shares: its dataset and step, the loader's lifecycle with the
monitor told of each phase, and the page-cache state set before and checked after."""

from __future__ import annotations

import os
import time
from typing import Any, Optional

import torch
from torch.utils.data import IterableDataset

from pipeprof.data import cache
from pipeprof.data.augment import load_preset
from pipeprof.data.dataset import PipelineDataset, RawBytesDataset, SampleTally, collate_pipeline, stack
from pipeprof.data.encoded import EncodedDataset, collate_encoded
from pipeprof.measure.loader import (
    USER_WORKER_POLICY,
    EndlessIter,
    access_order,
    build_loader,
    collect_before_fork,
    prefetch_depth,
    shutdown,
    user_batch,
    worker_pids,
)
from pipeprof.measure.step import Step
from pipeprof.measure.windows import steady_state
from pipeprof.models import build as build_model

from .columns import memory_columns, pct, sample_columns
from .spec import TrialContext, TrialSpec


def pipeline_dataset(ctx: TrialContext, spec: TrialSpec):
    """The dataset the loader reads: pipeprof's pipeline, or the user's own Dataset (None when the
    user's own DataLoader brings its dataset)."""
    if ctx.user_dataset is not None or ctx.user_loader is not None:
        return ctx.user_dataset
    timing = ctx.stage_timing if spec.stage_timing is None else spec.stage_timing
    if spec.augment_device not in (None, "cpu"):  # the workers read bytes; the step's device does the rest
        return EncodedDataset(ctx.source_for(spec), timing, ctx.sample_policy)
    transform = load_preset(spec.preset, spec.image_size)
    return PipelineDataset(ctx.source_for(spec), spec.decoder, transform, timing, ctx.sample_policy)


def collate_for(dataset):
    if isinstance(dataset, EncodedDataset):
        return collate_encoded
    return collate_pipeline if isinstance(dataset, PipelineDataset) else collate_user


def collate_user(samples):
    """For a user Dataset returning (image_tensor, label, ...) tuples."""
    images = stack(s[0] for s in samples)
    labels = torch.as_tensor([int(s[1]) for s in samples], dtype=torch.long)
    return {"image": images, "label": labels}


def make_step(ctx: TrialContext, spec: TrialSpec) -> Step:
    factory = ctx.models.get(spec.model)
    model = factory() if factory else build_model(spec.model, ctx.num_classes)
    return Step(
        model,
        ctx.device,
        spec.precision,
        spec.mode,
        ctx.channels_last,
        ctx.num_classes,
        ctx.cudnn_benchmark,
        loss_fn=ctx.loss_fn,
        ddp=ctx.ddp is not None,
    )


def open_loader(ctx: TrialContext, spec: TrialSpec, dataset, collate, knobs: dict | None = None):
    """An iterator of ``{"image", "label", ...}`` batches, with the monitor following its workers.

    With ``ctx.user_loader`` the user's own DataLoader for this worker count, as they built it
    (sampler, collate, workers); its passes end, so it runs through EndlessIter, as does ours over
    an IterableDataset. Each new pass has new workers: the monitor is told their PIDs again. ``knobs``: other
    DataLoader settings of pipeprof's loader (an action trial's variant).
    """

    def track(it) -> None:
        ctx.monitor.track_workers(worker_pids(it))

    if ctx.user_loader is not None:
        it = EndlessIter(ctx.user_loader(spec.num_workers), user_batch, track)
    else:
        # a batch that takes longer than a whole trial may take means the storage stopped answering
        loader = build_loader(
            dataset,
            spec.batch_size,
            spec.num_workers,
            collate,
            bool(spec.pin_memory),
            ctx.prefetch_factor,
            ctx.seed,
            timeout_s=ctx.measure.max_trial_s,
            shard=ctx.ddp,
            **(knobs or {}),
        )
        collect_before_fork()
        it = EndlessIter(loader, on_pass=track) if isinstance(dataset, IterableDataset) else iter(loader)
    track(it)
    return it


def loader_columns(ctx: TrialContext, it) -> dict:
    """How the loader ran: its restarts (passes that ended inside the trial) and whose worker policy."""
    cols = {"loader_restarts": it.restarts} if isinstance(it, EndlessIter) else {}
    if ctx.user_loader is not None:  # its worker_init_fn is the user's: no thread caps or seeds of ours
        cols["worker_policy"] = USER_WORKER_POLICY
    return cols


def close_loader(ctx: TrialContext, it) -> None:
    ctx.monitor.track_workers([])
    shutdown(it)


class CacheCheck:
    """Set a trial's page-cache state, then see across the measured windows whether it held.

    Only for sources that read local files (``Source.files()``); for the others every
    method is a no-op and the trial's ``cache_state`` is 'n/a'.
    """

    COLD = ("cold", "cold-system")
    COLD_MIN_DISK_FRAC = 0.10  # a cold trial reading less than this from the disk did not measure cold reads

    def __init__(self, source, state: Optional[str]):
        self.state = state
        files = source.files() if source is not None and state in ("warm", *self.COLD) else None
        self.files = files or None
        self.probe: Optional[cache.IoProbe] = None
        self.result: Optional[dict] = None
        self.resident_before: Optional[float] = None

    @property
    def cold(self) -> bool:
        return self.files is not None and self.state in self.COLD

    def prepare(self) -> dict:
        """Put the files in the requested state (outside any timed region); columns about it."""
        if self.files is None:
            return {}
        t0 = time.perf_counter()
        if self.state == "warm":
            cache.warm(self.files)
        elif self.state == "cold":
            cache.evict(self.files, flush=True)  # flush: a dataset written moments ago has dirty pages
        else:  # cold-system: the user asked for the whole machine's cache to go (needs the rights)
            cache.drop_all_caches()
        prepare_s = time.perf_counter() - t0
        self.resident_before = cache.resident_fraction(self.files)
        return {"cache_prepare_s": prepare_s, "resident_frac_before": self.resident_before}

    def start(self, it) -> None:
        """Start counting at the first measured window. With workers only they read the files;
        the main process's counters would add its pipe reads (batches) and /proc reads (monitor)."""
        if self.files is not None:
            self.probe = cache.IoProbe(worker_pids(it) or [os.getpid()]).start()

    def stop(self) -> None:
        """Stop counting (before the workers shut down: their counters leave with them)."""
        if self.probe is not None and self.result is None:
            self.result = self.probe.stop()

    def columns(self, kind: str, samples_read: int, dataset_samples: int, warmup_samples: int = 0) -> dict:
        cols: dict[str, Any] = {
            "dataset_samples": dataset_samples,
            "samples_read": samples_read,
            "passes_read": samples_read / dataset_samples if dataset_samples else None,
        }
        if self.result is None:
            return cols
        frac = self.result["disk_fraction"]
        cols |= {
            "disk_read_frac": frac,
            "disk_read_mb": self.result["read_bytes"] / 1e6,
            "read_chars_mb": self.result["read_chars"] / 1e6,
        }
        notes = []
        if self.cold and dataset_samples and warmup_samples >= dataset_samples:
            notes.append(
                f"cold holds for the first pass only, and the warm-up alone read {warmup_samples} samples "
                f"of {dataset_samples}: the measured windows read from the page cache "
                f"({pct(frac)} from the disk); a larger dataset or a smaller batch measures cold reads"
            )
        elif self.cold and frac is not None and frac < self.COLD_MIN_DISK_FRAC:
            notes.append(
                f"cold requested but data came from cache: {frac:.0%} of the bytes read in the measured "
                f"windows came from the disk (page cache held {pct(self.resident_before)} of the files "
                "before); the filesystem may keep pages in memory (tmpfs, some network/FUSE mounts) or not "
                "count read_bytes"
            )
        elif self.cold and kind != "storage_fetch" and cols["passes_read"] and cols["passes_read"] > 1:
            notes.append(
                f"cold holds for the first pass only: this trial read {samples_read} samples, "
                f"{cols['passes_read']:.1f} passes over {dataset_samples}, so part of its windows read "
                f"from the page cache ({pct(frac)} from the disk)"
            )
        if self.state == "warm" and frac is not None and frac > 0.5:
            notes.append(
                f"warm requested but {frac:.0%} of the bytes came from the disk: the dataset does not "
                "stay in the page cache"
            )
        if notes:
            cols["cache_note"] = "; ".join(notes)
        return cols


def loader_trial(
    ctx: TrialContext,
    spec: TrialSpec,
    dataset,
    one_batch,
    sync=lambda: None,
    collate=None,
    loop=None,
    before_close=lambda: None,
):
    """The shape every loader-driven trial shares: set the cache state, open the loader, run
    the steady-state windows over ``one_batch(it, measuring) -> samples``, take memory, close.

    ``loop(one, phase, check, it) -> Measurement`` replaces the standard warm-up and windows
    (storage_fetch's cold reads plan theirs). ``one_batch`` reads through a SampleTally, so the row
    counts the bad samples and outsize images the workers met. ``before_close``: stops what reads the loader
    besides ``one_batch`` (the GPU pipeline's producer thread) before the loader closes. Returns (measurement,
    memory, storage and sample columns).
    """
    check = CacheCheck(_source_of(dataset), spec.cache_state)
    prepared = check.prepare()
    it = open_loader(ctx, spec, dataset, collate or collate_for(dataset))
    tally = SampleTally(it)
    phase = {"now": "warmup"}

    def one() -> int:
        return one_batch(tally, phase["now"] == "measure")

    try:
        if loop is not None:
            m = loop(one, phase, check, it)
        else:
            m = loop_with(
                ctx,
                spec,
                one,
                phase,
                sync,
                prefetch_depth(spec.num_workers, ctx.prefetch_factor) + 2,
                check=check,
                it=it,
            )
        memory = memory_columns(it) | loader_columns(ctx, it) | sample_columns(tally, ctx.sample_policy)
    finally:
        before_close()
        check.stop()
        close_loader(ctx, it)
    return m, memory | _storage_columns(dataset, check, spec, m, prepared)


def _source_of(dataset):
    """The pipeprof Source behind a dataset of ours; None for a user's Dataset (whatever its attributes)."""
    return dataset.source if isinstance(dataset, (PipelineDataset, RawBytesDataset, EncodedDataset)) else None


def _storage_columns(dataset, check: CacheCheck, spec: TrialSpec, m, prepared: dict) -> dict:
    """Cache state as set and as seen, and how much of the dataset the trial read (pipeprof sources only)."""
    source = _source_of(dataset)
    if source is None:
        return {}
    stats = m.stats()
    warmup = stats["warmup_batches"] * spec.batch_size
    read = warmup + stats["batches_measured"] * spec.batch_size
    return prepared | check.columns(spec.kind, read, len(source), warmup) | {"access_order": access_order(dataset)}


def loop_with(ctx, spec, one, phase, sync, min_warmup, policy=None, check: Optional[CacheCheck] = None, it=None):
    """steady_state with the monitor told each phase; ``check`` counts disk reads over the measured windows."""

    def on_phase(p: str) -> None:
        phase["now"] = p
        ctx.monitor.set_trial(spec.trial_id if p != "done" else None, p if p != "done" else None)
        if check is not None:
            if p == "measure":
                check.start(it)
            elif p == "done":
                check.stop()

    rounds = max(spec.num_workers or 1, 1)  # whole rounds of worker output per window (see steady_state)
    return steady_state(
        one,
        policy or ctx.measure,
        min_warmup_batches=min_warmup,
        batch_multiple=rounds,
        clock=ctx.clock,
        sync=sync,
        on_phase=on_phase,
    )
