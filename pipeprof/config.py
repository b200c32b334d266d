"""Typed experiment configuration: validated once, at the edge, with clear errors.

A config is a YAML file (see ``configs/``) whose sections mirror the classes below.
Sweep axes are the fields typed as lists (models, precisions, presets, batch sizes,
worker counts, sources): the sweep runs their product. ``None`` means "pick for
this machine" and is resolved by :func:`resolve` so that run.json records what
was actually used.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Annotated, Any, Literal, Optional, TypeVar, Union

import yaml
from pydantic import (
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    NonNegativeFloat,
    NonNegativeInt,
    PositiveFloat,
    PositiveInt,
    ValidationError,
    ValidationInfo,
    field_validator,
    model_validator,
)

from .actions import TRIED
from .schema import DEFAULT_GPU_DECODER, DEFAULT_TRIALS, GPU_DECODERS, TRIAL_KINDS

Precision = Literal["fp32", "tf32", "fp16", "bf16"]
TrialKindName = Literal[TRIAL_KINDS]  # the values of schema.TrialKind
ActionId = Literal[TRIED]  # the actions an action trial can try (pipeprof.actions)


class ConfigError(ValueError):
    """A config that cannot run; the message names the field and what is allowed."""


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", validate_assignment=True)


def _importable(path: str) -> str:
    """``path`` if it names a callable that imports; else ValueError saying why. Import paths are checked
    here, at validation, so a typo fails before any run; importing runs the user's module, by design."""
    from .models import load_callable

    if ":" not in path:
        raise ValueError(f"expected 'package.module:function', got {path!r}")
    load_callable(path)
    return path


def _listify(v: Any) -> Any:
    return v if v is None or isinstance(v, list) else [v]


T = TypeVar("T")
#: A sweep axis: a list of values, or one value meaning a list of one.
Axis = Annotated[list[T], BeforeValidator(_listify)]


# ---- storage sources and cache states ---------------------------------------------
#
# ``data.source`` is a sweep axis of source specs: a name (``files``, ``memory``,
# ``shards``, ``url``) or a mapping for parametrised ones, e.g.
# ``{kind: throttled, inner: files, mb_s: 20, latency_ms: 5}``. Each spec has a short
# stable ``label`` (``files``, ``throttled-files-20MBps-5ms``) that names it in
# ``TrialSpec.source`` and the trial ids. ``data.cache`` is the page-cache axis; it
# applies to file-backed sources only (files, shards, a throttle over either).

SOURCE_KINDS: tuple[str, ...] = ("files", "memory", "shards", "url", "throttled")
CACHE_STATES: tuple[str, ...] = ("warm", "cold", "cold-system")
CacheState = Literal["warm", "cold", "cold-system"]
_LABEL_OK = re.compile(r"^[A-Za-z0-9._-]+$")


def _num(x: float) -> str:
    return f"{x:g}"


def _as_spec(v: Any) -> Any:
    """A bare name is a spec of that kind with its defaults; a mapping must say its kind."""
    if isinstance(v, str):
        return {"kind": v}
    if isinstance(v, dict) and "kind" not in v:
        raise ValueError(f"a source mapping needs 'kind': one of {', '.join(SOURCE_KINDS)}")
    return v


class _SourceSpec(_Strict):
    # None: filled at validation with the automatic label, so run.json records the one used
    label: Optional[str] = None

    @field_validator("label")
    @classmethod
    def _label_chars(cls, v):
        if v is not None and not _LABEL_OK.match(v):
            raise ValueError(f"label {v!r}: use letters, digits, '.', '_' or '-' (it becomes part of trial ids)")
        return v

    @model_validator(mode="after")
    def _fill_label(self):
        if self.label is None:
            self.__dict__["label"] = self._auto_label()  # not setattr: that would re-run validation
        return self

    def _auto_label(self) -> str:
        return self.kind

    @property
    def file_backed(self) -> bool:
        """Reads local files whose page-cache state can be set (the cache axis applies)."""
        return False

    @property
    def base_kind(self) -> str:
        """The storage layout under any throttle: files, memory, shards or url."""
        return self.kind

    @property
    def throttle(self) -> Optional[str]:
        """The emulated caps as text (``20MBps-5ms``), or None for native storage."""
        return None


