"""Tests for pipeprof.env: values are recomputed independently, not just type-checked."""

import json
import math
import os
from pathlib import Path

import pytest
import torch

from pipeprof import env


@pytest.mark.parametrize(
    "text, expected",
    [
        ("max 100000", None),
        ("max", None),
        ("200000 100000", 2.0),
        ("50000 100000", 0.5),
        ("150000 100000\n", 1.5),
        ("", None),
        ("garbage", None),
        ("abc 100000", None),
        ("100000 0", None),
        ("-1 100000", None),
        ("1 2 3", None),
    ],
)
def test_parse_cpu_max(text, expected):
    assert env.parse_cpu_max(text) == expected


def test_parse_cpu_max_non_string():
    assert env.parse_cpu_max(None) is None


def _independent_quota():
    """Quota read here without pipeprof's helpers (root cgroup files only)."""
    root = Path("/sys/fs/cgroup")
    try:
        q, p = (root / "cpu.max").read_text().split()
        return None if q == "max" else int(q) / int(p)
    except (OSError, ValueError):
        pass
    for d in ("cpu", "cpu,cpuacct"):
        try:
            q = int((root / d / "cpu.cfs_quota_us").read_text())
            p = int((root / d / "cpu.cfs_period_us").read_text())
            return q / p if q > 0 and p > 0 else None
        except (OSError, ValueError):
            continue
    return None


def test_usable_cores():
    cores = env.usable_cores()
    affinity = len(os.sched_getaffinity(0))
    assert cores["logical"] == os.cpu_count()
    assert cores["affinity"] == affinity
    assert 1 <= cores["usable"] <= affinity
    quota = cores["cgroup_quota"]
    root_quota = _independent_quota()
    if root_quota is not None:  # nested cgroups can only tighten the root limit
        assert quota is not None and quota <= root_quota
    expected = affinity if quota is None else min(affinity, quota)
    assert cores["usable"] == max(1, math.floor(expected))


def test_filesystem_of_proc():
    fs = env.filesystem_of("/proc")
    assert fs["fstype"] == "proc"
    assert fs["mount_point"] == "/proc"


def test_filesystem_of_missing_path_resolves_to_parent_mount(tmp_path):
    missing = tmp_path / "does" / "not" / "exist.jpg"
    fs = env.filesystem_of(missing)
    tmp_fs = env.filesystem_of("/tmp")
    assert fs["mount_point"] == tmp_fs["mount_point"]
    assert fs["fstype"] == tmp_fs["fstype"]
    assert fs["path"] == str(missing.resolve())


def test_gpu_info_empty_without_driver():
    if torch.cuda.is_available():
        pytest.skip("a GPU is present")
    assert env.gpu_info() == []


def test_gpu_info_entries_on_gpu_machine():
    if not torch.cuda.is_available():
        pytest.skip("no GPU")
    gpus = env.gpu_info()
    assert len(gpus) == torch.cuda.device_count()
    assert gpus[0]["memory_total_mb"] > 1000
    assert gpus[0]["driver_version"]


def test_memory_info():
    mem = env.memory_info()
    assert 0 < mem["available_gb"] <= mem["total_gb"]
    assert mem["cgroup_limit_gb"] is None or mem["cgroup_limit_gb"] > 0


def test_pillow_jpeg_info():
    from PIL import features

    info = env.pillow_jpeg_info()
    assert info["libjpeg_turbo"] == bool(features.check_feature("libjpeg_turbo"))
    assert info["version"] is None or isinstance(info["version"], str)


def test_torch_info():
    info = env.torch_info()
    assert info["version"] == torch.__version__
    assert info["cuda_available"] == torch.cuda.is_available()
    assert info["num_threads"] == torch.get_num_threads()


def test_library_versions():
    import numpy

    v = env.library_versions()
    assert v["numpy"] == numpy.__version__
    assert v["pipeprof"] is not None
    assert os.environ.get("NO_ALBUMENTATIONS_UPDATE") is not None


