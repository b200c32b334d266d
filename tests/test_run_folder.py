"""A real (tiny) `pipeprof run` on synthetic JPEGs: the run folder's schema and contents."""

import json

import pandas as pd
import pytest

from pipeprof.cli import main
from pipeprof.report.console import si
from pipeprof.report.summary import answer_lines
from pipeprof.results import load_run


@pytest.fixture
def run_dir(cpu_run_dir):
    return cpu_run_dir  # conftest: one run, read here and by test_report_html


def test_run_folder_holds_the_four_files(run_dir):
    assert {p.name for p in run_dir.iterdir()} >= {"trials.parquet", "timeline.parquet", "run.json", "summary.md"}


def test_trials_have_every_kind_with_numeric_units(run_dir):
    df = pd.read_parquet(run_dir / "trials.parquet")
    assert (df["status"] == "ok").all(), df["error"].dropna().tolist()
    assert sorted(df["kind"].unique()) == [
        "cpu_pipeline",
        "end_to_end",
        "gpu_ceiling",
        "monitor_overhead",
        "storage_fetch",
    ]
    e2e = df[df["kind"] == "end_to_end"].set_index("num_workers")
    assert list(e2e.index) == [0, 1]
    for col in ("samples_per_s", "samples_per_s_cv", "data_wait_frac", "compute_ms_p50", "main_rss_mb_max"):
        assert pd.api.types.is_float_dtype(df[col]), col
    assert (e2e["samples_per_s"] > 0).all() and e2e["data_wait_frac"].between(0, 1).all()
    # 3 windows planned; more were added only while the 95% interval was wider than ±measure.ci_target (up to
    # measure.max_windows): a trial that stopped short of the most, at its 3rd window or a later one, stopped
    # inside the target (most of this run's trials stop at the 3rd: the check has rows to read)
    measure = json.loads((run_dir / "run.json").read_text())["config"]["measure"]
    most = measure["max_windows"]
    assert most > 3 and df["windows"].between(3, most).all()
    half = (df["samples_per_s_ci95_high"] - df["samples_per_s_ci95_low"]) / 2 / df["samples_per_s"]
    stopped_early = (
        df["windows"].between(3, most - 1) & df["stage_clock_overhead_frac"].isna() & (df["kind"] != "monitor_overhead")
    )  # not ABBA trials
    assert (half[stopped_early] <= measure["ci_target"] + 1e-9).all()
    assert (df.loc[df["unstable"].astype(bool), "unstable_reason"].str.contains("likely cause")).all()
    ceiling = df[df["kind"] == "gpu_ceiling"].iloc[0]  # no loader there: no data wait is reported, not a 0
    assert pd.isna(ceiling["data_wait_ms_p50"]) and pd.isna(ceiling["data_wait_frac"])
    # plausible, not only > 0: the rate is the batch over the step's own clock, and a batch of 4 of
    # mobilenet_v3_small trains on 1-2 cores in ~30 ms-2 s (a busy 2-core VM gave 0.6/s before threads were set)
    assert ceiling["samples_per_s"] == pytest.approx(4 / (ceiling["batch_ms_mean"] / 1e3), rel=0.25)
    assert 2 < ceiling["samples_per_s"] < 500 and ceiling["compute_ms_p50"] <= 1.1 * ceiling["batch_ms_mean"]
    # per-stage costs arrive from inside the workers
    assert (e2e["stage_us_per_sample.decode"] > 0).all() and (e2e["stage_us_per_sample.RandomCrop"] > 0).all()
    fetch = df[df["kind"] == "storage_fetch"]
    assert (fetch["read_mb_s"] > 0).all() and (fetch["mean_sample_kb"] > 50).all()


def test_timeline_samples_belong_to_trials(run_dir):
    tl = pd.read_parquet(run_dir / "timeline.parquet")
    trials = pd.read_parquet(run_dir / "trials.parquet")
    tagged = set(tl["trial_id"].dropna())
    assert tagged <= set(trials["trial_id"]) and len(tagged) >= len(trials) - 1
    assert set(tl["phase"].dropna()) == {"warmup", "measure"}
    one_worker = trials[(trials["kind"] == "end_to_end") & (trials["num_workers"] == 1)].iloc[0]
    assert one_worker["workers_rss_mb_max"] > 10  # the worker process was tracked
    assert one_worker["pss_mb_steady"] > 50  # main + worker RAM, shared pages once


def test_run_json_records_config_machine_and_timers(run_dir):
    meta = json.loads((run_dir / "run.json").read_text())
    assert meta["status"] == "complete"
    assert meta["config"]["device"] == "cpu" and meta["config"]["loader"]["num_workers"] == [0, 1]
    assert meta["machine"]["cores"]["usable"] >= 1
    assert set(meta["timed_regions"]) >= {"end_to_end", "gpu_ceiling", "cpu_pipeline", "storage_fetch"}
    assert meta["dataset"]["images"] == 16 and 50 < meta["dataset"]["mean_kb"] < 200
    (group,) = load_run(run_dir).meta["analysis"]["groups"]  # an answer.Answer, read from its stored dict
    assert group.workers in (0, 1) and set(meta["analysis"]["groups"][0]) == set(group.to_dict())
    ref = meta["cpu_reference"]  # the machine's fixed-work speed before the first and after the last trial
    for when in ("start", "end"):
        one = ref[when]["points"][0]
        assert one["processes"] == 1 and one["rounds"] == 3
        assert one["decodes_per_s_min"] <= one["decodes_per_s"] <= one["decodes_per_s_max"]
        assert 20 < one["decodes_per_s"] < 5000  # a ~100 KB JPEG takes 0.2-50 ms to decode on any core
    assert ref["drift"]["largest_frac"] == pytest.approx(
        max(
            (e["decodes_per_s"] / s["decodes_per_s"] - 1 for s, e in zip(ref["start"]["points"], ref["end"]["points"])),
            key=abs,
        )
    )


