"""`pipeprof watch` on the frameworks' training scripts: each loader is named by the user's own line (the test
script's), the library line beside it, and the command-line option that sets its workers where one does."""

import argparse
import json
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from pipeprof.watch import sites, tune

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
    # timm's train.py passes its loader's arguments as **common_loader_kwargs, built as a dict before the call:
    # the argument is read from the last such assignment before it (the later one is not the call's)
    splat = (
        "kw = dict(num_workers=4)\nkw = dict(\n    batch_size=8,\n    num_workers=args.workers,\n)\n"
        "loader = create_loader(\n    ds,\n    **kw,\n)\nkw = {'num_workers': 0}\n"
    )
    assert sites.call_argument(splat, 7) == ("args.workers", 6, "num_workers")
    assert sites.call_argument("loader = f(**{})\n", 1) is None
    parser = argparse.ArgumentParser()
    parser.add_argument("-j", "--workers", type=int)
    assert sites.option_for("args.workers", [parser]) == {"dest": "workers", "flags": "-j/--workers", "flag": "-j"}
    assert sites.option_for("4", [parser]) is None
    loader = {
        "option": {"flag": "-j", "flags": "-j/--workers"},
        "knob": {"keyword": "num_workers", "expression": "args.workers"},
    }
    assert sites.knob_words(loader, 4, 14).startswith("-j 4 -> -j 14")


def test_a_frameworks_workers_field_is_named_where_the_user_sets_it():
    """The HF Trainer builds its DataLoader from TrainingArguments: the knob is `dataloader_num_workers` in the
    user's `TrainingArguments(...)`, or the command line's `--dataloader_num_workers` (HfArgumentParser)."""
    fw = sites.framework("/env/lib/python3.11/site-packages/transformers/trainer.py:1066")
    assert fw.holder == "TrainingArguments" and fw.fields["num_workers"] == "dataloader_num_workers"
    assert sites.framework("/env/lib/python3.11/site-packages/accelerate/data_loader.py:428") is None
    source = (
        "parser.set_defaults(dataloader_num_workers=1)\n"
        "args = TrainingArguments(\n    output_dir='o',\n    dataloader_num_workers=2,\n)\n"
        "trainer = Trainer(model=m, args=args)\ntrainer.train()\n"
    )
    calls = sites.keyword_calls(source, "TrainingArguments", "dataloader_num_workers")
    assert calls == [("1", 1, False), ("2", 2, True)]
    option = {"dest": "dataloader_num_workers", "flags": "--dataloader_num_workers", "flag": "--dataloader_num_workers"}
    assert sites.knob_source(calls, option) == {"expression": "2", "call_line": 2}  # the class's own call first
    assert sites.knob_source(calls[:1], option) == {"expression": None, "call_line": None}  # then the command line
    assert sites.knob_source([(None, 2, True)], None) == {"expression": None, "call_line": 2}  # left at its default
    at_source = {
        "path": "train.py",
        "line": 7,
        "library_site": "/env/site-packages/transformers/trainer.py:1066",
        "knob": {"expression": "2", "call_line": 2, "keyword": "dataloader_num_workers", "holder": "TrainingArguments"},
        "option": None,
    }
    assert tune.change_line(at_source, 2, 4) == (
        "train.py:2: dataloader_num_workers=2 -> dataloader_num_workers=4 in TrainingArguments(...)"
    )
    unset = at_source | {"knob": at_source["knob"] | {"expression": None}}
    assert tune.change_line(unset, 0, 2) == "train.py:2: add dataloader_num_workers=2 to TrainingArguments(...) " + (
        "(now 0, its default)"
    )
    at_option = unset | {"option": option | {"value": 2}}
    assert tune.change_line(at_option, 2, 4).startswith(
        "train.py:7: --dataloader_num_workers 2 -> --dataloader_num_workers 4 (the option"
    )
    assert tune.change_line(at_option, 2, 2).startswith("keep --dataloader_num_workers 2 (dataloader_num_workers of")
    assert tune.knob_snippet("train.py:7", {"persistent_workers": True}, at_source).endswith(
        "TrainingArguments(..., dataloader_persistent_workers=True)"
    )
    assert tune.knob_snippet("train.py:7", {"persistent_workers": True}).endswith(
        "DataLoader(..., persistent_workers=True)"
    )


def _line_of(script: Path, text: str) -> int:
    return next(i for i, line in enumerate(script.read_text().splitlines(), 1) if text in line)


def _watch(tmp: Path, argv: list[str], *options: str) -> dict:
    return _watched(tmp, argv, *options)[0]