def test_snapshot_is_json(tmp_path):
    snap = env.snapshot(dataset_path=tmp_path / "missing")
    text = json.dumps(snap, allow_nan=False)
    assert json.loads(text) == snap
    for key in (
        "hostname",
        "platform",
        "cpu_model",
        "time_unix_s",
        "time_iso",
        "cores",
        "memory",
        "gpus",
        "torch",
        "libraries",
        "pillow_jpeg",
        "dataset_filesystem",
    ):
        assert key in snap
    assert snap["cores"]["usable"] >= 1
    assert snap["dataset_filesystem"]["mount_point"] == env.filesystem_of(tmp_path)["mount_point"]


def test_cgroup_v2_quota_limits_usable(tmp_path, monkeypatch):
    (tmp_path / "cpu.max").write_text("max 100000\n")
    (tmp_path / "job").mkdir()
    (tmp_path / "job" / "cpu.max").write_text("150000 100000\n")  # nested: 1.5 CPUs
    monkeypatch.setattr(env, "CGROUP_ROOT", tmp_path)
    monkeypatch.setattr(env, "_own_cgroup_paths", lambda: {"": "/job"})
    cores = env.usable_cores()
    assert cores["cgroup_quota"] == 1.5
    assert cores["usable"] == max(1, math.floor(min(1.5, cores["affinity"])))


def test_cgroup_v1_quota_and_memory_limit(tmp_path, monkeypatch):
    (tmp_path / "cpu").mkdir()
    (tmp_path / "cpu" / "cpu.cfs_quota_us").write_text("50000\n")
    (tmp_path / "cpu" / "cpu.cfs_period_us").write_text("100000\n")
    (tmp_path / "memory").mkdir()
    (tmp_path / "memory" / "memory.limit_in_bytes").write_text(str(4 * 2**30))
    monkeypatch.setattr(env, "CGROUP_ROOT", tmp_path)
    monkeypatch.setattr(env, "_own_cgroup_paths", lambda: {"cpu": "/", "memory": "/"})
    cores = env.usable_cores()
    assert cores["cgroup_quota"] == 0.5 and cores["usable"] == 1
    assert env.memory_info()["cgroup_limit_gb"] == 4.0


def _unset(monkeypatch, name: str) -> None:
    """``name`` out of the environment for the test, and put back as it was after it (a bare ``delenv`` of a name
    not set records nothing, so what the code under test sets would stay)."""
    monkeypatch.setenv(name, "")
    monkeypatch.delenv(name)


def test_spread_gpu_streams_sets_queues_and_keeps_a_users_value(monkeypatch):
    _unset(monkeypatch, env.CONNECTIONS_VAR)
    assert env.spread_gpu_streams() == env.GPU_CONNECTIONS == "32"
    assert os.environ[env.CONNECTIONS_VAR] == "32"
    assert env.snapshot()["cuda_device_max_connections"] == "32"  # the run's record of what its process ran with
    monkeypatch.setenv(env.CONNECTIONS_VAR, "4")  # the user's own setting wins
    assert env.spread_gpu_streams() == "4"


def test_only_the_commands_that_run_trials_outside_a_run_set_the_stream_queues(monkeypatch, tmp_path):
    from pipeprof.cli import main

    _unset(monkeypatch, env.CONNECTIONS_VAR)
    assert main(["size", str(tmp_path / "no-run")]) == 2  # reads run folders: runs no trial, leaves it alone
    assert env.CONNECTIONS_VAR not in os.environ
    assert main(["bench", "gpu-augment", "--batch", "0"]) == 2  # refused at once: set before that, let alone CUDA
    assert os.environ[env.CONNECTIONS_VAR] == "32"


def test_a_run_sets_the_stream_queues_and_records_them(monkeypatch, tmp_path):
    import pipeprof
    from pipeprof.checks.calibrate import BurnDataset, FixedStepModel

    _unset(monkeypatch, env.CONNECTIONS_VAR)
    run = pipeprof.profile(  # the Python API's run: execute() sets it, as the CLI's does
        BurnDataset(32, 0.0),
        model=FixedStepModel(0.001),
        batch_size=8,
        num_workers=[0],
        trials=["end_to_end"],
        measure={"warmup_batches": 1, "window_s": 0.1, "windows": 2, "cpu_reference_s": 0},
        out_dir=str(tmp_path),
        device="cpu",
        log=lambda *a: None,
    )
    assert run.meta["machine"]["cuda_device_max_connections"] == "32"
