"""A trial's settings (:class:`TrialSpec`) and what every trial of a sweep shares (:class:`TrialContext`)."""

from __future__ import annotations

import math
import time
from dataclasses import asdict, dataclass, field, fields
from typing import Any, Callable, Optional

import torch

from pipeprof.data.dataset import SamplePolicy
from pipeprof.schema import DEFAULT_GPU_DECODER, OVERLAP_TAGS, overlap_mode


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
    gpus: int = 1  # processes (one GPU each) of the trial; > 1: DDP under torchrun (see ``distributed``)
    p2p: Optional[bool] = None  # N > 1 step kinds: False runs with NCCL_P2P_DISABLE=1 (the link off)
    # None: decode and augment in the workers; 'cuda': workers read bytes, the step's device decodes and
    # augments (config augment.device; on a CPU-only machine only tests build it, on the CPU device)
    augment_device: Optional[str] = None
    # the GPU pipeline only (augment_device 'cuda'): decode and augment in a producer thread on a stream of its
    # own, beside the step (True), or on the step's stream before it (False); and which JPEG decoder runs
    augment_overlap: Optional[bool] = None
    step_first: Optional[bool] = None  # overlapped with the step's stream at high priority (augment.overlap)
    staged: Optional[bool] = None  # overlapped, decode and augment in threads of their own (augment.overlap)
    gpu_decoder: Optional[str] = None
    action: Optional[str] = None  # an action trial: which variant ran against this baseline (trials.variants)

    @property
    def trial_id(self) -> str:
        cache_state = None if self.cache_state == "n/a" else self.cache_state  # no '/' inside a part
        parts = [
            self.kind,
            self.model,
            self.precision,
            self.preset,
            # a step's own trial (no preset in its id) is planned once per input its presets hand it: the uint8 and
            # the float32 step of one model would share an id (two presets, one of them without Normalize)
            "uint8" if self.preset is None and self.input_dtype == "uint8" else None,
            self._gpu_part(),
            self.source,
            cache_state,
            f"bs{self.batch_size}",
            None if self.num_workers is None else f"w{self.num_workers}",
            self.action,
        ]
        if self.stage_timing is False:
            parts.append("untimed")
        if self.gpus > 1:
            parts.append(f"g{self.gpus}" + ("-p2p-off" if self.p2p is False else ""))
        return "/".join(str(p) for p in parts if p is not None)

    def _gpu_part(self) -> Optional[str]:
        """'gpu-augment' for the GPU pipeline as it runs by default (overlapped, nvJPEG), its other settings
        appended: 'gpu-augment-serial', 'gpu-augment-stepfirst', 'gpu-augment-staged', 'gpu-augment-nvimgcodec'."""
        if self.augment_device in (None, "cpu"):
            return None
        cols = {"augment_overlap": self.augment_overlap, "step_first": self.step_first, "staged": self.staged}
        extra = [OVERLAP_TAGS.get(overlap_mode(cols))]
        extra.append(self.gpu_decoder if self.gpu_decoder not in (None, DEFAULT_GPU_DECODER) else None)
        return "-".join(["gpu-augment", *filter(None, extra)])

    def columns(self) -> dict:
        return asdict(self) | {"trial_id": self.trial_id}


def spec_key(values: dict) -> tuple:
    """A trial's settings as a key that is equal for a spec's ``columns()`` and its row read back from
    trials.parquet (where a missing number is NaN and a whole number may come back as a float): a resumed
    run matches its earlier rows to the trials it plans by it. Every field counts (``trial_id`` omits mode)."""
    return tuple(_plain(values.get(f.name)) for f in fields(TrialSpec))


def _plain(v):
    if hasattr(v, "item"):  # a numpy scalar from a DataFrame row
        v = v.item()
    if v is None or (isinstance(v, float) and math.isnan(v)):
        return None
    if isinstance(v, bool) or not isinstance(v, (int, float)):
        return v
    return float(v)


@dataclass
class TrialContext:
    """What every trial of a sweep shares: device, data, policies, monitor, the step's threads."""

    device: torch.device
    source: Any  # a pipeprof Source, or None when the user passed their own Dataset
    measure: Any  # config.MeasureConfig
    monitor: Any  # monitors.Monitor
    user_dataset: Any = None
    # fn(num_workers) -> the user's own DataLoader (any iterable of batches): it replaces pipeprof's
    # loader, sampler and worker policy in cpu_pipeline and end_to_end trials
    user_loader: Optional[Callable[[int], Any]] = None
    stage_timing: bool = True
    prefetch_factor: int = 2
    num_classes: int = 1000
    loss_fn: Any = None  # fn(raw model output, labels) -> scalar tensor; None: cross-entropy (see step.Step)
    channels_last: bool = False
    cudnn_benchmark: Optional[bool] = None  # None: step.configure_precision decides per precision
    seed: int = 0
    sample_policy: SamplePolicy = SamplePolicy()  # bad samples and outsize images (config data.on_bad_sample ...)
    cores: int = 1  # usable cores of the run (affinity and cgroup aware)
    step_threads: Optional[int] = None  # model.threads: the CPU step's threads; None: confounders.step_threads
    # a trial whose workers read bytes: device time queued before each batch's decode, standing in for a step of
    # that length (``device_side.StandIn``); 0 outside the GPU pipeline's prediction (``orchestrate.action_trials``)
    stand_in_step_s: float = 0.0
    models: dict = field(default_factory=dict)  # name -> factory, for nn.Modules passed to profile()
    sources: dict = field(default_factory=dict)  # source label -> Source, built once per sweep
    source_info: dict = field(default_factory=dict)  # source label -> columns every trial on it carries
    # N-GPU trials: the run's settings a torchrun job rebuilds this context from (config dump,
    # dataset folder, the CPUs to split), and inside a rank: DDP on, the clock every rank reads
    job: Optional[dict] = None
    ddp: Optional[tuple[int, int]] = None  # (rank, world size) inside a rank: DDP model, sharded samples
    clock: Callable[[], float] = time.perf_counter
    engine: str = "dataloader"  # config data.engine: 'ray' runs the loader kinds on Ray Data (trials.ray_trials)

    @classmethod
    def from_config(cls, cfg, device: torch.device, monitor, sources: dict, cores: int, **extra) -> "TrialContext":
        """The context of a resolved ``config.RunConfig``: its policies, the sources built from it."""
        from pipeprof.data.prepare import source_info

        return cls(
            device,
            next(iter(sources.values()), None),
            cfg.measure,
            monitor,
            stage_timing=cfg.stage_timing,
            prefetch_factor=cfg.loader.prefetch_factor,
            num_classes=cfg.model.num_classes,
            channels_last=cfg.model.channels_last,
            cudnn_benchmark=cfg.model.cudnn_benchmark,
            seed=cfg.data.seed,
            cores=cores,
            sample_policy=SamplePolicy.of(cfg.data),
            step_threads=cfg.model.threads,
            engine=cfg.data.engine,
            sources=sources,
            source_info=source_info(cfg, sources) if sources else {},
            **extra,
        )

    def source_for(self, spec: "TrialSpec"):
        """The Source a trial reads: the one its label names, else the sweep's only source."""
        return self.sources.get(spec.source, self.source) if spec.source is not None else self.source
