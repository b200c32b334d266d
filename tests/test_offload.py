"""Offloading the pipeline to remote CPUs: the model on known numbers (``analysis.offload``), ``pipeprof size
--offload`` on real runs, and the two-node check on a local Ray cluster of two nodes (``checks.offload_check``)."""

from __future__ import annotations

import math
from pathlib import Path
from types import SimpleNamespace

import pandas as pd
import psutil
import pytest
import yaml

from pipeprof.analysis import offload
from pipeprof.analysis.offload import Inputs, Rate

BYTES = 224 * 224 * 3  # a uint8 224-px sample


def known(**kw) -> Inputs:
    """100 samples/s a Ray CPU (80-125), measured up to 4 CPUs; a 1,000 samples/s step; 5,000 samples/s ingest."""
    base = dict(
        workload="known",
        step=Rate(1000.0, 900.0, 1100.0),
        scaling={},
        cpu_limit=1,
        per_cpu=Rate(100.0, 80.0, 125.0),
        ray_cpu_s=0.008,
        max_cpu_limit=4,
        curve=((1, 100.0), (2, 190.0), (4, 360.0)),
        bytes_per_sample=float(BYTES),
        ingest=Rate(5000.0, 4500.0, 5500.0),
        ingest_limit=4,
        carry_cpu_s=0.001,
        loader_cpu_s=0.007,
        loader_workers=1,
        ray_version="2.60.0",
        ray_nodes=1,
    )
    return Inputs(**(base | kw))


def test_the_cores_reach_the_target_at_the_measured_rate_a_cpu():
    # 90% of 1,000 samples/s at 100 a CPU: 9 cores (8 at the interval's 125, 12 at its 80), one node of 32
    r = offload.size_row(known(), 1, 0.9, 25, 32)
    assert (r.cores, r.cores_low, r.cores_high, r.nodes) == (9, 8, 12, 1)
    assert r.binding == "cpu" and r.target_samples_per_s == pytest.approx(900)
    assert r.delivered_samples_per_s == pytest.approx(900) and r.of_ceiling_frac == pytest.approx(0.9)
    assert r.network_samples_per_s == pytest.approx(25e9 / 8 / BYTES)  # 20,760 samples/s
    # 9 cores are past the 4 the run measured: extrapolated, and said so
    assert r.extrapolated and "9 cores past the 4 measured" in r.note
    # 8 GPUs: 7,200 samples/s, 72 cores, 3 nodes of 32 (2 of 36); GPUs past the one measured, linear scaling assumed
    r8 = offload.size_row(known(), 8, 0.9, 25, 32)
    assert (r8.cores, r8.nodes, r8.binding) == (72, 3, "cpu")
    assert offload.size_row(known(), 8, 0.9, 25, 36).nodes == 2
    assert r8.ingest_samples_per_s == pytest.approx(40_000) and "8 GPUs" in r8.note


def test_within_what_was_measured_nothing_is_extrapolated():
    x = known(max_cpu_limit=16, step=Rate(500.0, 450.0, 550.0))
    r = offload.size_row(x, 1, 0.9, 25, 32)
    assert r.cores == 5 and not r.extrapolated and r.note == ""
    # a measured 2-GPU scaling of 0.9: 2 x 500 x 0.9 = 900 samples/s the GPUs take, not extrapolated
    r2 = offload.size_row(x._replace(scaling={2: 0.9}), 2, 0.9, 25, 32)
    assert r2.gpus_samples_per_s == pytest.approx(900) and r2.cores == 9 and not r2.extrapolated


def test_the_binding_limit_moves_from_cpu_to_network_to_ingest():
    x = known()
    # a 1 Gb/s link carries 1e9 / 8 / 150,528 = 830.4 samples/s, short of the 900 wanted: the network binds, and
    # the cores are those that feed what it carries (9, at 100 a CPU); the GPUs get 83% of their ceiling
    net = offload.size_row(x, 1, 0.9, 1, 32)
    carried = 1e9 / 8 / BYTES
    assert net.binding == "network" and net.network_samples_per_s == pytest.approx(carried)
    assert net.cores == 9 and net.delivered_samples_per_s == pytest.approx(carried)
    assert net.of_ceiling_frac == pytest.approx(carried / 1000)
    # an ingest of 500 samples/s a training process: 5 cores feed it, the GPUs get half their ceiling
    slow = x._replace(ingest=Rate(500.0, 450.0, 550.0))
    ing = offload.size_row(slow, 1, 0.9, 25, 32)
    assert (ing.binding, ing.cores, ing.of_ceiling_frac) == ("ingest", 5, pytest.approx(0.5))
    # two GPUs, two training processes: 1,000 samples/s of ingest against 1,800 wanted, 10 cores
    two = offload.size_row(slow, 2, 0.9, 25, 32)
    assert (two.cores, two.binding) == (10, "ingest")
    # the slower of the two binds when both stop short (a 1 Gb/s link's 830 against 500 of ingest)
    assert offload.size_row(slow, 1, 0.9, 1, 32).binding == "ingest"
    # with the hand-off not measured, the ingest never binds, and the row says it was not measured
    free = offload.size_row(x._replace(ingest=None), 8, 0.9, 25, 32)
    assert free.binding == "cpu" and math.isinf(free.ingest_samples_per_s) and "ingest not measured" in free.note