def _path_label(kind: str, path: Optional[str]) -> str:
    if path is None:
        return kind
    name = re.sub(r"[^A-Za-z0-9._-]", "_", Path(path).name or "root")
    return f"{kind}-{name}"


class FilesSpec(_SourceSpec):
    kind: Literal["files"]
    path: Optional[str] = None  # folder (ImageFolder) or file list; None: the data section's dataset

    def _auto_label(self) -> str:
        return _path_label("files", self.path)

    @property
    def file_backed(self) -> bool:
        return True


class MemorySpec(_SourceSpec):
    kind: Literal["memory"]
    path: Optional[str] = None  # what to load into RAM (folder or file list); None: the dataset

    def _auto_label(self) -> str:
        return _path_label("memory", self.path)


class ShardsSpec(_SourceSpec):
    kind: Literal["shards"]
    path: Optional[str] = None  # folder, glob or brace range of .tar shards; None: pack the dataset
    shard_size_mb: Optional[PositiveFloat] = None  # automatic packing; None: ~8 shards, at most 100 MB each
    # pipeprof: one pread per sample at its indexed offset; webdataset: the webdataset library's own
    # sequential tar iteration, per worker and shard (label suffix '-webdataset', so both can be swept)
    reader: Literal["pipeprof", "webdataset"] = "pipeprof"

    @model_validator(mode="after")
    def _size_only_when_packing(self):
        if self.path is not None and self.shard_size_mb is not None:
            raise ValueError(
                "shard_size_mb applies when pipeprof packs the dataset itself (no path); "
                "existing shards keep their size"
            )
        return self

    def _auto_label(self) -> str:
        if self.shard_size_mb is not None:
            label = f"shards-{_num(self.shard_size_mb)}MB"
        else:
            label = _path_label("shards", self.path)
        return label if self.reader == "pipeprof" else f"{label}-{self.reader}"

    @property
    def file_backed(self) -> bool:
        return True


class UrlSpec(_SourceSpec):
    kind: Literal["url"]
    base_url: str  # http://, https://, s3:// ... (fsspec); the server holds index.txt unless ``index`` says
    index: Optional[str] = None
    timeout_s: PositiveFloat = 10.0
    retries: NonNegativeInt = 2

    @field_validator("base_url")
    @classmethod
    def _scheme(cls, v):
        if "://" not in v:
            raise ValueError(f"expected a URL such as http://host:port/path or s3://bucket/prefix, got {v!r}")
        return v


_PlainSpec = Annotated[Union[FilesSpec, MemorySpec, ShardsSpec, UrlSpec], Field(discriminator="kind")]


class ThrottledSpec(_SourceSpec):
    """Any plain source behind emulated caps: bandwidth (MB/s), per-read latency (ms), reads/s."""

    kind: Literal["throttled"]
    inner: _PlainSpec = FilesSpec(kind="files")
    mb_s: Optional[PositiveFloat] = None
    latency_ms: NonNegativeFloat = 0.0
    reads_s: Optional[PositiveFloat] = None

    @field_validator("inner", mode="before")
    @classmethod
    def _inner_spec(cls, v):
        v = _as_spec(v)
        if isinstance(v, dict) and v.get("kind") == "throttled":
            raise ValueError("a throttle wraps a plain source (files, memory, shards, url), not another throttle")
        return v

    @model_validator(mode="after")
    def _some_cap(self):
        if self.mb_s is None and self.reads_s is None and not self.latency_ms:
            raise ValueError("throttled needs at least one of mb_s, latency_ms, reads_s")
        return self

    @property
    def throttle(self) -> str:
        parts = [
            f"{_num(self.mb_s)}MBps" if self.mb_s is not None else None,
            f"{_num(self.latency_ms)}ms" if self.latency_ms else None,
            f"{_num(self.reads_s)}rps" if self.reads_s is not None else None,
        ]
        return "-".join(p for p in parts if p)

    def _auto_label(self) -> str:
        return f"throttled-{self.inner.label}-{self.throttle}"

    @property
    def file_backed(self) -> bool:
        return self.inner.file_backed

    @property
    def base_kind(self) -> str:
        return self.inner.kind


