"""No credential from the environment reaches any output: every file of a run folder (the bad-sample and
pre-flight records included), the console, `report`, `check-data` and `doctor --json`.

The commands run in this process, with the secrets in its environment (``os.environ``, where pipeprof and the
libraries it calls read them, and what its DataLoader workers inherit), and their output is read at the file
descriptors (``capfd``: the workers' writes too): the same code as five interpreters started for it, without
five starts of torch."""

import shutil

import pandas as pd

from pipeprof.cli import main

SECRETS = {
    "AWS_SECRET_ACCESS_KEY": "wJalrXUtnFEMI-pipeprof-test-secret-1",
    "AWS_ACCESS_KEY_ID": "AKIAPIPEPROFTEST0002",
    "GITHUB_TOKEN": "ghp_pipeprofTestToken0003",
    "HF_TOKEN": "hf_pipeprofTestToken0004",
}


def _pipeprof(capfd, *args) -> str:
    """What one command printed, to stdout and stderr."""
    main(list(map(str, args)))
    out, err = capfd.readouterr()
    return out + err


def _file_text(path) -> str:
    """A file's bytes as text, and for a parquet table also every cell (compression hides raw strings)."""
    text = path.read_bytes().decode("utf-8", "replace")
    if path.suffix == ".parquet":
        text += pd.read_parquet(path).astype(str).to_csv()
    return text


def test_no_environment_secret_reaches_any_output(tiny_dataset, tmp_path, monkeypatch, capfd):
    for name, value in SECRETS.items():
        monkeypatch.setenv(name, value)
    data = tmp_path / "data"
    shutil.copytree(tiny_dataset, data)
    (data / "class_000" / "broken.jpg").write_bytes(b"\xff\xd8 not really")  # a bad sample: its records too
    out = tmp_path / "out"
    sets = [
        "data.kind=folder",
        f"data.path={data}",
        f"out_dir={out}",
        "trials=[cpu_pipeline]",
        "loader.num_workers=[1]",
        "loader.batch_size=4",
        "data.max_bad_frac=0.5",
        "stage_timing=false",
        "measure.warmup_s=0.2",
        "measure.warmup_max_s=1",
        "measure.redraws=10",
        "measure.window_s=0.3",
        "measure.windows=2",
        "measure.cpu_reference_s=0",
    ]
    outputs = [_pipeprof(capfd, "run", *[a for s in sets for a in ("--set", s)])]
    (folder,) = list(out.iterdir())
    outputs += [
        _pipeprof(capfd, "report", folder),
        _pipeprof(capfd, "report", folder, "--format", "markdown"),
        _pipeprof(capfd, "check-data", data),
        _pipeprof(capfd, "doctor", "--json"),
    ]
    files = sorted(p for p in folder.rglob("*") if p.is_file())
    assert {p.name for p in files} >= {"run.json", "trials.parquet", "timeline.parquet", "summary.md"}
    assert "broken.jpg" in _file_text(folder / "trials.parquet")  # the bad sample was recorded ...
    assert "broken.jpg" in outputs[0] and "broken.jpg" in outputs[3]
    for text in outputs + [_file_text(p) for p in files]:  # ... and no secret was, anywhere
        assert not [name for name, value in SECRETS.items() if value in text]
