"""Sizing a workstation (``analysis.workstation``, ``pipeprof size``) on tables of known content: a CPU curve of
100 samples/s per worker up to 8 workers (the measuring machine's cores), a step of 1,000 samples/s."""

import math

import numpy as np
import pytest
import yaml

from pipeprof.analysis import workstation as ws
from pipeprof.cli import main

W = ws.Workload(
    "resnet50 bf16 standard",
    (1000.0, 950.0, 1050.0),
    np.array([1.0, 2.0, 4.0, 8.0]),
    np.array([100.0, 200.0, 400.0, 760.0]),  # per worker 100, then 95 at 8: a 5% fall-off over the last doubling
    np.array([90.0, 180.0, 360.0, 700.0]),
    np.array([110.0, 220.0, 440.0, 820.0]),
    0.0,  # no CPU in the training process: cores are the workers'
    8.0,
)


def test_a_candidate_within_the_measured_cores_reads_the_curve():
    r = ws.predict(W, ws.Candidate("4c", 4))
    assert r["samples_per_s"] == pytest.approx(400) and r["samples_per_s_low"] == pytest.approx(360)
    assert r["binding"] == "cpu" and r["of_ceiling_frac"] == pytest.approx(0.4) and not r["extrapolated"]


def test_past_the_measured_cores_the_figure_is_extrapolated_and_its_low_end_falls_by_the_measured_falloff():
    r = ws.predict(W, ws.Candidate("16c", 16))
    # 16 workers at the top's 95 per worker: 1,520, capped by the step's 1,000: GPU-bound
    assert r["binding"] == "gpu" and r["samples_per_s"] == pytest.approx(1000) and r["extrapolated"]
    # the low end: 16 x 700/8 = 1,400, times the fall-off (0.95) once for the doubling past 8
    assert r["of_ceiling_low_frac"] == pytest.approx(1.0)
    r12 = ws.predict(W, ws.Candidate("10c", 10))
    low = 10 * 700 / 8 * 0.95 ** math.log2(10 / 8)
    assert r12["of_ceiling_low_frac"] == pytest.approx(low / 1000) and r12["of_ceiling_frac"] == pytest.approx(0.95)


def test_a_row_at_the_ceiling_says_when_the_hand_off_was_not_measured():
    # 16 cores reach the step (1,000) without a hand-off trial: said; 4 cores (400) are far from it: not said
    assert "hand-off not measured" in ws.predict(W, ws.Candidate("16c", 16))["note"]
    assert "hand-off" not in ws.predict(W, ws.Candidate("4c", 4))["note"]
    capped = ws.predict(W._replace(cap=980.0), ws.Candidate("16c", 16))  # measured: it caps instead
    assert capped["samples_per_s"] == pytest.approx(980) and "hand-off" not in capped["note"]


def test_more_gpus_scale_the_ceiling_assumed_linear_unless_measured():
    two = ws.predict(W, ws.Candidate("16c2g", 16, gpus=2))
    assert two["gpu_scaling"] == "assumed linear" and two["binding"] == "cpu"
    assert two["samples_per_s"] == pytest.approx(16 * 95)
    measured = ws.predict(W._replace(scaling={2: 0.9}), ws.Candidate("32c2g", 32, gpus=2))
    assert measured["gpu_scaling"] == "measured" and measured["samples_per_s"] == pytest.approx(1800)


def test_price_per_sample_and_the_cheapest_that_reaches_the_target():
    cands = [
        ws.Candidate("small", 8, price=2000.0),
        ws.Candidate("mid", 12, price=2600.0),
        ws.Candidate("big", 16, price=3500.0),
    ]
    rows = ws.table([W], cands)
    assert rows.set_index("machine").loc["small", "samples_per_s_per_price"] == pytest.approx(760 / 2000)
    best = ws.cheapest(rows, 0.9)
    # 'mid' (12 cores): 12 x 95 = 1,140 capped at 1,000; its low end 12 x 87.5 x 0.95^0.585 = 1,019: reaches 90%
    assert best == {"resnet50 bf16 standard": "mid", "all workloads": "mid"}
    assert ws.cheapest(rows, 1.5) == {"resnet50 bf16 standard": None, "all workloads": None}
    from pipeprof.report.workstation import sentence

    line = sentence(rows, best, 0.9)[0]
    assert line.startswith("for resnet50 bf16 standard, mid keeps the GPUs at 100% of their ceiling")
    assert "small reaches 76%" in line


def test_a_lower_bound_in_percent_is_rounded_down_not_up_to_the_target():
    from pipeprof.report.workstation import at_least

    # 4,237.5 of a 4,716.1 ceiling is 89.85%: "at least 90%" would contradict a pick that found it short of 90%
    assert (at_least(4237.5 / 4716.1), at_least(0.9), at_least(1.0), at_least(0.0)) == ("89%", "90%", "100%", "0%")


