"""Typed experiment configuration: validated once, at the edge, with clear errors.

A config is a YAML file (see ``configs/``) whose sections mirror the classes below.
Sweep axes are the fields typed as lists (models, precisions, presets, batch sizes,
worker counts, sources): the sweep runs their product. ``None`` means "pick for
this machine" and is resolved by :func:`resolve` so that run.json records what
was actually used.
"""
from __future__ import annotations

from pathlib import Path
from typing import Any, Literal, Optional

import yaml
from pydantic import BaseModel, ConfigDict, Field, NonNegativeInt, PositiveInt, ValidationError, field_validator

Precision = Literal["fp32", "tf32", "fp16", "bf16"]
TrialKind = Literal["end_to_end", "gpu_ceiling", "cpu_pipeline", "storage_fetch"]
TRIAL_KINDS: tuple[str, ...] = ("end_to_end", "gpu_ceiling", "cpu_pipeline", "storage_fetch")


class ConfigError(ValueError):
    """A config that cannot run; the message names the field and what is allowed."""


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", validate_assignment=True)


def _listify(v: Any) -> Any:
    return v if v is None or isinstance(v, list) else [v]


class DataConfig(_Strict):
    kind: Literal["synthetic", "folder", "factory"] = "synthetic"
    path: Optional[str] = None  # folder (ImageFolder layout) for kind=folder
    factory: Optional[str] = None  # 'package.module:function' -> map-style Dataset
    images: PositiveInt = 512  # synthetic dataset size
    classes: PositiveInt = 10
    seed: int = 0
    cache_dir: str = "out/datasets"
    decoder: Literal["pil", "cv2"] = "pil"

    @field_validator("factory")
    @classmethod
    def _factory_path(cls, v):
        if v is not None and ":" not in v:
            raise ValueError(f"expected 'package.module:function', got {v!r}")
        return v


class AugmentConfig(_Strict):
    preset: list[str] = ["standard"]  # names in augmentations/ or paths to YAML files
    _as_list = field_validator("preset", mode="before")(classmethod(lambda cls, v: _listify(v)))

    @field_validator("preset")
    @classmethod
    def _known_presets(cls, v):
        from .augment import preset_path  # deferred: augment imports albumentations

        for name in v:
            preset_path(name)  # raises ValueError naming the available presets
        return v


class LoaderConfig(_Strict):
    num_workers: Optional[list[NonNegativeInt]] = None  # None: 0,1,2,4,... up to usable cores
    batch_size: Optional[list[PositiveInt]] = None  # None: 256 on GPU, 16 on CPU
    pin_memory: Optional[bool] = None  # None: on when the device is CUDA
    prefetch_factor: PositiveInt = 2
    _as_list = field_validator("num_workers", "batch_size", mode="before")(classmethod(lambda cls, v: _listify(v)))


class ModelConfig(_Strict):
    name: Optional[list[str]] = None  # None: resnet50 on GPU, mobilenet_v3_small on CPU
    mode: Literal["train", "inference"] = "train"
    precision: Optional[list[Precision]] = None  # None: bf16 if supported, else fp16 (GPU); fp32 (CPU)
    channels_last: Optional[bool] = None  # None: on for CUDA
    num_classes: PositiveInt = 1000
    _as_list = field_validator("name", "precision", mode="before")(classmethod(lambda cls, v: _listify(v)))

    @field_validator("name")
    @classmethod
    def _known_models(cls, v):
        from .models import TORCHVISION, is_known

        for name in v or []:
            if not is_known(name):
                raise ValueError(
                    f"unknown model {name!r}; allowed: {', '.join(sorted(TORCHVISION))}, "
                    "'timm:NAME' or 'package.module:function'")
        return v


class MeasureConfig(_Strict):
    """Steady-state policy: what is excluded before the clock starts and how long windows are."""

    warmup_batches: NonNegativeInt = 10  # the trial adds the loader's prefetch depth to this
    warmup_s: float = Field(1.0, ge=0)
    window_s: float = Field(1.0, gt=0)
    window_batches: PositiveInt = 5
    windows: int = Field(5, ge=2)
    max_trial_s: float = Field(120.0, gt=0)
    cv_unstable: float = Field(0.05, gt=0)


class RunConfig(_Strict):
    name: str = "run"
    device: Literal["auto", "cpu", "cuda"] = "auto"
    out_dir: str = "out"
    trials: list[TrialKind] = list(TRIAL_KINDS)
    monitor_hz: float = Field(10.0, gt=0, le=100)
    stage_timing: bool = True  # per-transform timing inside workers
    data: DataConfig = DataConfig()
    augment: AugmentConfig = AugmentConfig()
    loader: LoaderConfig = LoaderConfig()
    model: ModelConfig = ModelConfig()
    measure: MeasureConfig = MeasureConfig()


def _format_errors(exc: ValidationError, origin: str) -> str:
    lines = [f"invalid config ({origin}):"]
    for err in exc.errors():
        field = ".".join(str(p) for p in err["loc"]) or "(top level)"
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


def resolve(cfg: RunConfig, cuda: bool, bf16_ok: bool, usable_cores: int) -> RunConfig:
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
    if c.loader.batch_size is None:
        c.loader.batch_size = [256] if gpu else [16]
    if c.loader.num_workers is None:
        c.loader.num_workers = default_workers(usable_cores)
    if c.loader.pin_memory is None:
        c.loader.pin_memory = gpu
    return c