SourceSpec = Annotated[Union[FilesSpec, MemorySpec, ShardsSpec, UrlSpec, ThrottledSpec], Field(discriminator="kind")]


class DataConfig(_Strict):
    kind: Literal["synthetic", "folder", "factory", "loader"] = "synthetic"
    path: Optional[str] = None  # folder (ImageFolder layout) for kind=folder
    # 'package.module:function': kind=factory: fn() -> map-style Dataset; kind=loader: fn(num_workers) -> DataLoader.
    # Validated even when absent (validate_default), so a missing one is reported as data.factory.
    factory: Optional[str] = Field(None, validate_default=True)
    images: PositiveInt = 512  # synthetic dataset size
    classes: PositiveInt = 10
    seed: int = 0
    cache_dir: str = "out/datasets"
    decoder: Literal["pil", "cv2"] = "pil"
    # what runs the pipeline: torch's DataLoader, or Ray Data's CPU actors (the extra pipeprof[ray]; docs/ray.md),
    # where loader.num_workers counts the Ray Data CPU limit
    engine: Literal["dataloader", "ray"] = "dataloader"
    source: list[SourceSpec] = [FilesSpec(kind="files")]  # sweep axis: where the samples' bytes come from
    cache: Axis[CacheState] = ["warm"]  # sweep axis: page-cache state before each trial (file-backed sources)
    # a sample that cannot be read or decoded: skip (the next index stands in, counted per trial) or fail the trial
    on_bad_sample: Literal["skip", "fail"] = "skip"
    max_bad_frac: float = Field(0.01, ge=0, le=1)  # a trial skipping more than this share of its samples fails
    max_pixels: PositiveInt = 50_000_000  # larger images are reported per trial as outliers, with their cost share
    check_files: NonNegativeInt = 2000  # pre-flight header check of a folder dataset on up to this many files; 0: off

    @field_validator("source", mode="before")
    @classmethod
    def _source_specs(cls, v):
        v = _listify(v)
        return [_as_spec(x) for x in v] if isinstance(v, list) else v

    @field_validator("source")
    @classmethod
    def _unique_labels(cls, v):
        if not v:
            raise ValueError(f"at least one source; allowed kinds: {', '.join(SOURCE_KINDS)}")
        labels = [s.label for s in v]
        dup = sorted({x for x in labels if labels.count(x) > 1})
        if dup:
            raise ValueError(f"two sources share the label {dup[0]!r}: give one a 'label'")
        return v

    @field_validator("cache")
    @classmethod
    def _cache_states(cls, v):
        if not v:
            raise ValueError(f"at least one cache state; allowed: {', '.join(CACHE_STATES)}")
        return list(dict.fromkeys(v))

    @model_validator(mode="after")
    def _storage_needs_pipeline(self):
        if self.kind in ("factory", "loader") and self.storage_swept:
            raise ValueError(
                f"source/cache: storage axes need pipeprof's own pipeline (data.kind synthetic or "
                f"folder); a {self.kind} hides its storage"
            )
        return self

    @property
    def storage_swept(self) -> bool:
        """True when the config asks for more than the default (files, warm)."""
        return [s.label for s in self.source] != ["files"] or list(self.cache) != ["warm"]

    @field_validator("factory")
    @classmethod
    def _factory_path(cls, v, info: ValidationInfo):
        if v is None and info.data.get("kind") == "loader":
            raise ValueError(
                "required with kind 'loader': 'package.module:function', a function(num_workers) returning a DataLoader"
            )
        if v is None and info.data.get("kind") == "factory":
            raise ValueError(
                "required with kind 'factory': 'package.module:function', a function() returning a map-style Dataset"
            )
        return v if v is None else _importable(v)


