"""`pipeprof watch` on the frameworks' training scripts: each loader is named by the user's own line (the test
script's), the library line beside it, and the command-line option that sets its workers where one does."""

import argparse
import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from pipeprof.watch import sites

EXAMPLES = Path(__file__).parent / "examples"


def test_installed_packages_and_the_stdlib_are_libraries_and_a_script_is_not():
    assert sites.is_library(argparse.__file__)
    assert sites.is_library(np.__file__)
    assert sites.is_library(sites.__file__)  # pipeprof itself
    assert not sites.is_library(str(EXAMPLES / "timm_train_small.py"))


def test_the_argument_of_a_multi_line_call_and_its_option_are_read():
    source = "x = f(\n    a,\n    num_workers=args.workers,\n    b=2,\n)\n"
    assert sites.call_argument(source, 1) == ("args.workers", 1, "num_workers")
    assert sites.call_argument(source, 4) == ("args.workers", 1, "num_workers")
    assert sites.call_argument("y = g(1)\n", 1) is None
    parser = argparse.ArgumentParser()
    parser.add_argument("-j", "--workers", type=int)
    assert sites.option_for("args.workers", [parser]) == {"dest": "workers", "flags": "-j/--workers", "flag": "-j"}
    assert sites.option_for("4", [parser]) is None
    loader = {
        "option": {"flag": "-j", "flags": "-j/--workers"},
        "knob": {"keyword": "num_workers", "expression": "args.workers"},
    }
    assert sites.knob_words(loader, 4, 14).startswith("-j 4 -> -j 14")


def _line_of(script: Path, text: str) -> int:
    return next(i for i, line in enumerate(script.read_text().splitlines(), 1) if text in line)


def _watch(tmp: Path, argv: list[str]) -> dict:
    done = subprocess.run(
        [sys.executable, "-m", "pipeprof", "watch", "--out-dir", str(tmp / "out"), "--", sys.executable, *argv],
        cwd=tmp,
        capture_output=True,
        text=True,
        timeout=240,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    run = next((tmp / "out").glob("watch-*"))
    return json.loads((run / "run.json").read_text())


@pytest.mark.slow
def test_timm_create_loader_is_named_by_the_scripts_line_and_its_workers_option(tmp_path):
    pytest.importorskip("timm")
    from PIL import Image

    rng = np.random.default_rng(0)
    for c in ("a", "b"):
        (tmp_path / "data" / "train" / c).mkdir(parents=True)
        for i in range(16):
            Image.fromarray(rng.integers(0, 256, (80, 96, 3), dtype=np.uint8)).save(
                tmp_path / f"data/train/{c}/{i}.jpg"
            )
    script = EXAMPLES / "timm_train_small.py"
    run = _watch(tmp_path, [str(script), str(tmp_path / "data"), "-j", "1", "--steps", "20"])
    (loader,) = run["loaders"].values()
    assert loader["path"] == str(script) and loader["line"] == _line_of(script, "create_loader(")
    assert "timm/data/loader.py" in loader["library_site"]
    assert loader["option"]["flag"] == "-j" and loader["option"]["value"] == 1
    print(f"site: {Path(loader['path']).name}:{loader['line']} (library {loader['library_site']})")


@pytest.mark.slow
def test_lightnings_re_created_loader_is_one_row_at_the_datamodules_line(tmp_path):
    pytest.importorskip("lightning")
    script = EXAMPLES / "lightning_train_small.py"
    run = _watch(tmp_path, [str(script), "40"])
    (loader,) = run["loaders"].values()  # Lightning's re-creation (its sampler added) joined to the user's
    assert loader["path"] == str(script) and loader["line"] == _line_of(script, "return DataLoader(")
    print(f"site: {Path(loader['path']).name}:{loader['line']}")
