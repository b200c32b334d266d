"""The four kinds of trial. Each runs one steady-state measurement and returns a row.

| kind           | timed region of one step                                   |
|----------------|------------------------------------------------------------|
| end_to_end     | next(loader) + host→device copy + model step               |
| gpu_ceiling    | model step on a batch already on the device (no loader)    |
| cpu_pipeline   | next(loader): read → decode → augment → collate (→ pin)    |
| storage_fetch  | next(loader) over a dataset that only reads the bytes      |

``TIMED_REGIONS`` is written into run.json so every figure says what its clock saw.
"""
from __future__ import annotations

import math
import os
import time
from dataclasses import asdict, dataclass, field
from typing import Any, Optional

import numpy as np
import torch

from .augment import load_preset
from .confounders import step_threads, torch_threads
from .data import cache
from .data.dataset import PipelineDataset, RawBytesDataset, TimingSwitch, collate_bytes, collate_pipeline
from .loader import access_order, build_loader, prefetch_depth, shutdown, worker_pids
from .measure import alternating, steady_state, summarize_rates
from .monitors import total_pss_mb
from .models import build as build_model
from .step import Step

TIMED_REGIONS = {
    "end_to_end": "next(loader) [data wait] + host->device copy + train/inference step; windows closed by device sync",
    "gpu_ceiling": "train/inference step on a device-resident synthetic batch, same shape and dtype as the loader's; "
                   "windows closed by device sync",
    "cpu_pipeline": "next(loader) only: read, decode, augment, collate in workers (or main when 0 workers), "
                    "plus pinning when pin_memory is on; no model",
    "storage_fetch": "next(loader) over a dataset that reads each sample's bytes and nothing else; same worker count. "
                     "With cache_state cold/cold-system the page cache only stays cold for the first pass over the "
                     "dataset, so warm-up (prefetch depth + one round of workers) and windows are counted in batches "
                     "such that warm-up + windows + the batches in flight stay within one pass (samples_read vs "
                     "dataset_samples, in_first_pass); windows then aim at window_s from the warm-up's rate",
    "read_latency_ms": "storage_fetch: wall time of each sample's read inside the worker (waits included); "
                       "p50/p95/p99 over the measured windows; reads_s and read_mb_s: reads and bytes / measured time",
    "stage_us_per_sample": "per-sample clocks inside the worker around read, decode, each top-level transform; "
                           "collate per batch; divided by samples. read counts the worker thread's CPU time "
                           "(time.thread_time), not its wait for storage: the stage sums are worker CPU cost",
    "cache_state": "set right before the trial, outside the timed region: warm = every file read once; cold = "
                   "posix_fadvise(DONTNEED) per file (after fdatasync); cold-system = the kernel's drop_caches; "
                   "n/a = the source does not read local files (memory, url). resident_frac_before: mincore after "
                   "setting it. disk_read_frac: delta read_bytes / delta read_chars (/proc/PID/io) of the processes "
                   "that read the files (the workers, or the main process at 0 workers) over the measured windows",
    "cache_prepare_s": "setting the cache state before the trial (reading every file once, or evicting them)",
    "h2d_ms_mean / compute_ms": "CUDA events (CPU clock off the GPU) around the host->device copy and around the step, "
                                "per measured step, read after the window's sync; device_busy_frac: their sum / "
                                "measured time",
    "trial_s": "the whole trial as the sweep saw it: model build, loader start-up, warm-up, windows, monitor "
               "summary, clean-up",
    "stage_clock_overhead_frac": "cpu_pipeline at the most workers on one loader, stage clocks switched on and off "
                                 "between windows (ABBA order; the batches in flight after each switch are run "
                                 "untimed): 1 - clocked rate / unclocked rate per pair of windows, mean and 95% CI; "
                                 "the row's samples_per_s is the unclocked windows' median",
}