def test_the_two_node_prediction_is_the_one_cpu_run_scaled_under_the_ingest():
    assert offload.predict(known(), 2) == (200.0, "cpu")
    assert offload.predict(known(ingest=Rate(150.0, 140.0, 160.0)), 2) == (150.0, "ingest")
    # the line against the measured curve above the 1-CPU limit: 190 and 360 measured, 200 and 400 on the line
    assert offload.line_check(known()) == [(2, 190.0, 200.0), (4, 360.0, 400.0)]
    assert offload.busy_frac(100.0, 0.008, 1) == pytest.approx(0.8)


# --- reading runs: which is which, and what is missing --------------------------------------------------------


def _pipe(**kw) -> dict:
    return dict(kind="cpu_pipeline", status="ok", preset="light", decoder="pil", batch_size=4, image_size=224) | kw


def _ray_run(path="ray-run") -> SimpleNamespace:
    rows = [
        _pipe(
            engine="ray",
            num_workers=n,
            ray_cpu_limit=n,
            samples_per_s=rate,
            samples_per_s_ci95_low=rate * 0.9,
            samples_per_s_ci95_high=rate * 1.1,
            ray_actor_cpu_s_per_sample=cost,
            batch_bytes_per_sample=float(BYTES + 8),
            ray_version="2.60.0",
            ray_nodes=1,
        )
        for n, rate, cost in ((1, 120.0, 0.006), (2, 200.0, 0.005))
    ]
    rows.append(
        _pipe(
            kind="handoff",
            engine="ray",
            num_workers=2,
            ray_cpu_limit=2,
            samples_per_s=900.0,
            ray_actor_cpu_s_per_sample=0.0012,
        )
    )
    return SimpleNamespace(trials=pd.DataFrame(rows), path=Path(path))


def _loader_run(path="loader-run") -> SimpleNamespace:
    rows = [
        dict(
            kind="gpu_ceiling",
            status="ok",
            model="m",
            precision="fp32",
            mode="train",
            batch_size=4,
            image_size=224,
            gpus=1,
            samples_per_s=400.0,
            samples_per_s_ci95_low=380.0,
            samples_per_s_ci95_high=420.0,
        ),
        _pipe(num_workers=0, samples_per_s=90.0, workers_cpu_pct_mean=0.0),
        _pipe(num_workers=1, samples_per_s=150.0, workers_cpu_pct_mean=75.0),
        _pipe(num_workers=2, samples_per_s=280.0, workers_cpu_pct_mean=150.0),
    ]
    return SimpleNamespace(trials=pd.DataFrame(rows), path=Path(path))


@pytest.mark.parametrize("order", [0, 1])
def test_the_runs_are_told_apart_by_their_rows_in_either_order(order):
    runs = [_ray_run(), _loader_run()][:: 1 if order == 0 else -1]
    x = offload.inputs(runs)
    # the Ray run's 1-CPU trial: 120 samples/s a CPU (108-132), 6 ms of actor CPU a sample; measured up to 2 CPUs
    assert (x.cpu_limit, x.per_cpu, x.ray_cpu_s, x.max_cpu_limit) == (1, Rate(120.0, 108.0, 132.0), 0.006, 2)
    assert x.curve == ((1, 120.0), (2, 200.0)) and x.bytes_per_sample == BYTES + 8
    # the hand-off at its largest limit, its actors' CPU a sample Ray's cost of carrying one
    assert x.ingest == Rate(900.0, 900.0, 900.0) and x.ingest_limit == 2 and x.carry_cpu_s == 0.0012
    # the step from the DataLoader run (the Ray run measured none); the DataLoader workers' CPU at 1 worker:
    # 75% of a core at 150 samples/s is 5 ms a sample (0 workers is no worker's)
    assert x.step == Rate(400.0, 380.0, 420.0) and x.workload == "m fp32 light bs4"
    assert (x.loader_cpu_s, x.loader_workers) == (pytest.approx(0.005), 1) and x.notes == ()


