"""The machine as pipeprof sees it.

A profile is only interpretable next to the machine it was taken on: "8
workers were optimal" means little without knowing that the container was
allowed 8 CPUs (cgroup quota), not the 192 that ``os.cpu_count()`` reports.
This module collects that context.  Every function is best-effort: a missing
file, library or driver yields ``None`` (or ``[]``), never an exception, so a
snapshot can always be written next to the results.  Everything returned is
plain JSON (dict/list/str/int/float/bool/None).

Units: memory in GiB (``*_gb``) or MiB (``*_mb``), i.e. powers of two.
"""

from __future__ import annotations

import ast
import datetime as _dt
import importlib
import importlib.metadata
import importlib.util
import math
import os
import platform
import socket
import sys
import time
from pathlib import Path

import psutil

CGROUP_ROOT = Path("/sys/fs/cgroup")
_GIB = 2**30
_MIB = 2**20
# cgroup v1 reports "no memory limit" as a huge page-aligned number.
_V1_UNLIMITED_BYTES = 2**60


# --------------------------------------------------------------------------- #
# small helpers
# --------------------------------------------------------------------------- #
def _read_text(path) -> str | None:
    try:
        return Path(path).read_text().strip()
    except (OSError, ValueError):
        return None


def _safe(fn, *args, default=None):
    """Call ``fn``; any exception → ``default`` (absent feature, not a bug)."""
    try:
        return fn(*args)
    except Exception:  # noqa: BLE001 - robustness is the contract here
        return default


def _decode(value):
    return value.decode(errors="replace") if isinstance(value, bytes) else value


def _jsonable(obj):
    """Recursively coerce to plain JSON types (numpy scalars, bytes, paths...)."""
    if obj is None or isinstance(obj, (bool, str)):
        return obj
    if isinstance(obj, int):
        return int(obj)
    if isinstance(obj, float):
        return obj if math.isfinite(obj) else None
    if isinstance(obj, bytes):
        return _decode(obj)
    if isinstance(obj, dict):
        return {str(k): _jsonable(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple, set)):
        return [_jsonable(v) for v in obj]
    if hasattr(obj, "item"):  # numpy scalar
        return _jsonable(obj.item())
    return str(obj)


# --------------------------------------------------------------------------- #
# CPU
# --------------------------------------------------------------------------- #
def parse_cpu_max(text: str) -> float | None:
    """Parse cgroup v2 ``cpu.max`` ("QUOTA PERIOD") into a CPU count.

    ``"max 100000"`` → None (unlimited); ``"200000 100000"`` → 2.0;
    anything unparsable → None.
    """
    if not isinstance(text, str):
        return None
    parts = text.split()
    if len(parts) != 2 or parts[0] == "max":
        return None
    return _quota_ratio(parts[0], parts[1])


def _quota_ratio(quota, period) -> float | None:
    try:
        q, p = int(quota), int(period)
    except (TypeError, ValueError):
        return None
    if q <= 0 or p <= 0:  # v1 uses -1 for "no quota"
        return None
    return q / p


def _own_cgroup_paths() -> dict[str, str]:
    """Map controller (v1) or "" (v2) → this process's cgroup path."""
    out: dict[str, str] = {}
    text = _read_text("/proc/self/cgroup") or ""
    for line in text.splitlines():
        parts = line.split(":", 2)
        if len(parts) != 3:
            continue
        for ctrl in parts[1].split(",") if parts[1] else [""]:
            out[ctrl] = parts[2]
    return out


def _dirs_up(base: Path, rel: str | None) -> list[Path]:
    """``base/rel`` and its ancestors up to ``base`` (limits nest)."""
    dirs = [base]
    if rel and rel != "/":
        cur = base
        for part in Path(rel.lstrip("/")).parts:
            cur = cur / part
            dirs.append(cur)
    return dirs


def _cgroup_v2_cpu_quota() -> float | None:
    rel = _own_cgroup_paths().get("")
    quotas = [parse_cpu_max(_read_text(d / "cpu.max") or "") for d in _dirs_up(CGROUP_ROOT, rel)]
    quotas = [q for q in quotas if q is not None]
    return min(quotas) if quotas else None