def test_cpu_run_gives_the_step_its_own_threads_and_speaks_of_the_step(run_dir):
    df = pd.read_parquet(run_dir / "trials.parquet")
    meta = json.loads((run_dir / "run.json").read_text())
    cores = meta["machine"]["cores"]["usable"]
    e2e = df[df["kind"] == "end_to_end"].set_index("num_workers")
    # the step gets the cores the workers leave; alone (the ceiling) it gets them all
    assert [e2e.loc[w, "step_threads"] for w in (0, 1)] == [cores, max(1, cores - 1)]
    assert df.loc[df["kind"] == "gpu_ceiling", "step_threads"].iloc[0] == cores
    verdicts = meta["analysis"]["verdicts"]
    assert len(verdicts) == 2 and not any(v["verdict"] == "gpu-bound" for v in verdicts)
    assert all(v["verdict_basis"] for v in verdicts)
    summary = (run_dir / "summary.md").read_text()
    for gpu_words in ("GPU/s", "GPU%", "gpu-bound", "the GPU is the limit", "cores per GPU to reach", "GPU decode"):
        assert gpu_words not in summary
    assert "step/s" in summary and "no cores-per-GPU or what-if: no GPU" in summary


def test_monitor_cost_is_measured_by_pausing_it_between_windows(run_dir):
    meta = json.loads((run_dir / "run.json").read_text())
    (o,) = meta["analysis"]["monitor_overhead"]
    assert o["num_workers"] == 1 and o["on_samples_per_s"] > 0 and o["off_samples_per_s"] > 0
    if o["overhead_ci95_low"] is not None:
        assert o["overhead_ci95_low"] <= o["overhead_frac"] <= o["overhead_ci95_high"]
    tl = pd.read_parquet(run_dir / "timeline.parquet")
    trial = pd.read_parquet(run_dir / "trials.parquet").set_index("kind").loc["monitor_overhead"]
    during = tl[(tl["t_s"] >= trial["t_measure_start_s"]) & (tl["t_s"] <= trial["t_measure_end_s"])]
    # paused for half the windows: fewer samples than 10 Hz over the trial's measured span
    assert len(during) < 0.9 * 10 * (trial["t_measure_end_s"] - trial["t_measure_start_s"])
    assert "monitor_overhead" in meta["timed_regions"]


def test_stage_clock_cost_is_measured_on_one_loader_with_an_interval(run_dir):
    meta = json.loads((run_dir / "run.json").read_text())
    (o,) = meta["analysis"]["stage_timing_overhead"]
    row = (
        pd.read_parquet(run_dir / "trials.parquet")
        .set_index("trial_id")
        .loc["cpu_pipeline/light/files/warm/bs4/w1/untimed"]
    )
    # windows come in clocked/unclocked pairs; the row's rate is the unclocked windows' median
    assert row["windows"] % 2 == 0 and row["windows"] >= 4
    assert o["off_samples_per_s"] == row["samples_per_s"] and o["on_samples_per_s"] == row["clocked_samples_per_s"]
    # two pairs or more give an interval; the cost of clocks that time a few µs per stage is small
    assert o["overhead_ci95_low"] is not None and abs(o["overhead_frac"]) < 0.5
    assert o["resolved"] == (o["overhead_ci95_low"] > 0 or o["overhead_ci95_high"] < 0)


def test_summary_and_report_show_the_table(run_dir, capsys):
    assert "| samples/s |" in (run_dir / "summary.md").read_text()
    assert main(["report", str(run_dir)]) == 0
    out = capsys.readouterr().out
    assert "mobilenet_v3_small fp32 · light · batch 4" in out and "num_workers=" in out
    assert len(load_run(run_dir).trials) == 9  # 7 + the stage-clock and the monitor overhead checks


def test_the_command_prints_its_answer_once_where_no_action_trial_followed_it(run_dir):
    """The answer is printed as soon as the run has it, before the action trials; the report after them
    repeats it only where they changed it (this run predicts its actions: none ran)."""
    printed = (run_dir.parent / "printed.txt").read_text()
    first = answer_lines(load_run(run_dir))[0][:60]  # the console wraps lines at 140 characters
    assert printed.count(first) == 1, printed[:2000]
    assert printed.index(first) < printed.index(" samples/s ")  # and before the curve table (the answer's own
    # line names "samples/s;", the table's header " samples/s ")


def test_report_on_a_folder_that_is_not_a_run(tmp_path, capsys):
    assert main(["report", str(tmp_path)]) == 2
    assert "not a pipeprof run folder" in capsys.readouterr().err


@pytest.mark.parametrize(
    "value, text",
    [
        (0.5, "0.5"),
        (99.96, "100"),
        (999.7, "1000"),
        (4669.4, "4669"),
        (9999.7, "10k"),
        (47454, "47.5k"),
        (12_345_678, "12.3M"),
    ],
)
def test_table_numbers_round_before_choosing_a_suffix(value, text):
    assert si(value) == text  # never "1e+03": a value that rounds up takes the next format
