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

import os
import time
from dataclasses import asdict, dataclass, field
from typing import Any, Optional

import numpy as np
import torch

from .augment import load_preset
from .data.dataset import PipelineDataset, RawBytesDataset, collate_bytes, collate_pipeline
from .loader import build_loader, prefetch_depth, shutdown, worker_pids
from .measure import steady_state
from .monitors import total_pss_mb
from .models import build as build_model
from .step import Step

TIMED_REGIONS = {
    "end_to_end": "next(loader) [data wait] + host->device copy + train/inference step; windows closed by device sync",
    "gpu_ceiling": "train/inference step on a device-resident synthetic batch, same shape and dtype as the loader's; "
                   "windows closed by device sync",
    "cpu_pipeline": "next(loader) only: read, decode, augment, collate in workers (or main when 0 workers), "
                    "plus pinning when pin_memory is on; no model",
    "storage_fetch": "next(loader) over a dataset that reads each sample's bytes and nothing else; same worker count",
    "stage_us_per_sample": "per-sample clocks inside the worker around read, decode, each top-level transform; "
                           "collate per batch; divided by samples",
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
    source: Optional[str] = None
    pin_memory: Optional[bool] = None
    image_size: Optional[int] = None
    input_dtype: Optional[str] = None  # what the loader hands the step: 'uint8' or 'float32'
    stage_timing: Optional[bool] = None  # None: the run's setting; False: the overhead-check twin

    @property
    def trial_id(self) -> str:
        parts = [self.kind, self.model, self.precision, self.preset, self.source,
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
    channels_last: bool = False
    seed: int = 0
    models: dict = field(default_factory=dict)  # name -> factory, for nn.Modules passed to profile()


def run_trial(bench: Bench, spec: TrialSpec) -> dict:
    """Run one trial; returns its metrics (raises on failure: the sweep records it)."""
    return {"end_to_end": end_to_end, "gpu_ceiling": gpu_ceiling,
            "cpu_pipeline": cpu_pipeline, "storage_fetch": storage_fetch}[spec.kind](bench, spec)


# ---- building blocks -------------------------------------------------------------

def pipeline_dataset(bench: Bench, spec: TrialSpec):
    """The dataset the loader reads: pipeprof's pipeline, or the user's own Dataset."""
    if bench.user_dataset is not None:
        return bench.user_dataset
    transform = load_preset(spec.preset, spec.image_size)
    timing = bench.stage_timing if spec.stage_timing is None else spec.stage_timing
    return PipelineDataset(bench.source, spec.decoder, transform, timing)


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
    return Step(model, bench.device, spec.precision, spec.mode, bench.channels_last, bench.num_classes)


def _open_loader(bench: Bench, spec: TrialSpec, dataset, collate):
    loader = build_loader(dataset, spec.batch_size, spec.num_workers, collate, bool(spec.pin_memory),
                          bench.prefetch_factor, bench.seed)
    it = iter(loader)
    bench.monitor.track_workers(worker_pids(it))
    return it


def _close_loader(bench: Bench, it) -> None:
    bench.monitor.track_workers([])
    shutdown(it)


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

def end_to_end(bench: Bench, spec: TrialSpec) -> dict:
    dataset = pipeline_dataset(bench, spec)
    step = make_step(bench, spec)
    it = _open_loader(bench, spec, dataset, _collate_for(dataset))
    records: list = []
    phase = {"now": "warmup"}

    def one() -> int:
        t0 = time.perf_counter()
        batch = next(it)
        wait = time.perf_counter() - t0
        marks = step.run(batch["image"], batch["label"])
        if phase["now"] == "measure":
            records.append((wait, marks, batch.get("stage_s")))
        return batch["image"].shape[0]

    try:
        m, phase = _loop_with(bench, spec, one, phase, step.clock.sync, prefetch_depth(spec.num_workers, bench.prefetch_factor) + 2)
        memory = memory_columns(it)
    finally:
        _close_loader(bench, it)
    return m.stats() | _step_columns(step, records, m) | _stages(dataset, records, m) | memory


def _loop_with(bench, spec, one, phase, sync, min_warmup):
    def on_phase(p: str) -> None:
        phase["now"] = p
        bench.monitor.set_trial(spec.trial_id if p != "done" else None, p if p != "done" else None)

    rounds = max(spec.num_workers or 1, 1)  # whole rounds of worker output per window (see steady_state)
    m = steady_state(one, bench.measure, min_warmup_batches=min_warmup, batch_multiple=rounds, sync=sync,
                     on_phase=on_phase)
    return m, phase


def _step_columns(step: Step, records: list, m) -> dict:
    """Data wait share, copy and compute times of the measured steps (clocks read after sync)."""
    if not records:
        return {}
    measured = m.t_measure_end - m.t_measure_start
    wait = np.array([r[0] for r in records])
    h2d = np.array([step.clock.elapsed_ms(r[1][0], r[1][1]) for r in records])
    compute = np.array([step.clock.elapsed_ms(r[1][1], r[1][2]) for r in records])
    return {"data_wait_frac": float(wait.sum() / measured), "data_wait_ms_p50": float(np.median(wait) * 1e3),
            "data_wait_ms_p95": float(np.percentile(wait, 95) * 1e3),
            "h2d_ms_mean": float(h2d.mean()), "compute_ms_p50": float(np.median(compute)),
            "compute_ms_p95": float(np.percentile(compute, 95)),
            "device_busy_frac": float((h2d.sum() + compute.sum()) / 1e3 / measured),
            "batch_ms_mean": float(measured / len(records) * 1e3)}


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
            records.append((0.0, marks, None))
        return spec.batch_size

    m, _ = _loop_with(bench, spec, one, phase, step.clock.sync, 0)
    cols = _step_columns(step, records, m)
    cols.pop("data_wait_frac", None)
    return m.stats() | cols


def cpu_pipeline(bench: Bench, spec: TrialSpec) -> dict:
    dataset = pipeline_dataset(bench, spec)
    it = _open_loader(bench, spec, dataset, _collate_for(dataset))
    records: list = []
    phase = {"now": "warmup"}

    def one() -> int:
        batch = next(it)
        if phase["now"] == "measure":
            records.append((batch.get("stage_s"),))
        return batch["image"].shape[0]

    try:
        m, _ = _loop_with(bench, spec, one, phase, lambda: None, prefetch_depth(spec.num_workers, bench.prefetch_factor) + 2)
        memory = memory_columns(it)
    finally:
        _close_loader(bench, it)
    return m.stats() | _stages(dataset, records, m) | memory


def storage_fetch(bench: Bench, spec: TrialSpec) -> dict:
    if bench.source is None:
        raise ValueError("storage_fetch needs a pipeprof source; a user Dataset hides its storage")
    it = _open_loader(bench, spec, RawBytesDataset(bench.source), collate_bytes)
    totals = {"bytes": 0, "read_s": 0.0, "n": 0}
    phase = {"now": "warmup"}

    def one() -> int:
        batch = next(it)
        if phase["now"] == "measure":
            for k in totals:
                totals[k] += batch[k]
        return batch["n"]

    try:
        m, _ = _loop_with(bench, spec, one, phase, lambda: None, prefetch_depth(spec.num_workers, bench.prefetch_factor) + 2)
    finally:
        _close_loader(bench, it)
    measured = m.t_measure_end - m.t_measure_start
    return m.stats() | {"read_mb_s": totals["bytes"] / 1e6 / measured,
                        "read_latency_ms_mean": totals["read_s"] / max(totals["n"], 1) * 1e3,
                        "mean_sample_kb": totals["bytes"] / max(totals["n"], 1) / 1e3}