def test_a_missing_run_is_named():
    with pytest.raises(ValueError, match="needs a Ray run.*no Ray run among loader-run"):
        offload.inputs([_loader_run()])
    with pytest.raises(ValueError, match="needs a DataLoader run.*no DataLoader run among ray-run"):
        offload.inputs([_ray_run()])
    with pytest.raises(ValueError, match="not 2 Ray runs \\(a, b\\)"):
        offload.inputs([_ray_run("a"), _ray_run("b"), _loader_run()])
    no_step = _loader_run()
    no_step.trials = no_step.trials[no_step.trials["kind"] != "gpu_ceiling"]
    with pytest.raises(ValueError, match="no gpu_ceiling trial at batch 4 in ray-run or loader-run"):
        offload.inputs([_ray_run(), no_step])


def test_a_dataloader_run_of_another_pipeline_is_noted():
    other = _loader_run()
    other.trials["preset"] = other.trials["preset"].where(other.trials["kind"] == "gpu_ceiling", "heavy")
    x = offload.inputs([_ray_run(), other])
    assert x.loader_cpu_s == pytest.approx(0.005) and "preset heavy" in x.notes[0] and "preset light" in x.notes[0]


def test_the_table_renders_each_row_and_the_binding():
    from pipeprof.report.offload import render_offload

    x = known()
    rows = offload.table(x, [1, 8, 32], 0.9, 25, 32)
    text = render_offload(x, rows, 0.9, 25, 32)
    assert "per-sample CPU: Ray actors 8.00 ms (at 1 CPU), DataLoader workers 7.00 ms (1 worker): Ray +14%" in text
    assert "at 2 CPUs the run measured 190.0, the line 200.0 (+5%)" in text
    # 32 GPUs want 28,800 samples/s; the link carries 20,760: the network binds from 32 GPUs
    assert "| 32 | 32,000.0 | 28,800.0 | 20,760 | 160,000.0 | 208 (167–260) | 7 | 20,760.3 | 65% | network |" in text
    assert "from 32 GPUs a node the network binds" in text


# --- real runs: the two-node check on a local Ray cluster, and size --offload on its runs ---------------------

#: the check's runs, short: a 16-image folder, batches of 16, three windows of 0.4 s (at most four)
TINY = dict(preset="light", batch_size=16, images=16)
MEASURE = {
    "warmup_s": 0.3,
    "window_s": 0.4,
    "window_batches": 2,
    "windows": 3,
    "max_windows": 4,
    "ci_target": 0.1,
    "redraws": 10,
    "cpu_reference_s": 0,
}


@pytest.fixture(scope="module")
def two_nodes(tmp_path_factory):
    """The two-node check, measured once, alone (its rates are the machine's whole): a DataLoader run made here in
    this process (the check's own child would be the same run after one more interpreter start), then the check's
    one-node and two-node Ray runs on a local cluster it starts and stops."""
    pytest.importorskip("ray")
    import pipeprof
    from conftest import measured_once
    from pipeprof.checks import offload_check

    def make(out: Path):
        config = out / "loader.yaml"
        made = offload_check.config(TINY["preset"], TINY["batch_size"], TINY["images"], str(out / "datasets"), MEASURE)
        config.write_text(yaml.safe_dump(made))
        sets = [f"out_dir={out}", "name=loader", "trials=[gpu_ceiling,cpu_pipeline]", "loader.num_workers=[1]"]
        loader = pipeprof.run(config, sets, log=lambda *a: None)
        return offload_check.check(out / "check", loader_run=str(loader.path), measure=MEASURE, **TINY)

    return measured_once("offload_check", make, tmp_path_factory)