def _cgroup_v1_cpu_quota() -> float | None:
    rel = _own_cgroup_paths().get("cpu")
    quotas = []
    for mount in ("cpu", "cpu,cpuacct", "cpuacct,cpu"):
        for d in _dirs_up(CGROUP_ROOT / mount, rel):
            q = _quota_ratio(_read_text(d / "cpu.cfs_quota_us"), _read_text(d / "cpu.cfs_period_us"))
            if q is not None:
                quotas.append(q)
    return min(quotas) if quotas else None


def cgroup_cpu_quota() -> float | None:
    """CPU quota of this process's cgroup in CPUs (v2 first, then v1); None = unlimited."""
    return _safe(_cgroup_v2_cpu_quota) or _safe(_cgroup_v1_cpu_quota)


def _affinity() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return os.cpu_count() or 1


def usable_cores() -> dict:
    """How many CPUs this process can really keep busy.

    ``usable = floor(min(affinity, cgroup quota))``, at least 1.
    """
    affinity = _affinity()
    quota = cgroup_cpu_quota()
    limit = affinity if quota is None else min(affinity, quota)
    return {
        "logical": os.cpu_count(),
        "physical": _safe(psutil.cpu_count, False),
        "affinity": affinity,
        "cgroup_quota": quota,
        "usable": max(1, int(math.floor(limit))),
    }


def parse_cpu_list(text: str) -> list[int]:
    """Kernel CPU list syntax ("0-3,8,10-11") → sorted CPU numbers; [] for anything unparsable."""
    cpus: set[int] = set()
    try:
        for part in filter(None, text.strip().split(",")):
            lo, _, hi = part.partition("-")
            cpus.update(range(int(lo), int(hi or lo) + 1))
    except ValueError:
        return []
    return sorted(cpus)


