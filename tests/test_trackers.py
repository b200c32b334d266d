"""A stored run written to TensorBoard and MLflow (``pipeprof report RUN --to ...``), read back with each
library's own reader: the scalars, params and artifacts a team would see."""

import importlib.util
import shutil
from pathlib import Path

import pytest

from pipeprof.cli import main
from pipeprof.report.trackers import export, scalars
from pipeprof.results import load_run

DATA = Path(__file__).parent / "data" / "run-cpu-files"


@pytest.fixture()
def run(tmp_path):
    shutil.copytree(DATA, tmp_path / "run-cpu-files")
    return load_run(tmp_path / "run-cpu-files")


def test_tensorboard_holds_every_trials_rate_at_its_worker_count_and_the_timeline(run, tmp_path, capsys):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    assert main(["report", str(run.path), "--to", "tensorboard", str(tmp_path / "tb")]) == 0
    assert f"wrote tensorboard: {tmp_path / 'tb' / run.path.name}" in capsys.readouterr().out
    events = EventAccumulator(str(tmp_path / "tb" / run.path.name), size_guidance={"scalars": 0}).Reload()
    tags = events.Tags()["scalars"]
    curve = {e.step: e.value for e in events.Scalars("cpu_pipeline/samples_per_s")}
    ok = run.trials[(run.trials["kind"] == "cpu_pipeline") & (run.trials["status"] == "ok")]
    # one point per worker count (the last trial at a count, as a line over counts shows it)
    assert curve == pytest.approx({int(w): r for w, r in zip(ok["num_workers"], ok["samples_per_s"])})
    assert "end_to_end/data_wait_frac" in tags and "answer/recommended_workers" in tags
    answer = events.Scalars("answer/recommended_workers")[0].value
    assert answer == run.meta["analysis"]["groups"][0].workers
    timeline = events.Scalars("timeline/cpu_util_pct")
    assert len(timeline) == run.timeline["cpu_util_pct"].notna().sum()
    assert timeline[0].wall_time == pytest.approx(run.meta["started"] + run.timeline["t_s"].iloc[0], abs=1e-3)


def test_mlflow_holds_the_config_the_metrics_and_the_report(run, tmp_path, capsys, monkeypatch):
    from mlflow.tracking import MlflowClient

    monkeypatch.chdir(tmp_path / "run-cpu-files")  # the artifacts go beside the store, not where the command ran

    (run.path / "report.html").write_text("<html>report</html>")
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    assert main(["report", str(run.path), "--to", "mlflow", uri]) == 0
    assert f"wrote mlflow: {uri} (run " in capsys.readouterr().out
    client = MlflowClient(uri)
    [found] = client.search_runs([client.get_experiment_by_name("pipeprof").experiment_id])
    assert found.info.run_name == run.path.name
    assert found.data.params["model.name"] == str(run.meta["config"]["model"]["name"])  # a sweep axis: a list
    assert found.data.params["augment.preset"] == str(run.meta["config"]["augment"]["preset"])
    e2e = run.trials[(run.trials["kind"] == "end_to_end") & (run.trials["status"] == "ok")]
    history = client.get_metric_history(found.info.run_id, "end_to_end/samples_per_s")
    got = {m.step: m.value for m in history}
    assert got == pytest.approx({int(w): r for w, r in zip(e2e["num_workers"], e2e["samples_per_s"])})
    assert {a.path for a in client.list_artifacts(found.info.run_id)} == {"report.html", "run.json"}
    assert (tmp_path / "mlartifacts").is_dir() and not (tmp_path / "run-cpu-files" / "mlruns").exists()


def test_a_tracker_without_its_extra_or_its_place_is_a_clear_error(run, tmp_path):
    if importlib.util.find_spec("wandb") is None:
        with pytest.raises(ValueError, match=r"--to wandb needs the wandb extra: pip install 'pipeprof\[wandb\]'"):
            export(run, "wandb", str(tmp_path))
    with pytest.raises(ValueError, match="needs a directory to write to"):
        export(run, "tensorboard")
    with pytest.raises(ValueError, match="unknown tracker 'neptune'; available: tensorboard, mlflow, wandb"):
        export(run, "neptune", str(tmp_path))


def test_the_scalars_are_the_trials_figures(run):
    found = {(s.tag, s.step): s.value for s in scalars(run)}
    row = run.trials[run.trials["kind"] == "end_to_end"].iloc[-1]
    assert found[("end_to_end/data_wait_frac", int(row["num_workers"]))] == pytest.approx(row["data_wait_frac"])
