"""A wheel that runs: ``pip wheel`` of the checkout carries the presets and ``pipeprof watch``'s bootstrap, and
installed (not editable) into a fresh virtualenv its ``pipeprof`` command runs a real sweep from a
folder that is not the checkout, and ``pipeprof watch`` finds its bootstrap there.

The new environment gets pipeprof from the wheel alone and its dependencies from this interpreter's
site-packages, through a ``.pth`` file of path lines: a path line adds the folder but does not run the ``.pth``
files in it, so the editable install's finder there (the checkout) is never installed. The test checks that the
pipeprof it runs is the installed one. The wheel is built from a copy of the checkout: setuptools builds in the
source tree (``build/``), which must not appear in a working tree others are editing.
"""

from __future__ import annotations

import json
import os
import shutil
import site
import subprocess
import sys
import zipfile
from pathlib import Path

import pandas as pd
import pytest

ROOT = Path(__file__).resolve().parents[1]
NOT_SOURCE = {"build", "dist", "out", "tests", "configs"}  # top-level folders the build does not read
# a short sweep on the CPU with the default preset (standard): one worker count, short windows, the loader alone
# and end-to-end beside a 5 ms step that burns no CPU, actions predicted
RUN = [
    "name=wheel",
    "device=cpu",
    "out_dir=out",
    "data.images=16",
    "data.classes=2",
    "data.cache_dir=datasets",
    "loader.num_workers=[1]",
    "loader.batch_size=4",
    "trials=[cpu_pipeline,end_to_end]",
    "model.name=pipeprof.checks.calibrate:fixed_step_model_5ms",
    "model.threads=1",
    "measure.window_s=0.1",
    "measure.windows=2",
    "measure.max_windows=2",
    "measure.warmup_max_s=0.5",
    "measure.cpu_reference_s=0",
    "measure.redraws=0",
    "actions=predict",
]


def _source_copy(dst: Path) -> Path:
    """The checkout as ``pip wheel .`` reads it, without the virtualenv, git, caches and outputs."""

    def ignore(folder, names):
        top = Path(folder) == ROOT
        return {
            n
            for n in names
            if n == "__pycache__" or n.endswith(".egg-info") or top and (n.startswith(".") or n in NOT_SOURCE)
        }

    return Path(shutil.copytree(ROOT, dst, ignore=ignore))


def _ok(cmd: list, what: str, **kwargs) -> subprocess.CompletedProcess:
    done = subprocess.run([str(c) for c in cmd], capture_output=True, text=True, timeout=300, **kwargs)
    assert done.returncode == 0, f"{what}: exit {done.returncode}\n{done.stdout[-4000:]}\n{done.stderr[-4000:]}"
    return done


def _wheel(tmp: Path) -> tuple[Path, Path]:
    """(the wheel, the copy of the checkout it was built from)."""
    src = _source_copy(tmp / "src")
    _ok(
        [
            sys.executable,
            "-m",
            "pip",
            "wheel",
            "--no-deps",
            "--no-build-isolation",
            "--no-index",
            "-q",
            "-w",
            tmp / "dist",
            src,
        ],
        "pip wheel",
    )
    (found,) = (tmp / "dist").glob("pipeprof-*.whl")
    return found, src


def _venv(wheel: Path, env_dir: Path) -> dict:
    """A fresh virtualenv with the wheel installed (no deps), the deps through a .pth; the environment to run it
    in (no PYTHONPATH nor preset folder from this one)."""
    _ok([sys.executable, "-m", "venv", "--without-pip", env_dir], "venv")
    python = env_dir / "bin" / "python"
    _ok(
        [sys.executable, "-m", "pip", "--python", python, "install", "--no-deps", "--no-index", "-q", wheel],
        "pip install",
    )
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PYTHONHOME", "PIPEPROF_PRESETS")}
    purelib = _ok(
        [python, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"], "purelib", env=env
    ).stdout.strip()
    deps = dict.fromkeys(p for p in site.getsitepackages() if os.path.isdir(p))  # path lines only, in order
    (Path(purelib) / "_pipeprof_test_deps.pth").write_text("".join(f"{p}\n" for p in deps))
    return env


def _contents(wheel: Path, src: Path) -> None:
    """Every module of the package, every preset, and the watch's bootstrap (a folder with no __init__.py)."""
    names = set(zipfile.ZipFile(wheel).namelist())
    presets = {f"pipeprof/augmentations/{p.name}" for p in (src / "augmentations").glob("*.yaml")}
    modules = {f"pipeprof/{p.relative_to(src / 'pipeprof').as_posix()}" for p in (src / "pipeprof").rglob("*.py")}
    assert "pipeprof/augmentations/standard.yaml" in presets and "pipeprof/watch/boot/sitecustomize.py" in modules
    assert sorted(presets - names) == [] and sorted(modules - names) == []


def _installed(env_dir: Path, env: dict, cwd: Path) -> None:
    """The pipeprof the new environment imports is the wheel's, with its presets; the checkout is not on its path."""
    where = _ok(
        [
            env_dir / "bin" / "python",
            "-c",
            "import json, sys, pipeprof, pipeprof.presets as p, pipeprof.watch.session as w; "
            "print(json.dumps([pipeprof.__file__, str(p.PRESET_DIR), p.available(), sys.path, str(w.BOOT)]))",
        ],
        "import",
        cwd=cwd,
        env=env,
    )
    module, presets, available, path, boot = json.loads(where.stdout)
    assert Path(module).is_relative_to(env_dir) and Path(presets).is_relative_to(env_dir), (module, presets)
    # the folder ``pipeprof watch`` puts first on the job's PYTHONPATH, with the bootstrap in it
    assert Path(boot).is_relative_to(env_dir) and (Path(boot) / "sitecustomize.py").is_file(), boot
    assert "standard" in available and str(ROOT) not in path


@pytest.mark.slow
def test_the_wheel_installed_elsewhere_runs_a_sweep_with_its_presets_and_bootstrap(tmp_path):
    wheel, src = _wheel(tmp_path / "build")
    _contents(wheel, src)
    env_dir, elsewhere = tmp_path / "env", tmp_path / "elsewhere"
    env = _venv(wheel, env_dir)
    elsewhere.mkdir()
    _installed(env_dir, env, elsewhere)

    _ok(
        [env_dir / "bin" / "pipeprof", "run", *[a for s in RUN for a in ("--set", s)]],
        "pipeprof run",
        cwd=elsewhere,
        env=env,
    )
    (folder,) = (elsewhere / "out").glob("wheel-*")
    meta = json.loads((folder / "run.json").read_text())
    assert meta["status"] == "complete" and meta["config"]["augment"]["preset"] == ["standard"]
    trials = pd.read_parquet(folder / "trials.parquet")
    assert sorted(trials["kind"]) == ["cpu_pipeline", "end_to_end"] and set(trials["status"]) == {"ok"}
    assert all("/standard/" in t for t in trials["trial_id"])