def _watched(tmp: Path, argv: list[str], *options: str) -> tuple[dict, str, Path]:
    """(run.json, the job's own stdout, the run folder) of ``pipeprof watch [options] -- python argv``."""
    done = subprocess.run(
        [sys.executable, "-m", "pipeprof", "watch", *options, "--out-dir", str(tmp / "out"), "--", sys.executable]
        + argv,
        cwd=tmp,
        capture_output=True,
        text=True,
        timeout=240,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    run = next((tmp / "out").glob("watch-*"))
    return json.loads((run / "run.json").read_text()), done.stdout, run


def _rates(stdout: str, run: Path) -> tuple[float, float]:
    """(the watched rate, the script's own clock's) of one run: the end_to_end row beside the job's print."""
    own = float(re.search(r"own clock: ([\d.]+) samples/s", stdout).group(1))
    rows = pd.read_parquet(run / "trials.parquet")
    (watched,) = rows.loc[rows["kind"] == "end_to_end", "samples_per_s"]
    return float(watched), own


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
    assert "lightning/" in loader["library_site"]  # the wrapper Lightning puts around DataLoader.__init__
    print(f"site: {Path(loader['path']).name}:{loader['line']}")


# the watched rate against the script's own clock, both of one run: the watch's windows and the script's clock
# time the same steps (from the return of the batch after the workers' prefetch to the last batch's) in one pass
RATE_TOLERANCE = 0.05


@pytest.mark.slow
def test_accelerates_re_created_loader_is_one_row_at_the_users_dataloader_line(tmp_path):
    pytest.importorskip("accelerate")
    script = EXAMPLES / "accelerate_train_small.py"
    run, stdout, folder = _watched(tmp_path, [str(script), "--workers", "2"])
    (loader,) = run["loaders"].values()  # accelerate's DataLoaderShard re-creation joined to the user's loader
    assert loader["path"] == str(script) and loader["line"] == _line_of(script, "loader = DataLoader(")
    assert "accelerate/data_loader.py" in loader["rebuilt"]["library_site"]
    assert loader["rebuilt"]["site"] == f"{script}:{_line_of(script, '= accelerator.prepare(')}"
    assert loader["option"]["flag"] == "--workers" and loader["option"]["value"] == 2
    watched, own = _rates(stdout, folder)
    assert abs(watched / own - 1) <= RATE_TOLERANCE, (watched, own)
    change = tune.change_line(loader, 2, 4)
    assert change.startswith(f"{script}:{loader['line']}: --workers 2 -> --workers 4") and "site-packages" not in change
    print(f"site: {loader['site']} (rebuilt in {loader['rebuilt']['library_site']}); {watched:.1f} vs {own:.1f}/s")


@pytest.mark.slow
def test_the_hf_trainers_loader_is_one_row_at_the_train_line_with_its_dataloader_num_workers_option(tmp_path):
    pytest.importorskip("accelerate")
    pytest.importorskip("transformers")
    script = EXAMPLES / "hf_trainer_train_small.py"
    argv = [str(script), "--dataloader_num_workers", "2", "--output_dir", str(tmp_path / "hf")]
    run, stdout, folder = _watched(tmp_path, argv)
    (loader,) = run["loaders"].values()  # the Trainer's DataLoader and accelerate's re-creation of it: one row
    assert loader["path"] == str(script) and loader["line"] == _line_of(script, "    trainer.train()")
    assert "transformers/trainer.py" in loader["library_site"]
    assert "accelerate/data_loader.py" in loader["rebuilt"]["library_site"]
    assert loader["option"]["flag"] == "--dataloader_num_workers" and loader["option"]["value"] == 2
    assert loader["knob"]["keyword"] == "dataloader_num_workers" and loader["knob"]["holder"] == "TrainingArguments"
    watched, own = _rates(stdout, folder)
    assert abs(watched / own - 1) <= RATE_TOLERANCE, (watched, own)
    change = tune.change_line(loader, 2, 4)
    assert change.startswith(f"{script}:{loader['line']}: --dataloader_num_workers 2 -> --dataloader_num_workers 4")
    assert "site-packages" not in change and "TrainingArguments" in change
    print(f"site: {loader['site']} (library {loader['library_site']}); {watched:.1f} vs {own:.1f}/s")


@pytest.mark.slow
def test_tune_on_the_hf_trainer_writes_its_command_line_option(tmp_path):
    pytest.importorskip("accelerate")
    pytest.importorskip("transformers")
    script = EXAMPLES / "hf_trainer_train_small.py"
    argv = [str(script), "--dataloader_num_workers", "2", "--output_dir", str(tmp_path / "hf")]
    run = _watch(tmp_path, argv, "--steps", "20", "--tune", "--tune-max-s", "15")
    found = run["tune"]
    assert found["site"] == f"{script}:{_line_of(script, '    trainer.train()')}"
    pick = found["recommended_workers"]
    flag = "--dataloader_num_workers"
    assert found["change"].startswith(f"keep {flag} 2" if pick == 2 else f"{found['site']}: {flag} 2 -> {flag} {pick}")
    assert "site-packages" not in found["change"]
    print(found["change"])