def cpu_groups() -> list[list[int]]:
    """The CPUs this process may use, grouped by physical core (SMT siblings together), in CPU order.

    The sizing check makes its CPU masks from these: one CPU per physical core before any sibling.
    """
    allowed = set(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else set(range(os.cpu_count() or 1))
    groups: list[list[int]] = []
    for cpu in sorted(allowed):
        if any(cpu in g for g in groups):
            continue
        sib = parse_cpu_list(_read_text(f"/sys/devices/system/cpu/cpu{cpu}/topology/thread_siblings_list") or "")
        groups.append([c for c in sib if c in allowed] or [cpu])
    return groups


def mask_for(cores: int, groups: list[list[int]]) -> list[int]:
    """``cores`` CPUs, one per physical core first and SMT siblings only past the physical count.

    The scheduler of an unmasked job also gives w workers w separate physical cores while w is at most the
    physical count, so a job masked to w CPUs matches the curve's point at its worker count, and siblings enter
    both the same way.
    """
    order = [g[k] for k in range(max(map(len, groups), default=0)) for g in groups if k < len(g)]
    return order[:cores]


def confine(pids: list[int], cpus) -> None:
    """Every thread of each process in ``pids`` onto ``cpus``. ``sched_setaffinity`` sets one thread's mask
    (a thread made before the call keeps its own), so each process's threads are set one by one from /proc;
    threads made later inherit their creator's. A process or thread that ended meanwhile is passed over."""
    for pid in pids:
        try:
            tids = [int(t) for t in os.listdir(f"/proc/{pid}/task")]
        except (FileNotFoundError, ProcessLookupError):
            continue
        for tid in tids:
            try:
                os.sched_setaffinity(tid, cpus)
            except (ProcessLookupError, FileNotFoundError):
                pass


def cpu_model() -> str | None:
    for line in (_read_text("/proc/cpuinfo") or "").splitlines():
        if line.lower().startswith("model name"):
            return line.split(":", 1)[1].strip()
    return platform.processor() or None


# --------------------------------------------------------------------------- #
# GPU (NVML)
# --------------------------------------------------------------------------- #
def _nvml_device(nv, index: int) -> dict:
    h = nv.nvmlDeviceGetHandleByIndex(index)
    mem = _safe(nv.nvmlDeviceGetMemoryInfo, h)
    power_mw = _safe(nv.nvmlDeviceGetEnforcedPowerLimit, h)
    return {
        "index": index,
        "name": _decode(_safe(nv.nvmlDeviceGetName, h)),
        "uuid": _decode(_safe(nv.nvmlDeviceGetUUID, h)),
        "memory_total_mb": None if mem is None else mem.total / _MIB,
        "sm_clock_max_mhz": _safe(nv.nvmlDeviceGetMaxClockInfo, h, nv.NVML_CLOCK_SM),
        "mem_clock_max_mhz": _safe(nv.nvmlDeviceGetMaxClockInfo, h, nv.NVML_CLOCK_MEM),
        "power_limit_w": None if power_mw is None else power_mw / 1000.0,
        "pcie_gen_current": _safe(nv.nvmlDeviceGetCurrPcieLinkGeneration, h),
        "pcie_gen_max": _safe(nv.nvmlDeviceGetMaxPcieLinkGeneration, h),
        "pcie_width_current": _safe(nv.nvmlDeviceGetCurrPcieLinkWidth, h),
        "pcie_width_max": _safe(nv.nvmlDeviceGetMaxPcieLinkWidth, h),
        "persistence_mode": _safe(lambda: bool(nv.nvmlDeviceGetPersistenceMode(h))),
        "pci_bus_id": _decode(_safe(lambda: nv.nvmlDeviceGetPciInfo(h).busId)),
        **_nvlinks(nv, h),
    }


def _nvlinks(nv, h) -> dict:
    """NVLink: links up, their version, and the PCI bus ids at their far ends (a peer GPU or a switch).
    Read only (the state NVML reports); nothing is changed."""
    up, versions, peers = 0, set(), set()
    for link in range(getattr(nv, "NVML_NVLINK_MAX_LINKS", 18)):
        state = _safe(nv.nvmlDeviceGetNvLinkState, h, link)
        if state is None:  # no such link (or no NVLink at all): the rest will not answer either
            break
        if state:
            up += 1
            versions.add(_safe(nv.nvmlDeviceGetNvLinkVersion, h, link))
            peers.add(_decode(_safe(lambda: nv.nvmlDeviceGetNvLinkRemotePciInfo(h, link).busId)))  # noqa: B023 called now
    return {
        "nvlink_links_up": up,
        "nvlink_version": max((v for v in versions if v), default=None),
        "nvlink_peers": sorted(p for p in peers if p),
    }


def _peer_gpus(gpus: list[dict]) -> list[dict]:
    """Each GPU's NVLink far ends named as GPU indices where they are GPUs of this machine
    (``nvlink_peer_gpus``); an end that is no GPU here is an NVSwitch or another machine's."""
    bus = {str(g.get("pci_bus_id") or "").lower()[-12:]: g["index"] for g in gpus if g.get("pci_bus_id")}
    for g in gpus:
        ends = [bus.get(str(p).lower()[-12:]) for p in g.get("nvlink_peers") or []]
        g["nvlink_peer_gpus"] = sorted(i for i in ends if i is not None)
    return gpus


def gpu_info() -> list[dict]:
    """Static facts about each NVIDIA GPU; ``[]`` without driver/NVML."""
    try:
        import pynvml as nv

        nv.nvmlInit()
    except Exception:  # ImportError or NVMLError (no driver / no library)
        return []
    try:
        driver = _decode(_safe(nv.nvmlSystemGetDriverVersion))
        count = _safe(nv.nvmlDeviceGetCount, default=0)
        gpus = []
        for i in range(count):
            dev = _safe(_nvml_device, nv, i, default={"index": i})
            gpus.append({**dev, "driver_version": driver})
        return _jsonable(_peer_gpus(gpus))
    finally:
        _safe(nv.nvmlShutdown)


# --------------------------------------------------------------------------- #
# software
# --------------------------------------------------------------------------- #
def torch_info() -> dict:
    try:
        import torch
    except Exception:  # noqa: BLE001
        return {"version": None, "cuda_available": False}
    cuda = bool(_safe(torch.cuda.is_available, default=False))
    count = _safe(torch.cuda.device_count, default=0) if cuda else 0
    return _jsonable(
        {
            "version": torch.__version__,
            "cuda_available": cuda,
            "cuda_version": torch.version.cuda,
            "cudnn_version": _safe(torch.backends.cudnn.version),
            "device_count": count,
            "device_names": [_safe(torch.cuda.get_device_name, i) for i in range(count)],
            "bf16_supported": _safe(torch.cuda.is_bf16_supported) if cuda else None,
            "num_threads": _safe(torch.get_num_threads),
        }
    )


def _module_version(name: str) -> str | None:
    """``name.__version__``; a package not imported yet whose ``version.py`` holds it as a literal (torch's,
    torchvision's) is read there, as the package itself reads it: importing torchvision takes
    seconds that a run on another model never needs."""
    mod = sys.modules.get(name)
    if mod is None and (static := _safe(_version_file, name)):
        return static
    try:
        mod = mod or importlib.import_module(name)
    except Exception:  # noqa: BLE001
        return None
    return str(getattr(mod, "__version__", None) or getattr(mod, "VERSION", None) or "") or None


def _version_file(name: str) -> str | None:
    """The string literal assigned to ``__version__`` in package ``name``'s ``version.py``, or None."""
    spec = importlib.util.find_spec(name)
    if spec is None or not spec.submodule_search_locations or not spec.origin:
        return None
    tree = ast.parse((Path(spec.origin).parent / "version.py").read_text(encoding="utf-8"))
    for node in tree.body:
        if (
            isinstance(node, ast.Assign)
            and any(getattr(t, "id", None) == "__version__" for t in node.targets)
            and isinstance(node.value, ast.Constant)
            and isinstance(node.value.value, str)
        ):
            return node.value.value
    return None


def _dist_version(dist: str, module: str) -> str | None:
    """Version of an installed distribution without importing it (timm is slow)."""
    if _safe(importlib.util.find_spec, module) is None:
        return None
    return _safe(importlib.metadata.version, dist)


#: the hardware work queues CUDA spreads a process's streams over (``CUDA_DEVICE_MAX_CONNECTIONS``: CUDA's default
#: 8, at most 32). Streams are mapped to them in turn as they are made, and two streams on one queue run in the
#: order their work was queued, as one: the GPU pipeline's decode then waits behind the step's kernels on another
#: stream instead of running beside them (docs/measured.md, "The GPU pipeline's decode behind the step")
GPU_CONNECTIONS = "32"
CONNECTIONS_VAR = "CUDA_DEVICE_MAX_CONNECTIONS"


def spread_gpu_streams() -> str | None:
    """Give this process's CUDA streams queues of their own (:data:`GPU_CONNECTIONS`) unless the environment already
    says how many; the value its CUDA context runs with (None: CUDA's default). CUDA reads it once, when the process
    makes its context: where CUDA is up already (a script that called ``pipeprof.profile`` after its own CUDA work)
    it is left as it was, and what the context read stays what the environment says. Called where trials start
    (``orchestrate.runner.execute``, and the CLI's commands that run them before any CUDA call); not by ``watch``,
    whose script's environment is the user's. Child processes (torchrun's ranks) inherit it."""
    torch = sys.modules.get("torch")  # not imported yet: no CUDA context yet either
    if torch is None or not torch.cuda.is_initialized():
        os.environ.setdefault(CONNECTIONS_VAR, GPU_CONNECTIONS)
    return os.environ.get(CONNECTIONS_VAR)


def library_versions() -> dict:
    # albumentations phones home for updates on import unless told not to.
    os.environ.setdefault("NO_ALBUMENTATIONS_UPDATE", "1")
    return {
        "python": platform.python_version(),
        "torch": _module_version("torch"),
        "torchvision": _module_version("torchvision"),
        "albumentations": _module_version("albumentations"),
        "cv2": _module_version("cv2"),
        "PIL": _module_version("PIL"),
        "numpy": _module_version("numpy"),
        "pandas": _module_version("pandas"),
        "timm": _dist_version("timm", "timm"),
        "pipeprof": _module_version("pipeprof"),
    }


def pillow_jpeg_info() -> dict:
    """Whether Pillow decodes JPEG with libjpeg-turbo (2-3x faster than libjpeg)."""
    try:
        from PIL import features
    except Exception:  # noqa: BLE001
        return {"libjpeg_turbo": False, "version": None}
    turbo = bool(_safe(features.check_feature, "libjpeg_turbo", default=False))
    version = _safe(features.version, "libjpeg_turbo") if turbo else None
    return {"libjpeg_turbo": turbo, "version": version or _safe(features.version, "jpg")}


# --------------------------------------------------------------------------- #
# storage and memory
# --------------------------------------------------------------------------- #
def _resolve_lenient(path) -> tuple[Path, Path]:
    """(resolved path, its deepest existing ancestor); ``path`` need not exist."""
    p = Path(os.path.abspath(os.path.expanduser(str(path))))
    missing: list[str] = []
    while not p.exists() and p != p.parent:
        missing.insert(0, p.name)
        p = p.parent
    existing = p.resolve()
    return existing.joinpath(*missing), existing


def _under(path: str, mount: str) -> bool:
    return mount == "/" or path == mount or path.startswith(mount.rstrip("/") + "/")


def filesystem_of(path) -> dict:
    """Mount holding ``path`` (longest mount-point prefix; later mounts win ties)."""
    resolved, existing = _resolve_lenient(path)
    best = None
    for part in _safe(psutil.disk_partitions, True, default=[]):
        if _under(str(existing), part.mountpoint) and (best is None or len(part.mountpoint) >= len(best.mountpoint)):
            best = part
    return {
        "path": str(resolved),
        "mount_point": best.mountpoint if best else None,
        "fstype": best.fstype if best else None,
        "device": best.device if best else None,
    }


def _limit_bytes(text: str | None) -> int | None:
    """A memory limit file's value; "max" or v1's huge sentinel → None."""
    if text is None or not text.isdigit() or int(text) >= _V1_UNLIMITED_BYTES:
        return None
    return int(text)


def cgroup_memory_limit_bytes() -> int | None:
    """Tightest memory limit over this process's cgroup and its ancestors."""
    paths = _own_cgroup_paths()
    files = [d / "memory.max" for d in _dirs_up(CGROUP_ROOT, paths.get(""))]
    files += [d / "memory.limit_in_bytes" for d in _dirs_up(CGROUP_ROOT / "memory", paths.get("memory"))]
    limits = [_limit_bytes(_read_text(f)) for f in files]
    limits = [x for x in limits if x is not None]
    return min(limits) if limits else None


def memory_info() -> dict:
    vm = _safe(psutil.virtual_memory)
    limit = _safe(cgroup_memory_limit_bytes)
    return {
        "total_gb": None if vm is None else vm.total / _GIB,
        "available_gb": None if vm is None else vm.available / _GIB,
        "cgroup_limit_gb": None if limit is None else limit / _GIB,
    }


# --------------------------------------------------------------------------- #
# everything
# --------------------------------------------------------------------------- #
def snapshot(dataset_path=None) -> dict:
    """Everything above in one JSON-serialisable dict."""
    now = time.time()
    snap = {
        "time_unix_s": now,
        "time_iso": _dt.datetime.fromtimestamp(now, _dt.timezone.utc).isoformat(),
        "hostname": _safe(socket.gethostname),
        "platform": _safe(platform.platform),
        "cpu_model": _safe(cpu_model),
        "cores": _safe(usable_cores),
        "cpu_groups": _safe(cpu_groups),
        "memory": _safe(memory_info),
        "gpus": _safe(gpu_info, default=[]),
        "torch": _safe(torch_info),
        "libraries": _safe(library_versions),
        "pillow_jpeg": _safe(pillow_jpeg_info),
        "cuda_device_max_connections": os.environ.get(CONNECTIONS_VAR),
        "dataset_path": None if dataset_path is None else str(dataset_path),
        "dataset_filesystem": None if dataset_path is None else _safe(filesystem_of, dataset_path),
    }
    return _jsonable(snap)
