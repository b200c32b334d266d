"""Every input error is a message and exit status 2, before anything is measured: preset files albumentations
cannot load, import paths that do not import, an out_dir that cannot hold a run, a damaged run folder in
`report`. And profile() takes every config section without colliding with its own arguments."""

import contextlib
import json
import os
import shutil
import subprocess
from pathlib import Path

import pytest
from torch import nn

import pipeprof
from pipeprof.cli import main

OLD_RUN = Path(__file__).parent / "data" / "run-schema1"  # a real run folder, with its trials and timeline
PRESETS = {
    "malformed.yaml": ("transform: [unclosed\n  - x: {", "ParserError: while parsing a flow sequence"),
    "no-transform.yaml": ("__version__: 2.0.8\nfoo: 1\n", "no 'transform' key"),
    "unknown.yaml": (
        "__version__: 2.0.8\ntransform:\n  __class_fullname__: Compose\n  transforms:\n"
        "  - __class_fullname__: NoSuchTransform\n    p: 1.0\n",
        "KeyError 'NoSuchTransform'",
    ),
}


def _run(tmp_path, *sets) -> tuple[int, str]:
    """``pipeprof run`` with the data cache in ``tmp_path``; (exit status, what it printed)."""
    argv = ["run"] + [
        a
        for s in (
            f"data.cache_dir={tmp_path}/datasets",
            "data.images=8",
            "data.classes=2",
            "loader.num_workers=[0]",
            *sets,
        )
        for a in ("--set", s)
    ]
    return main(argv), ""


@pytest.mark.parametrize("name", list(PRESETS))
def test_a_preset_albumentations_cannot_load_names_the_file_and_its_message(tmp_path, capfd, name):
    text, message = PRESETS[name]
    preset = tmp_path / name
    preset.write_text(text)
    code, _ = _run(tmp_path, f"augment.preset={preset}", f"out_dir={tmp_path}/out")
    err = capfd.readouterr().err
    assert code == 2 and f"augment.preset: {preset}: albumentations" in err and message in err
    assert "Traceback" not in err
    assert list((tmp_path / "out").iterdir()) == [] and not (tmp_path / "datasets").exists()  # nothing made


@pytest.mark.parametrize(
    "field, path, message",
    [
        ("model.name", "nosuch.mod:fn", "model.name: cannot import 'nosuch.mod:fn': ModuleNotFoundError"),
        ("model.loss", "os:sep", "model.loss: 'os:sep' is a str, not a function or class"),
        (
            "data.factory",
            "pipeprof.checks.calibrate:no_such_dataset",
            "data.factory: cannot import 'pipeprof.checks.calibrate:no_such_dataset': AttributeError",
        ),
    ],
)
def test_an_import_path_that_does_not_import_fails_at_validation(tmp_path, capfd, field, path, message):
    sets = [f"{field}={path}", f"out_dir={tmp_path}/out"] + (["data.kind=factory"] if field == "data.factory" else [])
    code, _ = _run(tmp_path, *sets)
    err = capfd.readouterr().err
    assert code == 2 and message in err and "invalid config" in err
    assert not (tmp_path / "out").exists()  # refused at validation: not even out_dir was made


@contextlib.contextmanager
def read_only(folder: Path):
    """``folder`` that not even this process may write to: immutable for root (which ignores modes)."""
    folder.mkdir()
    if os.geteuid() == 0:
        if subprocess.run(["chattr", "+i", str(folder)], capture_output=True).returncode != 0:
            pytest.skip("running as root on a filesystem without chattr +i: no folder is read-only to root")
        undo = ["chattr", "-i", str(folder)]
    else:
        folder.chmod(0o555)
        undo = ["chmod", "755", str(folder)]
    try:
        yield folder
    finally:
        subprocess.run(undo, check=True)