class AugmentConfig(_Strict):
    preset: Axis[str] = ["standard"]  # names in augmentations/ or paths to YAML files
    # sweep axis: where decode and augmentation run. cpu: in the DataLoader's workers (albumentations);
    # cuda: the workers read bytes and the training process decodes (nvJPEG) and augments
    # (torchvision.transforms.v2) each batch on the GPU before the step (data/gpu_augment.py)
    device: Axis[Literal["cpu", "cuda"]] = ["cpu"]
    # the GPU pipeline only (device cuda). overlap, sweep axis: on, a producer thread decodes and augments the
    # next batches on a stream of its own beside the step; step-first, the same with the step's stream at the
    # device's highest priority, so the pipeline's kernels take what the step leaves of the SMs; staged, as on
    # with decode and augment in two threads of their own (a batch's cycle the longer of the two, not their sum);
    # off, the training thread does it before each step (trials/device_side.py). gpu_decoder, sweep axis: nvjpeg
    # (torchvision), torchcodec, nvimgcodec (the GPU's hardware JPEG engines); one that cannot run here fails its
    # trials with the reason (data/gpu_decode.py)
    overlap: Axis[Literal["on", "off", "step-first", "staged"]] = ["on"]
    gpu_decoder: Axis[Literal[GPU_DECODERS]] = [DEFAULT_GPU_DECODER]

    @field_validator("overlap", mode="before")
    @classmethod
    def _on_off(cls, v):
        """YAML 1.1 reads a bare on/off as a boolean: take it as the word it was."""
        items = v if isinstance(v, list) else [v]
        return [{True: "on", False: "off"}.get(x, x) if isinstance(x, bool) else x for x in items]

    @field_validator("device", "overlap", "gpu_decoder")
    @classmethod
    def _devices(cls, v, info):
        if not v:
            allowed = {
                "device": "cpu, cuda",
                "overlap": "on, off, step-first, staged",
                "gpu_decoder": "nvjpeg, torchcodec, nvimgcodec",
            }
            raise ValueError(f"at least one of: {allowed[info.field_name]}")
        return list(dict.fromkeys(v))

    @field_validator("preset")
    @classmethod
    def _known_presets(cls, v):
        from .presets import preset_path

        for name in v:
            preset_path(name)  # raises ValueError naming the available presets
        return v


class LoaderConfig(_Strict):
    num_workers: Optional[Axis[NonNegativeInt]] = None  # None: 0,1,2,4,... up to usable cores
    # None: 256 on GPU, 16 on CPU; auto: the largest that fits on the GPU (runner: batchsize), 16 on CPU
    batch_size: Union[Literal["auto"], Optional[Axis[PositiveInt]]] = None
    pin_memory: Optional[bool] = None  # None: on when the device is CUDA
    prefetch_factor: PositiveInt = 2


class ModelConfig(_Strict):
    name: Optional[Axis[str]] = None  # None: resnet50 on GPU, mobilenet_v3_small on CPU
    mode: Axis[Literal["train", "inference"]] = ["train"]  # sweep axis: a training step, or forward only
    precision: Optional[Axis[Precision]] = None  # None: bf16 if supported, else fp16 (GPU); fp32 (CPU)
    channels_last: Optional[bool] = None  # None: on for CUDA
    cudnn_benchmark: Optional[bool] = None  # None: on, except in true fp32 (see step.configure_precision)
    num_classes: PositiveInt = 1000
    threads: Optional[PositiveInt] = None  # CPU device: the step's intra-op threads; None: cores left by the workers
    loss: Optional[str] = None  # 'package.module:function': fn(raw output, labels) -> scalar; None: cross-entropy

    @field_validator("name")
    @classmethod
    def _known_models(cls, v):
        from .models import TORCHVISION, is_import_path, is_known

        for name in v or []:
            if not is_known(name):
                raise ValueError(
                    f"unknown model {name!r}; allowed: {', '.join(sorted(TORCHVISION))}, "
                    "'timm:NAME' or 'package.module:function'"
                )
            if is_import_path(name):
                _importable(name)
        return v

    @field_validator("loss")
    @classmethod
    def _loss_path(cls, v):
        return v if v is None else _importable(v)