@dataclass(frozen=True)
class TrialSpec:
    """One point of the sweep; fields that do not affect a kind are None for it."""

    kind: str
    num_workers: Optional[int] = None
    batch_size: int = 1
    model: Optional[str] = None
    precision: Optional[str] = None
    mode: Optional[str] = None
    preset: Optional[str] = None
    decoder: Optional[str] = None
    source: Optional[str] = None  # the source spec's label (config.DataConfig.source)
    cache_state: Optional[str] = None  # warm, cold, cold-system; 'n/a' for sources without local files
    pin_memory: Optional[bool] = None
    image_size: Optional[int] = None
    input_dtype: Optional[str] = None  # what the loader hands the step: 'uint8' or 'float32'
    stage_timing: Optional[bool] = None  # None: the run's setting; False: the overhead-check twin

    @property
    def trial_id(self) -> str:
        cache_state = None if self.cache_state == "n/a" else self.cache_state  # no '/' inside a part
        parts = [self.kind, self.model, self.precision, self.preset, self.source, cache_state,
                 f"bs{self.batch_size}", None if self.num_workers is None else f"w{self.num_workers}"]
        if self.stage_timing is False:
            parts.append("untimed")
        return "/".join(str(p) for p in parts if p is not None)

    def columns(self) -> dict:
        return asdict(self) | {"trial_id": self.trial_id}


@dataclass
class Bench:
    """What every trial of a sweep shares: device, data, policies, monitor."""

    device: torch.device
    source: Any  # a pipeprof Source, or None when the user passed their own Dataset
    measure: Any  # config.MeasureConfig
    monitor: Any  # monitors.Monitor
    user_dataset: Any = None
    stage_timing: bool = True
    prefetch_factor: int = 2
    num_classes: int = 1000
    loss_fn: Any = None  # fn(raw model output, labels) -> scalar tensor; None: cross-entropy (see step.Step)
    channels_last: bool = False
    cudnn_benchmark: Optional[bool] = None  # None: step.configure_precision decides per precision
    seed: int = 0
    cores: int = 1  # usable cores of the run (affinity and cgroup aware)
    step_threads: Optional[int] = None  # model.threads: the CPU step's threads; None: confounders.step_threads
    models: dict = field(default_factory=dict)  # name -> factory, for nn.Modules passed to profile()
    sources: dict = field(default_factory=dict)  # source label -> Source, built once per sweep
    source_info: dict = field(default_factory=dict)  # source label -> columns every trial on it carries

    def source_for(self, spec: "TrialSpec"):
        """The Source a trial reads: the one its label names, else the sweep's only source."""
        return self.sources.get(spec.source, self.source) if spec.source is not None else self.source


def run_trial(bench: Bench, spec: TrialSpec) -> dict:
    """Run one trial; returns its metrics (raises on failure: the sweep records it).

    The training process's thread count is part of what is measured: set per trial by
    ``confounders.step_threads`` and recorded as ``step_threads`` (None: torch's default).
    """
    n = step_threads(spec.kind, bench.device.type, bench.cores, spec.num_workers, bench.step_threads)
    with torch_threads(n):
        metrics = {"end_to_end": end_to_end, "gpu_ceiling": gpu_ceiling,
                   "cpu_pipeline": cpu_pipeline, "storage_fetch": storage_fetch}[spec.kind](bench, spec)
    return metrics | ({"step_threads": n} if n is not None else {})


# ---- building blocks -------------------------------------------------------------

def pipeline_dataset(bench: Bench, spec: TrialSpec):
    """The dataset the loader reads: pipeprof's pipeline, or the user's own Dataset."""
    if bench.user_dataset is not None:
        return bench.user_dataset
    transform = load_preset(spec.preset, spec.image_size)
    timing = bench.stage_timing if spec.stage_timing is None else spec.stage_timing
    return PipelineDataset(bench.source_for(spec), spec.decoder, transform, timing)


def _collate_for(dataset):
    return collate_pipeline if isinstance(dataset, PipelineDataset) else collate_user


