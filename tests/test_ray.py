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