@pytest.mark.alone  # it makes the check's runs (every core is what they share), in the alone tests
@pytest.mark.slow
@pytest.mark.cluster  # out of the default run (pyproject's addopts): `pytest -m cluster tests/test_offload.py`
def test_the_two_node_check_runs_on_two_nodes_and_stops_its_cluster(two_nodes):
    from pipeprof.checks import offload_check
    from pipeprof.results import load_measured

    r = two_nodes
    # one node of 1 CPU, then two of 1 CPU each, the two-node trial's actors on both
    assert (r.one.nodes, r.one.node_cpus, r.one.actor_nodes) == (1, "1", 1)
    assert (r.two.nodes, r.two.node_cpus, r.two.actor_nodes) == (2, "1,1", 2)
    # the prediction is the 1-CPU run's rate twice, under the hand-off, both read off the one-node run's rows
    t = load_measured(r.one.run).trials
    one = float(t.loc[t["kind"] == "cpu_pipeline", "samples_per_s"].iloc[0])
    handoff = float(t.loc[t["kind"] == "handoff", "samples_per_s"].iloc[0])
    assert r.predicted_samples_per_s == pytest.approx(min(2 * one, handoff))
    assert r.binding == ("cpu" if 2 * one <= handoff else "ingest")
    assert r.error_frac == pytest.approx(r.predicted_samples_per_s / r.two.rate.value - 1)
    assert r.passed == (abs(r.error_frac) <= offload_check.TARGET_ERR)
    if r.binding == "cpu":  # the miss's two factors multiply back to it
        assert r.busy_factor * r.cost_factor == pytest.approx(1 + r.error_frac)
    for s in (r.one, r.two):
        assert s.rate.low <= s.rate.value <= s.rate.high and 0 < s.busy_frac <= 1.05
    # each sample's CPU both ways, measured: carrying a prebuilt batch (the hand-off's actors) costs less than
    # reading, decoding and augmenting one, side by side in the same run
    assert r.loader_cpu_s > 0 and 0 < r.carry_cpu_s < r.one.cpu_s
    # the cluster stopped: none of its processes is left (its nodes' ray start and what they started)
    assert len(r.cluster_pids) >= 4
    left = [p for p in r.cluster_pids if psutil.pid_exists(p) and psutil.Process(p).status() != psutil.STATUS_ZOMBIE]
    assert left == []
    text = offload_check.render(r)
    assert "predicted for two nodes (the 1-CPU run x 2" in text and "| two nodes | 2 (1,1) | 2 | 2 |" in text
    assert f"pipeprof size --offload {r.one.run} {r.loader_run}" in text


def _size(args, capsys) -> tuple[int, str, str]:
    from pipeprof.cli import main

    rc = main(["size", *args])
    out, err = capsys.readouterr()
    return rc, out, err


def test_size_offload_reads_a_dataloader_run_and_a_ray_run_in_either_order(two_nodes, capsys):
    ray_run, loader_run = two_nodes.one.run, two_nodes.loader_run
    rc, text, _ = _size(["--offload", ray_run, loader_run, "--gpus", "1,8", "--link-gbps", "1"], capsys)
    assert rc == 0
    assert _size(["--offload", loader_run, ray_run, "--gpus", "1,8", "--link-gbps", "1"], capsys)[1] == text
    # the rows, from the runs' own rows: the step's ceiling (the DataLoader run's), a Ray CPU's rate (the 1-CPU
    # trial's), the hand-off, the bytes a sample over a 1 Gb/s link
    from pipeprof.results import load_measured

    ray_t, loader_t = load_measured(ray_run).trials, load_measured(loader_run).trials
    step = float(loader_t.loc[loader_t["kind"] == "gpu_ceiling", "samples_per_s"].iloc[0])
    pipe = ray_t[ray_t["kind"] == "cpu_pipeline"].iloc[0]
    handoff = float(ray_t.loc[ray_t["kind"] == "handoff", "samples_per_s"].iloc[0])
    link = 1e9 / 8 / float(pipe["batch_bytes_per_sample"])
    for g in (1, 8):
        want = 0.9 * g * step
        limits = {"network": link, "ingest": g * handoff}
        reach = min(want, *limits.values())
        binding = "cpu" if reach >= want else min(limits, key=limits.get)
        cores = math.ceil(reach / float(pipe["samples_per_s"]) - 1e-9)
        row = next(line for line in text.splitlines() if line.startswith(f"| {g} |"))
        cells = [c.strip() for c in row.strip("|").split("|")]
        assert cells[2] == f"{want:,.1f}" and cells[5].split()[0] == str(cores) and cells[9] == binding, (g, row)
        assert cells[6] == str(math.ceil(cores / 32))
    # each sample's CPU both ways: the actors' at 1 CPU, the DataLoader workers' at 1 worker (their CPU over the rate)
    loader = loader_t[(loader_t["kind"] == "cpu_pipeline") & (loader_t["num_workers"] == 1)].iloc[0]
    ray_ms, loader_ms = (
        pipe["ray_actor_cpu_s_per_sample"] * 1e3,
        loader["workers_cpu_pct_mean"] / 100 / loader["samples_per_s"] * 1e3,
    )
    assert f"Ray actors {ray_ms:.2f} ms (at 1 CPU), DataLoader workers {loader_ms:.2f} ms (1 worker)" in text


def test_size_offload_names_the_missing_run(two_nodes, capsys):
    rc, _, err = _size(["--offload", two_nodes.loader_run], capsys)
    assert rc == 2 and f"no Ray run among {two_nodes.loader_run}" in err
    rc, _, err = _size(["--offload", two_nodes.one.run], capsys)
    assert rc == 2 and f"no DataLoader run among {two_nodes.one.run}" in err
    rc, _, err = _size(["--offload", two_nodes.one.run, two_nodes.loader_run, "--cores", "8"], capsys)
    assert rc == 2 and "--machines and --cores" in err