def collate_user(samples):
    """For a user Dataset returning (image_tensor, label, ...) tuples."""
    images = torch.stack([torch.as_tensor(s[0]) for s in samples])
    labels = torch.as_tensor([int(s[1]) for s in samples], dtype=torch.long)
    return {"image": images, "label": labels}


def make_step(bench: Bench, spec: TrialSpec) -> Step:
    factory = bench.models.get(spec.model)
    model = factory() if factory else build_model(spec.model, bench.num_classes)
    return Step(model, bench.device, spec.precision, spec.mode, bench.channels_last, bench.num_classes,
                bench.cudnn_benchmark, loss_fn=bench.loss_fn)


def _open_loader(bench: Bench, spec: TrialSpec, dataset, collate):
    # a batch that takes longer than a whole trial may take means the storage stopped answering
    loader = build_loader(dataset, spec.batch_size, spec.num_workers, collate, bool(spec.pin_memory),
                          bench.prefetch_factor, bench.seed, timeout_s=bench.measure.max_trial_s)
    it = iter(loader)
    bench.monitor.track_workers(worker_pids(it))
    return it


def _close_loader(bench: Bench, it) -> None:
    bench.monitor.track_workers([])
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
        cols: dict[str, Any] = {"dataset_samples": dataset_samples, "samples_read": samples_read,
                                "passes_read": samples_read / dataset_samples if dataset_samples else None}
        if self.result is None:
            return cols
        frac = self.result["disk_fraction"]
        cols |= {"disk_read_frac": frac, "disk_read_mb": self.result["read_bytes"] / 1e6,
                 "read_chars_mb": self.result["read_chars"] / 1e6}
        notes = []
        if self.cold and dataset_samples and warmup_samples >= dataset_samples:
            notes.append(f"cold holds for the first pass only, and the warm-up alone read {warmup_samples} samples "
                         f"of {dataset_samples}: the measured windows read from the page cache "
                         f"({_pct(frac)} from the disk); a larger dataset or a smaller batch measures cold reads")
        elif self.cold and frac is not None and frac < self.COLD_MIN_DISK_FRAC:
            notes.append(f"cold requested but data came from cache: {frac:.0%} of the bytes read in the measured "
                         f"windows came from the disk (page cache held {_pct(self.resident_before)} of the files "
                         "before); the filesystem may keep pages in memory (tmpfs, some network/FUSE mounts) or not "
                         "count read_bytes")
        elif self.cold and kind != "storage_fetch" and cols["passes_read"] and cols["passes_read"] > 1:
            notes.append(f"cold holds for the first pass only: this trial read {samples_read} samples, "
                         f"{cols['passes_read']:.1f} passes over {dataset_samples}, so part of its windows read "
                         f"from the page cache ({_pct(frac)} from the disk)")
        if self.state == "warm" and frac is not None and frac > 0.5:
            notes.append(f"warm requested but {frac:.0%} of the bytes came from the disk: the dataset does not "
                         "stay in the page cache")
        if notes:
            cols["cache_note"] = "; ".join(notes)
        return cols


def _pct(x) -> str:
    return "?" if x is None else f"{x:.0%}"


def memory_columns(it) -> dict:
    """RAM the main process and its workers take together at steady state (PSS, after the windows)."""
    return {"pss_mb_steady": total_pss_mb([os.getpid(), *worker_pids(it)])}


def stage_columns(names: list[str], stage_sum_s: np.ndarray, samples: int) -> dict:
    """Mean µs per sample and share of worker time for each stage (+ collate)."""
    names = list(names) + ["collate"]
    total = float(stage_sum_s.sum()) or 1.0
    cols = {}
    for name, s in zip(names, stage_sum_s):
        cols[f"stage_us_per_sample.{name}"] = float(s) / samples * 1e6
        cols[f"stage_share.{name}"] = float(s) / total
    return cols


# ---- the four kinds ---------------------------------------------------------------