class MeasureConfig(_Strict):
    """Steady-state policy: what is excluded before the clock starts and how long windows are."""

    warmup_batches: NonNegativeInt = 2  # margin: the trial adds the loader's prefetch depth to this
    warmup_s: float = Field(0.0, ge=0)  # the least warm-up time; it then ends when the rate settles
    warmup_max_s: float = Field(15.0, ge=0)  # the most (also at most half of max_trial_s); 0: no settling
    # settled: two warm-up chunks (half a window each) within this share; window-to-window noise on a shared
    # machine comes close to it (docs/measured.md), so a tighter figure mistakes noise for a transient and keeps
    # warming up
    settle_tol: float = Field(0.15, gt=0)
    window_s: float = Field(0.75, gt=0)  # windows are set by time (whole worker rounds), not batch counts
    window_batches: PositiveInt = 1  # and hold at least this many batches
    windows: int = Field(3, ge=2)  # planned windows; more are added while the interval is too wide
    max_windows: int = Field(6, ge=2)  # at most this many windows (and max_trial_s) per trial
    max_trial_s: float = Field(120.0, gt=0)
    ci_target: float = Field(0.05, gt=0)  # unstable when the 95% interval is wider than ± this share of the median
    cpu_reference_s: float = Field(1.0, ge=0)  # fixed-work CPU probe at run start and end (see reference); 0: off
    redraws: int = Field(60, ge=0)  # re-draws of each trial's windows for the answer's confidence; 0: not computed
    # action trials (trials/action_trial.py): a gain is a ratio of two windows, so each pair's noise is two
    # windows' worth and the switch between two running loaders is drained untimed; windows of several
    # worker rounds average the rounds' phase, and pairs are added until the gain's 95% interval is within
    # ± ci_target of the rate (t95 of 2 pairs is 12.7: a fixed 2 pairs of short windows gave intervals of tens of
    # percent, docs/measured.md)
    action_window_s: Optional[float] = Field(None, gt=0)  # None: 4 × window_s (3 s at the default)
    action_pairs: int = Field(4, ge=2)  # planned pairs
    action_max_pairs: int = Field(10, ge=2)  # at most (and max_trial_s)
    # all action trials together, after the answer: the two largest predicted gains first (of one group in one
    # rotation that may take all of it; of two groups the first half, the second what is left); what it leaves
    # out is listed as not tried with this reason. This much holds the two largest gains' trials of a few pairs
    # each in a default run of under 5 minutes (docs/measured.md, "Action-trial timing and budgets")
    actions_max_s: float = Field(120.0, gt=0)
    # and no action trial past this many seconds into the run (from its start, after the data is made or
    # found): a default run within 5 minutes. The command's start and the data check come before the run's
    # clock, and the last window's end, the analysis and the report after the budget, so the cap sits half a
    # minute under 300 s, with max_trial_s counting an action trial's start (its loaders') too (docs/measured.md,
    # "Action-trial timing and budgets"). None: no limit
    run_max_s: Optional[float] = Field(270.0, gt=0)
    # the adaptive search's fine end: no bisection step starts that would end past this many seconds into the
    # run (per group searched: the k-th group, k times it); the bound, the knee and the probe just below the
    # top are always measured. A bisection step (the loader alone and end to end at a count) can take most of a
    # minute, and a search that bisected on answered markedly later (docs/measured.md, "Default runs"). None: no
    # limit
    answer_max_s: Optional[float] = Field(150.0, gt=0)


class DistributedConfig(_Strict):
    """Trials on several GPUs (or CPU processes): N processes started by torchrun, DDP, one GPU each."""

    # sweep axis: GPUs (processes) per trial; 'all': 1, 2, 4, ... up to the GPUs of the machine(s)
    gpus: Union[Literal["all"], Axis[PositiveInt]] = [1]
    p2p: Axis[Literal["on", "off"]] = ["on"]  # sweep axis for N > 1: off sets NCCL_P2P_DISABLE=1
    nnodes: PositiveInt = 1  # machines in the job; each runs `pipeprof run` with its node_rank
    node_rank: NonNegativeInt = 0
    rdzv_endpoint: Optional[str] = None  # host:port of node 0's rendezvous (needed when nnodes > 1)

    @field_validator("p2p", mode="before")
    @classmethod
    def _yaml_on_off(cls, v):
        """YAML 1.1 reads a bare on/off as true/false: take those as meant."""
        as_list = v if isinstance(v, list) else [v]
        return [{True: "on", False: "off"}.get(x, x) if isinstance(x, bool) else x for x in as_list]

    @model_validator(mode="after")
    def _nodes(self):
        if self.nnodes > 1 and not self.rdzv_endpoint:
            raise ValueError("distributed.nnodes > 1 needs distributed.rdzv_endpoint (host:port of node 0)")
        if self.node_rank >= self.nnodes:
            raise ValueError(f"distributed.node_rank {self.node_rank} must be below nnodes {self.nnodes}")
        return self