def test_out_dir_that_cannot_hold_a_run_is_named_before_anything_runs(tmp_path, capfd):
    (tmp_path / "afile").write_text("a file where the folder should be")
    cases = {
        f"{tmp_path}/afile": "a file, not a folder, has that name",
        f"{tmp_path}/afile/sub/runs": "a file stands where a folder of its path should be",
    }
    with read_only(tmp_path / "ro") as ro:
        cases |= {str(ro): "no permission to write there", f"{ro}/missing/runs": "no permission to write there"}
        for out_dir, why in cases.items():
            code, _ = _run(tmp_path, f"out_dir={out_dir}")
            err = capfd.readouterr().err
            assert code == 2 and f"out_dir: {out_dir} cannot hold run folders: {why}" in err, err
            assert "Traceback" not in err
        assert list(ro.iterdir()) == []
    assert not (tmp_path / "datasets").exists()  # checked before the synthetic dataset was made


@pytest.mark.parametrize(
    "damage, names, shown",
    [
        ("truncate run.json", "run.json: not valid JSON", "Trials as measured (no analysis saved)"),
        ("list in run.json", "run.json: expected a JSON object, got list", "Trials as measured (no analysis saved)"),
        ("delete trials.parquet", "trials.parquet: missing: no trial table", "prediction accuracy"),
        ("truncate trials.parquet", "trials.parquet: cannot be read", "prediction accuracy"),
    ],
)
def test_report_on_a_damaged_run_folder_names_the_file_shows_the_rest_and_exits_2(
    tmp_path, capfd, damage, names, shown
):
    run = tmp_path / "run"
    shutil.copytree(OLD_RUN, run)
    meta, trials = run / "run.json", run / "trials.parquet"
    {
        "truncate run.json": lambda: meta.write_text(meta.read_text()[:300]),
        "list in run.json": lambda: meta.write_text(json.dumps([1, 2])),
        "delete trials.parquet": trials.unlink,
        "truncate trials.parquet": lambda: trials.write_bytes(trials.read_bytes()[:200]),
    }[damage]()
    code = main(["report", str(run), "--full"])
    out, err = capfd.readouterr()
    assert code == 2 and f"pipeprof report: {run}/{names}" in err and "Traceback" not in err
    assert shown in out  # what could be read is reported


def test_profile_takes_every_config_section_and_its_shortcuts_win(tmp_path):
    class Tiny(nn.Module):
        def __init__(self):
            super().__init__()
            self.fc = nn.LazyLinear(7)  # a lazy module: initialised by the probe's forward pass

        def forward(self, x):
            return self.fc(x.float().flatten(1))

    run = pipeprof.profile(
        model=Tiny(),
        batch_size=4,
        num_workers=[0],
        trials=["gpu_ceiling"],
        log=lambda *a: None,
        config={
            "model": {"num_classes": 7, "mode": "inference", "name": "resnet18"},
            "loader": {"pin_memory": False, "batch_size": 16},
            "device": "cpu",
            "out_dir": str(tmp_path),
            "measure": {"warmup_s": 0.1, "window_s": 0.2, "windows": 2, "cpu_reference_s": 0},
        },
        mode="train",
        measure={"window_batches": 2},
        data={"images": 8, "classes": 2, "cache_dir": str(tmp_path / "ds")},
    )
    cfg = run.meta["config"]
    assert cfg["model"]["num_classes"] == 7 and cfg["loader"]["pin_memory"] is False  # sections from config=
    assert cfg["model"]["name"] == ["user:Tiny"] and cfg["model"]["mode"] in ("train", ["train"])  # the keywords win
    assert cfg["loader"]["batch_size"] == [4] and cfg["name"] == "profile"
    assert cfg["measure"]["window_batches"] == 2 and cfg["measure"]["window_s"] == 0.2  # measure= merged into it
    assert cfg["data"]["images"] == 8 and run.path.parent == tmp_path
    (row,) = run.trials.itertuples()
    assert row.status == "ok" and row.samples_per_s > 0