def _loader_trial(bench: Bench, spec: TrialSpec, dataset, one_batch, sync=lambda: None, collate=None,
                  loop=None):
    """The shape every loader-driven trial shares: set the cache state, open the loader, run
    the steady-state windows over ``one_batch(it, measuring) -> samples``, take memory, close.

    ``loop(one, phase, check, it) -> Measurement`` replaces the standard warm-up and windows
    (storage_fetch's cold reads plan theirs). Returns (measurement, memory and storage columns).
    """
    check = CacheCheck(_source_of(dataset), spec.cache_state)
    prepared = check.prepare()
    it = _open_loader(bench, spec, dataset, collate or _collate_for(dataset))
    phase = {"now": "warmup"}

    def one() -> int:
        return one_batch(it, phase["now"] == "measure")

    try:
        if loop is not None:
            m = loop(one, phase, check, it)
        else:
            m = _loop_with(bench, spec, one, phase, sync, prefetch_depth(spec.num_workers, bench.prefetch_factor) + 2,
                           check=check, it=it)
        memory = memory_columns(it)
    finally:
        check.stop()
        _close_loader(bench, it)
    return m, memory | _storage_columns(dataset, check, spec, m, prepared)


def end_to_end(bench: Bench, spec: TrialSpec) -> dict:
    dataset = pipeline_dataset(bench, spec)
    step = make_step(bench, spec)
    records: list = []

    def one_batch(it, measuring: bool) -> int:
        t0 = time.perf_counter()
        batch = next(it)
        wait = time.perf_counter() - t0
        marks = step.run(batch["image"], batch["label"])
        if measuring:
            records.append((wait, marks, batch.get("stage_s")))
        return batch["image"].shape[0]

    m, extra = _loader_trial(bench, spec, dataset, one_batch, step.clock.sync)
    return m.stats() | _step_columns(step, records, m) | _stages(dataset, records, m) | extra


def _source_of(dataset):
    """The pipeprof Source behind a dataset of ours; None for a user's Dataset (whatever its attributes)."""
    return dataset.source if isinstance(dataset, (PipelineDataset, RawBytesDataset)) else None


def _storage_columns(dataset, check: CacheCheck, spec: TrialSpec, m, prepared: dict) -> dict:
    """Cache state as set and as seen, and how much of the dataset the trial read (pipeprof sources only)."""
    source = _source_of(dataset)
    if source is None:
        return {}
    stats = m.stats()
    warmup = stats["warmup_batches"] * spec.batch_size
    read = warmup + stats["batches_measured"] * spec.batch_size
    return prepared | check.columns(spec.kind, read, len(source), warmup) | {"access_order": access_order(dataset)}


def _loop_with(bench, spec, one, phase, sync, min_warmup, policy=None, check: Optional[CacheCheck] = None, it=None):
    """steady_state with the monitor told each phase; ``check`` counts disk reads over the measured windows."""
    def on_phase(p: str) -> None:
        phase["now"] = p
        bench.monitor.set_trial(spec.trial_id if p != "done" else None, p if p != "done" else None)
        if check is not None:
            if p == "measure":
                check.start(it)
            elif p == "done":
                check.stop()

    rounds = max(spec.num_workers or 1, 1)  # whole rounds of worker output per window (see steady_state)
    return steady_state(one, policy or bench.measure, min_warmup_batches=min_warmup, batch_multiple=rounds,
                        sync=sync, on_phase=on_phase)