class RunConfig(_Strict):
    name: str = "run"
    device: Literal["auto", "cpu", "cuda"] = "auto"
    out_dir: str = "out"
    trials: list[TrialKindName] = list(DEFAULT_TRIALS)
    monitor_hz: float = Field(10.0, gt=0, le=100)
    stage_timing: bool = True  # per-transform timing inside workers
    # also measure pipeprof's own cost: the monitor's sampling and the stage clocks, each by
    # alternating windows on one loader (two trials of about half a minute each on a GPU box)
    overhead_checks: bool = False
    # adaptive: search num_workers from the cheap trials (orchestrate/search.py); exhaustive: the whole grid
    sweep: Literal["adaptive", "exhaustive"] = "adaptive"
    # measure: when the answer binds on the input side, each action pipeprof can apply is tried against
    # the baseline after the answer (alternating windows, orchestrate/action_trials.py); predict: predictions only;
    # a list of action ids (e.g. [gpu_pipeline]): only those are tried, the others stay predictions
    actions: Union[Literal["measure", "predict"], list[ActionId]] = "measure"
    data: DataConfig = DataConfig()
    augment: AugmentConfig = AugmentConfig()
    loader: LoaderConfig = LoaderConfig()
    model: ModelConfig = ModelConfig()
    distributed: DistributedConfig = DistributedConfig()
    measure: MeasureConfig = MeasureConfig()

    @model_validator(mode="after")
    def _pairs_at_named_counts(self):
        # the adaptive search plans the kinds it searches with; the masked pairs are made at named counts
        if "cores_pair" in self.trials and self.loader.num_workers is None:
            raise ValueError(
                "trials: cores_pair masks the job to as many CPUs as workers at each count loader.num_workers "
                "names: give that list (e.g. [4, 8, 12, 16])"
            )
        return self

    @model_validator(mode="after")
    def _ray_engine(self):
        # Ray Data runs pipeprof's own pipeline on CPU actors, at the Ray Data CPU limits loader.num_workers names
        if self.data.engine != "ray":
            return self
        if self.data.kind not in ("synthetic", "folder") or self.augment.device != ["cpu"]:
            raise ValueError(
                "data.engine ray runs pipeprof's own CPU pipeline: data.kind synthetic or folder, augment.device cpu"
            )
        if not self.loader.num_workers or min(self.loader.num_workers) < 1 or self.sweep != "exhaustive":
            raise ValueError(
                "data.engine ray: loader.num_workers names the Ray Data CPU limits to measure, each 1 "
                "or more (e.g. [1, 2]), with sweep: exhaustive"
            )
        return self


def _format_errors(exc: ValidationError, origin: str) -> str:
    lines = [f"invalid config ({origin}):"]
    for err in exc.errors():
        # a union's branch shows in the location as its type ("literal['auto']", "function-after[...]"):
        # the user wrote the field, not the branch
        field = ".".join(str(p) for p in err["loc"] if not (isinstance(p, str) and "[" in p)) or "(top level)"
        msg = err["msg"].removeprefix("Value error, ")
        if err["type"] == "extra_forbidden":
            msg = "unknown key"
        lines.append(f"  {field}: {msg} (got {err.get('input')!r})")
    return "\n".join(lines)


def build(raw: dict, origin: str = "config") -> RunConfig:
    """Validate a plain dict into a RunConfig, or raise ConfigError naming each bad field."""
    try:
        return RunConfig.model_validate(raw or {})
    except ValidationError as exc:
        raise ConfigError(_format_errors(exc, origin)) from None


def apply_override(raw: dict, assignment: str) -> dict:
    """Apply one ``section.key=value`` (value parsed as YAML) to a raw config dict."""
    key, sep, value = assignment.partition("=")
    if not sep or not key.strip():
        raise ConfigError(f"--set expects section.key=value, got {assignment!r}")
    node = raw
    parts = key.strip().split(".")
    for part in parts[:-1]:
        node = node.setdefault(part, {})
        if not isinstance(node, dict):
            raise ConfigError(f"--set {key}: {part!r} is not a section")
    node[parts[-1]] = yaml.safe_load(value)
    return raw