def test_the_machines_file_is_checked_field_by_field():
    good = ws.parse_machines({"machines": [{"name": "ws-a", "cores": 24, "gpus": 2, "gpu": "H200", "price": 9e3}]})
    assert good == [ws.Candidate("ws-a", 24, 2, "H200", 1, 9000.0)]
    for bad, why in [
        ({"machines": []}, "a list 'machines:' of at least one machine"),
        ({"machines": [{"name": "x"}]}, r"machines\[0\] \(x\): 'cores' is required"),
        ({"machines": [{"cores": 0}]}, r"'cores' must be a whole number of at least 1, not 0"),
        ({"machines": [{"cores": 8, "price": -1}]}, r"'price' must be a positive number, not -1"),
        ({"machines": [{"cores": 8, "gpu_count": 2}]}, r"unknown field 'gpu_count'; a machine has name, cores"),
    ]:
        with pytest.raises(ValueError, match=why):
            ws.parse_machines(bad)


def gpu_run(tmp_path):
    """The stored CPU run's trials as a GPU run's folder would hold them (its config on cuda, its GPU named, the
    analysis's cores figures not skipped): what ``pipeprof size`` and the report's sizing read."""
    import json
    import shutil
    from pathlib import Path

    run = tmp_path / "gpu-run"
    shutil.copytree(Path(__file__).parent / "data" / "run-cpu-files", run)
    meta = json.loads((run / "run.json").read_text())
    meta["config"]["device"] = "cuda"
    meta["machine"]["gpus"] = [{"index": 0, "name": "NVIDIA H200"}]
    for g in meta["analysis"]["groups"]:
        g.pop("cpu_figures_skipped", None)
    (run / "run.json").write_text(json.dumps(meta))
    return run


NAME = "mobilenet_v3_small fp32 light bs4 files warm"


def test_size_reads_a_stored_run_and_prints_the_table(tmp_path, capsys):
    from pathlib import Path

    run = gpu_run(tmp_path)
    assert main(["size", str(run), "--cores", "1,2,4", "--gpus", "1,2"]) == 0
    out = capsys.readouterr().out
    assert f"| {NAME} | 4 cores, 2 GPUs |" in out and "extrapolated" in out
    machines = tmp_path / "m.yaml"
    machines.write_text(yaml.safe_dump({"machines": [{"name": "box", "cores": 2, "price": 1000, "gpu": "A100"}]}))
    assert main(["size", str(run), "--machines", str(machines)]) == 0
    box = [line for line in capsys.readouterr().out.splitlines() if "| box |" in line]
    assert len(box) == 1 and "this run's NVIDIA H200's, not measured on a A100" in box[0]  # another GPU: said
    machines.write_text(yaml.safe_dump({"machines": [{"name": "box"}]}))
    assert main(["size", str(run), "--machines", str(machines)]) == 2
    assert "'cores' is required" in capsys.readouterr().err
    # a CPU run's answers skip the cores figures (its step shares the cores): nothing to size, and why
    assert main(["size", str(Path(__file__).parent / "data" / "run-cpu-files"), "--cores", "4"]) == 2
    err = capsys.readouterr().err
    assert "no workload to size" in err and "no GPU" in err


def test_the_report_of_a_gpu_run_has_the_sizing_table_its_lines_and_plot(tmp_path):
    """A GPU run's report.html gains the candidate table at the report's core counts, the buyer's lines and the plot;
    a CPU run's, none (its answers skip the cores figures: a CPU step shares the cores)."""
    from pathlib import Path

    from pipeprof.report.html import render_html
    from pipeprof.results import load_run

    assert 'id="sizing"' not in render_html(load_run(Path(__file__).parent / "data" / "run-cpu-files"))
    page = render_html(load_run(gpu_run(tmp_path)))
    assert 'id="sizing"' in page and 'id="table-sizing"' in page and 'id="fig-sizing"' in page
    table = page[page.index('id="table-sizing"') :]
    assert ">32 cores, 1 GPU<" in table and ">extrapolated" in table  # past the 2 cores that run measured
    assert "hand-off not measured" in table  # at the step's ceiling, and that run had no hand-off trial
    # its step (the CPU's, 2 samples/s) is below what any candidate's cores feed: the fewest cores keep it busy
    assert f"for {NAME}, 4 cores, 1 GPU keeps the GPUs at 100% of their ceiling" in page


def test_validate_sizing_takes_its_masks_from_the_machines_file(tmp_path, capsys):
    """Each machine with fewer cores than this one is a mask; a file with none is refused before any run."""
    machines = tmp_path / "m.yaml"
    machines.write_text(yaml.safe_dump({"machines": [{"name": "big", "cores": 4096}]}))
    assert main(["validate", "--sizing", "--machines", str(machines), "--out-dir", str(tmp_path)]) == 2
    assert "no machine has fewer cores than this one" in capsys.readouterr().err
    assert not (tmp_path / "sizing").exists()  # nothing ran