def _step_columns(step: Step, records: list, m) -> dict:
    """Data wait share, copy and compute times of the measured steps (clocks read after sync)."""
    if not records:
        return {}
    measured = m.t_measure_end - m.t_measure_start
    h2d = np.array([step.clock.elapsed_ms(r[1][0], r[1][1]) for r in records])
    compute = np.array([step.clock.elapsed_ms(r[1][1], r[1][2]) for r in records])
    cols = {"tf32": step.settings["tf32"], "cudnn_benchmark": step.settings["cudnn_benchmark"],
            "h2d_ms_mean": float(h2d.mean()), "compute_ms_p50": float(np.median(compute)),
            "compute_ms_p95": float(np.percentile(compute, 95)),
            "device_busy_frac": float((h2d.sum() + compute.sum()) / 1e3 / measured),
            "batch_ms_mean": float(measured / len(records) * 1e3)}
    if records[0][0] is not None:  # gpu_ceiling has no loader, so no wait to report
        wait = np.array([r[0] for r in records])
        cols |= {"data_wait_frac": float(wait.sum() / measured), "data_wait_ms_p50": float(np.median(wait) * 1e3),
                 "data_wait_ms_p95": float(np.percentile(wait, 95) * 1e3)}
    return cols


def _stages(dataset, records: list, m) -> dict:
    stage = [r[-1] for r in records if r[-1] is not None]
    if not stage or not getattr(dataset, "stage_timing", False):
        return {}
    return stage_columns(dataset.stage_names, np.sum([s.numpy() for s in stage], axis=0),
                         m.stats()["samples_measured"])


def gpu_ceiling(bench: Bench, spec: TrialSpec) -> dict:
    step = make_step(bench, spec)
    x, y = step.synthetic_batch(spec.batch_size, spec.image_size, getattr(torch, spec.input_dtype))
    records: list = []
    phase = {"now": "warmup"}

    def one() -> int:
        marks = step.run(x, y, on_device=True)
        if phase["now"] == "measure":
            records.append((None, marks, None))
        return spec.batch_size

    m = _loop_with(bench, spec, one, phase, step.clock.sync, 0)
    return m.stats() | _step_columns(step, records, m)


def cpu_pipeline(bench: Bench, spec: TrialSpec) -> dict:
    if spec.stage_timing is False:
        return clock_overhead(bench, spec)
    dataset = pipeline_dataset(bench, spec)
    records: list = []

    def one_batch(it, measuring: bool) -> int:
        batch = next(it)
        if measuring:
            records.append((batch.get("stage_s"),))
        return batch["image"].shape[0]

    m, extra = _loader_trial(bench, spec, dataset, one_batch)
    return m.stats() | _stages(dataset, records, m) | extra


def clock_overhead(bench: Bench, spec: TrialSpec) -> dict:
    """What the stage clocks cost: one loader, clocks switched on and off between windows."""
    switch = TimingSwitch(True)
    dataset = PipelineDataset(bench.source_for(spec), spec.decoder, load_preset(spec.preset, spec.image_size), switch)
    it = _open_loader(bench, spec, dataset, collate_pipeline)
    rounds = max(spec.num_workers or 1, 1)

    def on_phase(p: str) -> None:
        bench.monitor.set_trial(spec.trial_id if p != "done" else None, p if p != "done" else None)

    try:
        paired = alternating(lambda: next(it)["image"].shape[0], switch.set, bench.measure, on_phase=on_phase,
                             drain_batches=prefetch_depth(spec.num_workers, bench.prefetch_factor) + rounds,
                             batch_multiple=rounds)
    finally:
        _close_loader(bench, it)
    off = summarize_rates([w.rate for w in paired.b])
    cost = paired.cost()
    pairs, windows = cost["pairs"], paired.a + paired.b
    reasons = []
    if pairs < 2:
        reasons.append(f"only {pairs} pair{'' if pairs == 1 else 's'} of clocked/unclocked windows fitted in "
                       f"max_trial_s ({bench.measure.max_trial_s:g} s)")
    elif pairs < paired.planned_pairs:
        reasons.append(f"only {pairs} of {paired.planned_pairs} planned pairs of clocked/unclocked windows fitted "
                       f"in max_trial_s ({bench.measure.max_trial_s:g} s)")
    if paired.warmup_batches < paired.warmup_wanted:
        reasons.append(f"warm-up cut short at {paired.warmup_batches} of {paired.warmup_wanted} batches")
    return off | {"windows": len(windows),
                  "t_measure_start_s": min(w.t_start for w in windows) if windows else None,
                  "t_measure_end_s": max(w.t_end for w in windows) if windows else None,
                  "clocked_samples_per_s": summarize_rates([w.rate for w in paired.a])["samples_per_s"],
                  "stage_clock_overhead_frac": cost["cost_frac"], "stage_clock_overhead_ci95_low": cost["cost_ci95_low"],
                  "stage_clock_overhead_ci95_high": cost["cost_ci95_high"],
                  "unstable": bool(reasons), "unstable_reason": "; ".join(reasons) or None}