def load(path: str | Path | None = None, overrides: list[str] = ()) -> RunConfig:
    """Load a YAML experiment file (or the defaults) and apply ``--set`` overrides."""
    raw: dict = {}
    if path is not None:
        path = Path(path)
        if not path.is_file():
            raise ConfigError(f"config file not found: {path}")
        try:
            raw = yaml.safe_load(path.read_text()) or {}
        except yaml.YAMLError as exc:
            raise ConfigError(f"{path}: not valid YAML: {exc}") from None
        if not isinstance(raw, dict):
            raise ConfigError(f"{path}: expected a mapping of sections, got {type(raw).__name__}")
    for assignment in overrides:
        apply_override(raw, assignment)
    return build(raw, origin=str(path) if path else "defaults")


def default_workers(usable_cores: int) -> list[int]:
    """0, 1, 2, 4, 8, ... up to the usable cores (and the core count itself)."""
    counts, n = [0, 1], 2
    while n < usable_cores:
        counts.append(n)
        n *= 2
    return sorted(set(counts + [max(usable_cores, 1)]))


CPU_BATCH = 16  # the batch on a CPU device, "auto" included: no device memory to fill there


def resolve(cfg: RunConfig, cuda: bool, bf16_ok: bool, usable_cores: int, gpu_count: int = 1) -> RunConfig:
    """Fill every machine-dependent ``None`` so the recorded config is what ran."""
    c = cfg.model_copy(deep=True)
    gpu = c.device == "cuda" or (c.device == "auto" and cuda)
    if c.device == "cuda" and not cuda:
        raise ConfigError("device: 'cuda' requested but torch sees no CUDA device")
    c.device = "cuda" if gpu else "cpu"
    if c.model.name is None:
        c.model.name = ["resnet50"] if gpu else ["mobilenet_v3_small"]
    if c.model.precision is None:
        c.model.precision = [("bf16" if bf16_ok else "fp16")] if gpu else ["fp32"]
    if not gpu and set(c.model.precision) - {"fp32", "bf16"}:
        raise ConfigError(f"model.precision: {c.model.precision} on CPU; allowed on CPU: fp32, bf16")
    if c.model.channels_last is None:
        c.model.channels_last = gpu
    if c.loader.batch_size is None or (c.loader.batch_size == "auto" and not gpu):
        c.loader.batch_size = [256] if gpu else [CPU_BATCH]  # on a GPU "auto" stays: the runner searches it
    if c.loader.num_workers is None:
        c.loader.num_workers = default_workers(usable_cores)
    if c.loader.pin_memory is None:
        c.loader.pin_memory = gpu
    if "cuda" in c.augment.device and not gpu:
        raise ConfigError(
            "augment.device: 'cuda' decodes and augments on the GPU, but this run has none "
            f"(device {c.device}); allowed here: cpu"
        )
    c.distributed.gpus = _gpu_counts(c.distributed, gpu_count if gpu else usable_cores, gpu)
    return c


def _gpu_counts(d: DistributedConfig, local: int, gpu: bool) -> list[int]:
    """The GPU (process) counts to run: 'all' is 1, 2, 4, ... up to every GPU of the job's machines.
    A count above what the machines have, or one the nodes cannot share evenly, is a ConfigError."""
    total = local * d.nnodes
    if d.gpus == "all":
        counts, n = [], 1
        while n < total:
            counts.append(n)
            n *= 2
        return sorted(set(counts + [max(total, 1)])) if gpu else [1]
    what = "GPUs" if gpu else "usable cores (CPU processes)"
    for n in d.gpus:
        if n > max(total, 1):
            raise ConfigError(f"distributed.gpus: {n} asked for, but the job has {total} {what}")
        if n > 1 and n % d.nnodes:
            raise ConfigError(f"distributed.gpus: {n} is not a multiple of distributed.nnodes ({d.nnodes})")
    return sorted(set(d.gpus))
