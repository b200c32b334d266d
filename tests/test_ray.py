"""The pipeline on Ray Data (data.engine: ray): the missing extra's error and the config's checks."""

from __future__ import annotations

import builtins
import sys

import pytest

ray = pytest.importorskip("ray")

from pipeprof import config  # noqa: E402
from pipeprof.data import ray_engine  # noqa: E402


def test_missing_extra_named(monkeypatch):
    """Without Ray the error names the extra to install."""
    real = builtins.__import__

    def no_ray(name, *a, **k):
        if name == "ray" or name.startswith("ray."):
            raise ImportError("No module named 'ray'")
        return real(name, *a, **k)

    monkeypatch.setattr(builtins, "__import__", no_ray)
    monkeypatch.delitem(sys.modules, "ray.data", raising=False)
    with pytest.raises(RuntimeError, match=r'pip install "pipeprof\[ray\]"'):
        ray_engine.require_ray()


def test_config_names_the_ray_limits():
    """data.engine ray without CPU limits to measure is a config error naming loader.num_workers."""
    with pytest.raises(config.ConfigError, match="loader.num_workers"):
        config.build({"data": {"engine": "ray"}})
    cfg = config.build({"data": {"engine": "ray"}, "loader": {"num_workers": [1, 2]}, "sweep": "exhaustive"})
    assert cfg.data.engine == "ray"


def test_actor_cpu_is_per_actor_on_each_node():
    """Two actors with one process id on two nodes are two actors: each one's CPU from its first row in the windows
    to its last, over the rows after its first (10 ms and 30 ms of CPU over 2 rows each: 10 ms a sample)."""
    import torch

    def batch(pid, node, cpu):
        return {
            "pid": torch.tensor([pid, pid]),
            "node": torch.tensor([node, node]),
            "cpu_s": torch.tensor(cpu, dtype=torch.float64),
        }

    cpu = ray_engine.ActorCpu()
    cpu.add(batch(7, ray_engine.node_key("a" * 56), [1.00, 1.00]))
    cpu.add(batch(7, ray_engine.node_key("b" * 56), [5.00, 5.00]))
    cpu.add(batch(7, ray_engine.node_key("a" * 56), [1.01, 1.01]))
    cpu.add(batch(7, ray_engine.node_key("b" * 56), [5.03, 5.03]))
    assert len(cpu.first) == 2
    assert cpu.per_sample_s() == pytest.approx((0.01 + 0.03) / 4)
    assert ray_engine.node_key("f" * 56) == 2**60 - 1  # 60 bits: an int64 batch column holds it