def one_pass_plan(samples: int, batch_size: int, workers: int, depth: int, windows: int,
                  window_batches: int, warm_rate: Optional[float], window_s: float) -> dict:
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


def storage_fetch(bench: Bench, spec: TrialSpec) -> dict:
    source = bench.source_for(spec)
    if source is None:
        raise ValueError("storage_fetch needs a pipeprof source; a user Dataset hides its storage")
    dataset = RawBytesDataset(source)
    totals = {"bytes": 0, "read_s": 0.0, "n": 0}
    times: list[float] = []

    def one_batch(it, measuring: bool) -> int:
        batch = next(it)
        if measuring:
            for k in totals:
                totals[k] += batch[k]
            times.extend(batch["read_times"])
        return batch["n"]

    depth = prefetch_depth(spec.num_workers, bench.prefetch_factor)
    plan: dict = {}

    def loop(one, phase, check, it):
        if not check.cold:
            return _loop_with(bench, spec, one, phase, lambda: None, depth + 2, check=check, it=it)
        # the cache is cold only until each file has been read once: warm up by hand, size the
        # windows from the warm-up's rate and the batches left in this pass, then measure
        bench.monitor.set_trial(spec.trial_id, "warmup")
        rounds = max(spec.num_workers or 1, 1)
        t0, n = time.perf_counter(), 0
        for _ in range(depth + rounds):
            n += one()
        warm_s = time.perf_counter() - t0
        plan.update(one_pass_plan(len(dataset), spec.batch_size, spec.num_workers, depth, bench.measure.windows,
                                  bench.measure.window_batches, n / warm_s if warm_s > 0 else None,
                                  bench.measure.window_s))
        policy = bench.measure.model_copy(update={"warmup_batches": 0, "warmup_s": 0.0, "window_s": 0.0,
                                                  "window_batches": plan["window_batches"],
                                                  "windows": plan["windows"],
                                                  "max_windows": plan["windows"]})  # more would leave the pass
        m = _loop_with(bench, spec, one, phase, lambda: None, 0, policy=policy, check=check, it=it)
        m.warmup_batches, m.warmup_s = plan["warmup_batches"], warm_s
        return m

    m, extra = _loader_trial(bench, spec, dataset, one_batch, collate=collate_bytes, loop=loop)
    measured = m.t_measure_end - m.t_measure_start
    lat = np.asarray(times) * 1e3
    cols = {"read_latency_ms_mean": totals["read_s"] / max(totals["n"], 1) * 1e3,
            "mean_sample_kb": totals["bytes"] / max(totals["n"], 1) / 1e3}
    if measured > 0:  # no window fits when warm-up spent the whole budget: the row says unstable, no rate
        cols |= {"read_mb_s": totals["bytes"] / 1e6 / measured, "reads_s": totals["n"] / measured}
    if len(lat):
        cols |= {f"read_latency_ms_p{q}": float(np.percentile(lat, q)) for q in (50, 95, 99)}
    if plan:
        cols["in_first_pass"] = plan["in_first_pass"]
    out = m.stats() | cols | extra
    if plan and not plan["in_first_pass"]:
        note = (f"dataset too small for a cold measurement within one pass ({len(dataset)} samples, batch "
                f"{spec.batch_size}, {depth} batches in flight): part of the windows re-read cached files")
        out["cache_note"] = "; ".join(filter(None, [out.get("cache_note"), note]))
    return out
