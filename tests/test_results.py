"""Run folders across versions: an older schema loads and reports; a newer one says what it needs."""

import json
import shutil
from pathlib import Path

import pytest

from pipeprof.cli import main
from pipeprof.results import load_run
from pipeprof.schema import SCHEMA_VERSION

OLD = Path(__file__).parent / "data" / "run-schema1"  # written by pipeprof before run folders had a schema


def test_a_schema_1_run_loads_with_its_own_analysis_as_curve_rows():
    run = load_run(OLD)
    assert run.meta["upgraded_from_schema"] == 1 and run.meta["schema_version"] == SCHEMA_VERSION
    curves = run.meta["analysis"]["curves"]
    stored = json.loads((OLD / "run.json").read_text())["analysis"]["verdicts"]
    # the rows are the old run's own verdicts and predictions, not today's analysis of its trials
    assert [r["verdict"] for r in curves] == [v["verdict"] for v in stored]
    assert [r["predicted_samples_per_s"] for r in curves] == [v["predicted_samples_per_s"] for v in stored]
    assert [r["step_bound_samples_per_s"] for r in curves] == [v["gpu_bound_samples_per_s"] for v in stored]
    assert all(r["samples_per_s_cv"] is not None for r in curves)  # joined from its trials.parquet


def test_report_prints_a_schema_1_run(capsys):
    assert main(["report", str(OLD)]) == 0
    out = capsys.readouterr().out
    stored = json.loads((OLD / "run.json").read_text())["analysis"]
    assert "mobilenet_v3_small fp32 · light · batch 4" in out
    for v in stored["verdicts"]:
        assert v["verdict"] in out


def test_a_newer_schema_is_refused_with_the_version_it_needs(tmp_path, capsys):
    newer = tmp_path / "run"
    shutil.copytree(OLD, newer)
    meta = json.loads((newer / "run.json").read_text()) | {"schema_version": SCHEMA_VERSION + 1}
    (newer / "run.json").write_text(json.dumps(meta))
    assert main(["report", str(newer)]) == 2
    err = capsys.readouterr().err
    assert f"schema {SCHEMA_VERSION + 1}" in err and f"reads schema {SCHEMA_VERSION}" in err


@pytest.mark.parametrize("content, says", [("{not json", "not valid JSON"), ("[1, 2]", "expected a JSON object")])
def test_a_broken_run_json_is_named(tmp_path, capsys, content, says):
    (tmp_path / "run.json").write_text(content)
    assert main(["report", str(tmp_path)]) == 2
    err = capsys.readouterr().err
    assert "run.json" in err and says in err


@pytest.mark.parametrize(
    "fmt, marks", [("markdown", ["| samples/s |", "## Recommendations"]), ("text", ["samples/s", "→ "])]
)
def test_each_registered_renderer_formats_the_stored_run(fmt, marks, capsys):
    assert main(["report", str(OLD), "--format", fmt]) == 0
    out = capsys.readouterr().out
    assert all(m in out for m in marks)
    assert main(["report", str(OLD), "--format", "pdf"]) == 2
    assert "available: text, markdown" in capsys.readouterr().err
