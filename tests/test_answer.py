"""A group's answer, typed (``pipeprof.answer``): its stored form round-trips, through a run folder too; an
older run folder's groups load as answers; a newer schema is still refused."""

import json
import shutil
from pathlib import Path

import pandas as pd
import pytest

from pipeprof.answer import Answer, Confidence, CoresNeeded, Recommendation
from pipeprof.results import Run, SchemaError, load_run, upgrade
from pipeprof.schema import SCHEMA_VERSION

DATA = Path(__file__).parent / "data"
KEY = {
    "model": "resnet50",
    "precision": "bf16",
    "mode": "train",
    "preset": "standard",
    "batch_size": 256,
    "source": "files",
    "cache_state": "warm",
    "gpus": 1,
    "p2p": None,
}
# one group as run.json stores it (schema 2 and 3 alike): its settings beside the answer's fields
STORED = KEY | {
    "recommended_workers": 14,
    "recommended_samples_per_s": 3358.0,
    "best_workers": 16,
    "best_samples_per_s": 3400.0,
    "tied_with_best": [14, 16],
    "criterion": "smallest num_workers within 5% of the best",
    "confidence": {
        "draws": 30,
        "workers_low": 12,
        "workers_high": 16,
        "workers_share": 0.97,
        "recommended_share": 0.6,
        "side": "input",
        "resource": "cores",
        "side_share": 1.0,
        "answer_share": 0.9,
        "alternatives": [{"side": "input", "resource": "handoff", "share": 0.1}],
        "holds": True,
    },
    "actions": [{"id": "decoder", "action": "decode with cv2", "gain_frac": 0.2}],
    "main_cpu_s_per_sample": 0.0002,
    "cores_needed": {
        "cores_needed": 17,
        "workers_needed": 15.2,
        "extrapolated": False,
        "handoff_limit": None,
        "handoff_straddles": False,
        "basis": "15.2 workers reach the step's 4,700 samples/s",
    },
    "what_if": [{"gpus": 1, "cores": 8, "predicted_samples_per_s": 2000.0, "binding": "cpu"}],
    "verdict_at_recommended": "cores-bound",
    "side_at_recommended": "input",
    "resource_at_recommended": "cores",
    "also_at_recommended": ["handoff"],
    "basis_at_recommended": "14 workers keep the cores busy",
    "best_measured_action": {"id": "decoder", "measured_gain_frac": 0.18},
}


def test_an_answer_reads_its_stored_form_into_fields_and_writes_it_back_unchanged():
    a = Answer.from_dict(STORED)
    assert a.key == KEY and (a.workers, a.samples_per_s, a.best_workers) == (14, 3358.0, 16)
    assert (a.verdict, a.side, a.resource, a.also) == ("cores-bound", "input", "cores", ["handoff"])
    assert isinstance(a.confidence, Confidence) and a.confidence.holds and a.workers_range == (12, 16)
    assert isinstance(a.cores_needed, CoresNeeded) and a.cores_needed.cores == 17
    assert a.best_measured_action["id"] == "decoder" and a.extra == {}
    assert a.to_dict() == STORED and Answer.from_dict(a.to_dict()) == a


def test_a_key_a_newer_pipeprof_stored_survives_the_round_trip():
    newer = STORED | {"a_field_from_later": {"x": 1}}
    newer["cores_needed"] = STORED["cores_needed"] | {"its_own_new_field": 2}
    a = Answer.from_dict(newer)
    assert a.extra == {"a_field_from_later": {"x": 1}} and a.cores_needed.extra == {"its_own_new_field": 2}
    assert a.to_dict() == newer


def test_what_the_analysis_leaves_out_stays_out():
    """A run without re-draws, verdicts or GPU figures stores only what it has (as before the Answer)."""
    bare = {
        "model": "m",
        "precision": "fp32",
        "preset": "light",
        "batch_size": 4,
        "recommended_workers": 0,
        "recommended_samples_per_s": 40.0,
        "best_workers": 0,
        "best_samples_per_s": 40.0,
        "tied_with_best": [0],
        "criterion": "c",
        "confidence": {"draws": 0},
        "actions": [],
        "main_cpu_s_per_sample": 0.03,
        "cpu_figures_skipped": "no GPU",
    }
    a = Answer.from_dict(bare)
    assert a.cores_needed is None and a.side is None and a.confidence == Confidence(draws=0)
    assert a.workers_range == (0, 0) and a.to_dict() == bare
    pick = Recommendation.from_dict(bare)
    assert (
        Answer.from_parts(
            a.key, pick, confidence=a.confidence, main_cpu_s_per_sample=0.03, cpu_figures_skipped="no GPU"
        )
        == a
    )


def test_answers_round_trip_through_a_saved_run_folder(tmp_path):
    a = Answer.from_dict(STORED)
    run = Run(
        tmp_path,
        meta={"schema_version": SCHEMA_VERSION, "status": "complete", "analysis": {"groups": [a], "curves": []}},
    )
    run.save_meta()
    run.save_trials([{"trial_id": "t", "kind": "end_to_end", "status": "ok", "samples_per_s": 1.0}])
    assert json.loads((tmp_path / "run.json").read_text())["analysis"]["groups"] == [STORED]  # the flat dict
    (back,) = load_run(tmp_path).meta["analysis"]["groups"]
    assert back == a and "upgraded_from_schema" not in load_run(tmp_path).meta


def test_a_schema_2_run_folder_loads_its_groups_as_answers_and_renders(tmp_path, capsys):
    from pipeprof.cli import main

    old = DATA / "run-cpu-files"
    stored = json.loads((old / "run.json").read_text())
    assert stored["schema_version"] == 2
    run = load_run(old)
    assert run.meta["schema_version"] == SCHEMA_VERSION and run.meta["upgraded_from_schema"] == 2
    (a,) = run.meta["analysis"]["groups"]
    # stored before the answer's confidence existed: written back as none
    assert isinstance(a, Answer) and a.to_dict() == stored["analysis"]["groups"][0] | {"confidence": None}
    assert a.verdict == "cores-bound" and a.side is None and a.key["source"] == "files"
    # upgrade on the meta alone, as load_run calls it
    (b,) = upgrade(stored, pd.DataFrame())["analysis"]["groups"]
    assert b == a and isinstance(stored["analysis"]["groups"][0], dict)  # the stored meta is left as it was
    assert main(["report", str(old)]) == 0
    assert "set num_workers=1" in capsys.readouterr().out


def test_a_schema_1_run_folder_keeps_its_old_keys_in_extra():
    (a,) = load_run(DATA / "run-schema1").meta["analysis"]["groups"]
    assert a.verdict == "cpu-bound" and a.cores_needed.cores == 3 and a.confidence is None
    assert set(a.extra) == {"main_cores_step", "scaling"}


def test_a_newer_schema_still_raises(tmp_path):
    newer = tmp_path / "run"
    shutil.copytree(DATA / "run-cpu-files", newer)
    meta = json.loads((newer / "run.json").read_text()) | {"schema_version": SCHEMA_VERSION + 1}
    (newer / "run.json").write_text(json.dumps(meta))
    with pytest.raises(SchemaError, match=f"schema {SCHEMA_VERSION + 1}"):
        load_run(newer)