def test_the_gpu_count_scaling_is_read_from_the_runs_n_gpu_ceilings():
    """One GPU at 1,000 samples/s (three trials: 990, 1,000, 1,010); two GPUs as one DDP job at 1,800 with the link
    and 1,700 without it: 90% scaling (the better link). The 2-GPU rows stay out of the one-GPU ceiling."""
    import pandas as pd

    rows = pd.DataFrame(
        {
            "samples_per_s": [990.0, 1000.0, 1010.0, 1800.0, 1700.0],
            "samples_per_s_ci95_low": [980.0, 990.0, 1000.0, 1790.0, 1690.0],
            "samples_per_s_ci95_high": [1000.0, 1010.0, 1020.0, 1810.0, 1710.0],
            "gpus": [1, 1, 1, 2, 2],
            "p2p": [None, None, None, True, False],
        }
    )
    one, scaling = ws.step_and_scaling(rows)
    assert one == (1000.0, 990.0, 1010.0) and scaling == {2: pytest.approx(0.9)}
    two = ws.predict(W._replace(step=one, scaling=scaling), ws.Candidate("32c2g", 32, gpus=2))
    assert two["gpu_scaling"] == "measured" and two["samples_per_s"] == pytest.approx(1800)
    assert ws.step_and_scaling(rows[rows["gpus"] == 2]) == (None, {})  # no one-GPU ceiling: no workload
    # one machine's share of a 2-machine job (1 of its 2 ranks reported) is no job rate: no scaling from it
    partial = rows.assign(ranks_reported=[1, 1, 1, 1, 2]).drop(index=4)
    assert ws.step_and_scaling(partial) == (one, {})


def test_a_count_that_oversubscribed_the_cores_left_counts_as_the_cores_it_had():
    # four loader-alone trials on 16 cores: the training process's receiving took 0.27, 0.50, 0.86 and 0.80 cores;
    # 16 workers had 16 - 0.86 = 15.14 of them, and 32 are oversubscription (left out)
    import pandas as pd

    from pipeprof.analysis.bounds import worker_cores

    t = pd.DataFrame(
        {
            "num_workers": [4, 8, 16, 32],
            "samples_per_s": [1113.0, 1826.0, 3186.0, 2943.0],
            "main_cpu_pct_mean": [27.0, 50.0, 86.0, 80.0],
        }
    )
    had = worker_cores(t, np.arange(4), 16.0)
    assert had[:3] == pytest.approx([4.0, 8.0, 15.14]) and np.isnan(had[3])
    # 15 cores for the workers read on the cores they had: between 8 and 15.14, not between 8 and 16
    rates = t["samples_per_s"].to_numpy()[:3]
    w = ws.Workload("w", (5000.0, 5000.0, 5000.0), had[:3], rates, rates, rates, 0.0, 16.0)
    at15 = ws.predict(w, ws.Candidate("15c", 15))["samples_per_s"]
    assert at15 == pytest.approx(1826 + (15 - 8) / (15.14 - 8) * (3186 - 1826))
    # a table without the training process's CPU keeps the counts
    assert worker_cores(t.drop(columns="main_cpu_pct_mean"), np.arange(3), 16.0) == pytest.approx([4, 8, 16])


def test_a_pairs_model_ratio_is_read_at_the_cpu_cost_its_own_all_cpu_windows_measured():
    import pandas as pd

    def ratio(n, worker_s, main_s, step):  # the size table's arithmetic at a fixed CPU cost a sample
        return ws.model_ratio(ws.at_cost(W._replace(step=(step, step, step), cores=16.0), n, worker_s, main_s), n)

    # CPU-bound on both sides: a worker 10 ms a sample, the training process 5 ms; masked to 4 cores the training
    # process takes its share: 4 / 15 ms against 4 / 10 ms
    assert ratio(4, 0.010, 0.005, 1e9) == pytest.approx(2 / 3, rel=1e-6)
    # the all-CPU side on the step (4,010/s; its workers could give 12 / 2.8 ms = 4,286): the masked side's
    # 12 / 3.13 ms = 3,834 against the step, not against what the workers could give
    assert ratio(12, 0.0028, 0.00033, 4010.0) == pytest.approx((12 / 0.00313) / 4010.0, rel=1e-6)
    # both sides on the step: no loss
    assert ratio(8, 0.001, 0.0002, 1000.0) == 1.0
    # the all-CPU windows' own CPU (400% workers, 50% training process at 400/s): 10 and 1.25 ms a sample
    row = {"samples_per_s": 400.0, "masked_samples_per_s": 300.0, "all_cpus_workers_cpu_pct_mean": 400.0}
    row |= {"all_cpus_main_cpu_pct_mean": 50.0, "workers_cpu_pct_mean": 350.0, "main_cpu_pct_mean": 45.0}
    assert ws.pair_cpu(pd.Series(row)) == pytest.approx((0.010, 0.00125))
    # a pair recorded without each side's CPU: the trial's means over the mean of the sides' rates (350/s)
    old = pd.Series(row | {"all_cpus_workers_cpu_pct_mean": None, "all_cpus_main_cpu_pct_mean": None})
    assert ws.pair_cpu(old) == pytest.approx((3.5 / 350, 0.45 / 350))
    # no CPU recorded at all: None (the curve's ratio stands in)
    assert ws.pair_cpu(pd.Series(row | {k: None for k in row if "pct" in k})) is None
