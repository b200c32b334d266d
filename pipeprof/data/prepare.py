"""From the data section of a config to the sources a sweep reads: the dataset folder (made or
reused), packed shards (cached while the folder is unchanged), every source of ``data.source``
opened once, and the storage facts run.json records.

To add a source: a class in ``data/sources/`` registered in its ``REGISTRY`` table, a spec class
in ``config`` (its ``kind``), and one entry in :data:`OPENERS`.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Callable, Optional

from pipeprof.config import ConfigError, RunConfig

from . import cache
from .sources import source_class


def dataset_folder(cfg: RunConfig, log: Callable[[str], None]) -> tuple[Optional[str], dict]:
    """(folder or file list, dataset facts) of the data section; None for a factory dataset."""
    data = cfg.data
    if data.kind == "factory":
        return None, {"kind": "factory", "factory": data.factory}
    if data.kind == "folder":
        if not data.path:
            raise ConfigError("data.path: required when data.kind is 'folder'")
        facts = {"kind": "folder", "path": data.path}
        return data.path, facts | ({"check": preflight(data, log)} if data.check_files else {})
    from .synthetic import cached_dataset

    log(f"synthetic dataset: {data.images} images, {data.classes} classes (cached under {data.cache_dir})")
    path, stats = cached_dataset(data.cache_dir, data.images, data.classes, data.seed)
    return str(path), {"kind": "synthetic", **stats.to_dict()}


def preflight(data, log: Callable[[str], None], shown: int = 20) -> dict:
    """Scan up to ``data.check_files`` files of the folder before anything is measured, log what was
    found, and return it for run.json. Under ``on_bad_sample: fail`` an unreadable file is a ConfigError:
    every trial reading it would fail."""
    from .check import check_paths, dataset_paths

    try:
        paths = dataset_paths(data.path)
    except OSError as exc:  # SourceError: a missing or empty folder, a bad file list
        raise ConfigError(f"data.path: {exc}") from None
    found = check_paths(paths, data.check_files, data.max_pixels)
    lines = found.lines()
    for line in lines[: shown + 1]:
        log(line)
    if len(lines) > shown + 1:
        log(f"  ... and {len(lines) - shown - 1} more (pipeprof check-data {data.path} lists them all)")
    if found.unreadable and data.on_bad_sample == "fail":
        path, why = found.unreadable[0]
        raise ConfigError(
            f"data.on_bad_sample is 'fail' and {len(found.unreadable)} of the {found.checked} files "
            f"checked cannot be read, first {path}: {why}"
        )
    return found.summary()


PACK_MARKER = ".pipeprof-pack.json"


def auto_shard_size_mb(total_bytes: int) -> float:
    """~8 shards for a small dataset, 100 MB shards (a common WebDataset size) for a large one."""
    return min(100.0, max(float(f"{total_bytes / 8 / 1e6:.2g}"), 0.1))


def packed_shards(
    folder: str, cache_dir: str, shard_size_mb: Optional[float], seed: int, log: Callable[[str], None]
) -> Path:
    """Tar shards of ``folder`` under ``cache_dir/shards/``, packed once and reused while the folder is unchanged."""
    from pipeprof.data.sources.shards import pack_folder

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


#: source kind -> how to open it from its spec: (spec, dataset folder, opener of an inner spec, config, log).
#: Adding a source: its class in ``sources.REGISTRY``, its spec in ``config``, and one entry here.
OPENERS: dict[str, Callable] = {
    "files": lambda spec, folder, inner, cfg, log: source_class("files")(_path(spec, folder, cfg)),
    # refuses a dataset larger than half the available RAM
    "memory": lambda spec, folder, inner, cfg, log: source_class("memory")(
        source_class("files")(_path(spec, folder, cfg))
    ),
    "shards": lambda spec, folder, inner, cfg, log: source_class("shards")(
        spec.path
        or packed_shards(_path(spec, folder, cfg), cfg.data.cache_dir, spec.shard_size_mb, cfg.data.seed, log),
        reader=spec.reader,
    ),
    "url": lambda spec, folder, inner, cfg, log: source_class("url")(
        spec.base_url, spec.index, spec.timeout_s, spec.retries
    ),
    "throttled": lambda spec, folder, inner, cfg, log: source_class("throttled")(
        inner(spec.inner), spec.mb_s, spec.latency_ms, spec.reads_s
    ),
}


def _path(spec, folder: Optional[str], cfg: RunConfig) -> str:
    path = getattr(spec, "path", None) or folder
    if path is None:
        raise ConfigError(f"data.source: {spec.label} needs a path (data.kind is {cfg.data.kind})")
    return path


def build_sources(cfg: RunConfig, folder: Optional[str], log: Callable[[str], None]) -> dict:
    """label -> Source for every spec of ``data.source``, built once per sweep.

    A source that cannot be opened (missing folder, no shards, a URL that refuses or
    answers 404) is bad input: ConfigError naming it, before any trial runs.
    """
    made: dict = {}  # every source made, inner ones too: a throttle over a swept source shares its object

    def build(spec):
        key = json.dumps(spec.model_dump(), sort_keys=True)
        if key not in made:
            made[key] = OPENERS[spec.kind](spec, folder, build, cfg, log)
        return made[key]

    built = {}
    for spec in cfg.data.source:
        try:
            built[spec.label] = build(spec)
        except ConfigError:
            raise
        except (OSError, ValueError) as exc:  # SourceError is an OSError
            raise ConfigError(f"data.source: {spec.label}: {exc}") from None
    _check_cold_system(cfg)
    return built


def _check_cold_system(cfg: RunConfig) -> None:
    if "cold-system" in cfg.data.cache and any(s.file_backed for s in cfg.data.source):
        ok, why = cache.can_drop_all_caches()
        if not ok:
            raise ConfigError(
                f"data.cache: 'cold-system' drops the whole machine's page cache and cannot here: "
                f"{why}; 'cold' evicts just the dataset's files, without root"
            )


def source_info(cfg: RunConfig, sources: dict) -> dict:
    """label -> the columns every trial on that source carries."""
    return {
        spec.label: {
            "emulated": bool(sources[spec.label].emulated),
            "source_kind": spec.base_kind,
            "throttle": spec.throttle,
        }
        for spec in cfg.data.source
    }


def storage_facts(cfg: RunConfig, sources: dict) -> dict:
    """Dataset size against RAM, and each source as it describes itself (incl. ``emulated``)."""
    if not sources:
        return {}
    ref = next((s for s in sources.values() if s.kind == "files"), None) or next(iter(sources.values()))
    total = ref.total_bytes()
    return {
        "sources": {label: s.describe() for label, s in sources.items()},
        "dataset_samples": len(ref),
        "dataset_total_mb": total / 1e6,
        "fits_in_page_cache": cache.fits_in_page_cache(total),
        "cache_states": list(cfg.data.cache),
    }
