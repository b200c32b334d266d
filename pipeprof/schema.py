"""Shared records of the measuring side: the trial kinds, what each timer saw, the schema version.

Every module may import this one (it imports nothing of pipeprof's). A stored run carries
``SCHEMA_VERSION``; ``results.load_run`` checks it. ``GROUP_KEYS``: the settings a group of trials (and its
answer) is keyed by.
"""

from __future__ import annotations

from enum import Enum
from typing import Optional

#: Version of what a run folder stores (run.json's layout, the trials' columns, the stored analysis).
#: 1: pipeprof before this field existed; 2: verdicts from each trial's evidence, stored curve rows;
#: 3: the analysis's groups are read back as typed answers (``answer.Answer``; their stored form is schema 2's).
SCHEMA_VERSION = 3

#: The settings that make a group of end-to-end trials (one curve, one answer), in the order labels name them.
GROUP_KEYS = [
    "model",
    "precision",
    "mode",
    "preset",
    "augment_device",
    "augment_overlap",
    "step_first",
    "staged",
    "gpu_decoder",
    "batch_size",
    "source",
    "cache_state",
    "gpus",
    "p2p",
]


#: The GPU pipeline's decoders (``augment.gpu_decoder``) and the default, named here so that the modules that
#: must not import torch at import (the analysis, the report) read them from the same place as ``data.gpu_decode``.
GPU_DECODERS = ("nvjpeg", "torchcodec", "nvimgcodec")
DEFAULT_GPU_DECODER = "nvjpeg"


def on_gpu_pipeline(row) -> bool:
    """Whether a row (or group key) ran the GPU pipeline: ``augment_device`` 'cuda'. The workers' pipeline reads
    'cpu', None, or NaN where a stored table mixes the two (a run that sweeps ``augment.device``): compare with
    'cuda', never with "not 'cpu'"."""
    return row.get("augment_device") == "cuda"


def overlap_mode(row) -> Optional[str]:
    """A GPU-pipeline row's (or group key's) ``augment.overlap`` in the config's words, 'on', 'off', 'step-first'
    or 'staged', from its stored columns (``augment_overlap``, ``step_first``, ``staged``: bools, or 1.0 / 0.0
    where a stored table mixed them with missing values); None where it has none (the workers' pipeline, an older
    run)."""

    def flag(v) -> Optional[bool]:
        return True if v in (True, 1.0) else False if v in (False, 0.0) else None

    on = flag(row.get("augment_overlap"))
    if on is None:
        return None
    if not on:
        return "off"
    return "step-first" if flag(row.get("step_first")) else "staged" if flag(row.get("staged")) else "on"


#: the overlap modes in which a producer prepares batches beside the step (not 'off', where the step waits for it)
OVERLAPPED = ("on", "step-first", "staged")
#: each overlap mode's tag in trial ids and workload labels, and its word in answers ('on', the default: none)
OVERLAP_TAGS = {"off": "serial", "step-first": "stepfirst", "staged": "staged"}
OVERLAP_WORDS = {"off": "serial", "step-first": "step-first", "staged": "staged"}


def overlap_settings(mode: str) -> dict:
    """The stored columns of ``augment.overlap``'s word ``mode``: the inverse of :func:`overlap_mode`."""
    extra = {"step-first": {"step_first": True}, "staged": {"staged": True}}.get(mode, {})
    return {"augment_overlap": mode != "off"} | extra


class TrialKind(str, Enum):
    """The kinds of trial. A str: compares, hashes and serialises as its value."""

    END_TO_END = "end_to_end"
    GPU_CEILING = "gpu_ceiling"
    CPU_PIPELINE = "cpu_pipeline"
    STORAGE_FETCH = "storage_fetch"
    MONITOR_OVERHEAD = "monitor_overhead"
    HANDOFF = "handoff"
    GPU_SHARED = "gpu_shared"
    CORES_PAIR = "cores_pair"

    def __str__(self) -> str:
        return self.value

    def __format__(self, spec: str) -> str:
        return format(self.value, spec)


TRIAL_KINDS: tuple[str, ...] = tuple(k.value for k in TrialKind)
#: the kinds a run plans where its config names no ``trials``: all but the sizing check's masked pairs, which take
#: the machine's CPUs from the job in turns (``trials.kinds.cores_pair``) and answer only the sizing question
DEFAULT_TRIALS: tuple[str, ...] = tuple(k for k in TRIAL_KINDS if k != TrialKind.CORES_PAIR.value)

#: What each figure's clock saw, written into run.json (the kinds' own entries come from the registry).
TIMED_REGIONS = {
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
    "device_decode_ms_mean / device_augment_ms_mean": "augment.device cuda: CUDA events (CPU clock off the GPU) on "
    "the stream that decodes and augments (the training thread's, or the producer thread's with augment.overlap on) "
    "around each measured batch's decode and its augment, read after the window's sync; device_pipeline_host_ms_mean: "
    "the host's wall time in the decode and augment calls, after the wait for the stream a decoder that writes "
    "from a stream of its own needs first; gpu_kernels: data.gpu_kernels' Triton kernels launched while the trial's "
    "pipeline was open (resize, jitter; none: the torch forms ran)",
    "gpu_overlap_frac": "augment.overlap on: of the measured batches' decode + augment spans (their CUDA events), the "
    "share that lay inside the step's compute spans (the step's events on its stream), both on one device clock; "
    "gpu_pipeline_wait_frac: the training thread's waits for a prepared batch beyond what the producer waited on the "
    "loader for it, over the measured time (data_wait_frac holds the loader's part)",
    "trial_s": "the whole trial as the sweep saw it: model build, loader start-up, warm-up, windows, monitor "
    "summary, clean-up",
    "stage_clock_overhead_frac": "cpu_pipeline at the most workers on one loader, stage clocks switched on and off "
    "between windows (ABBA order; the batches in flight after each switch are run "
    "untimed): 1 - clocked rate / unclocked rate per pair of windows, mean and 95% CI; "
    "the row's samples_per_s is the unclocked windows' median",
}
