"""``pipeprof compare``: trials matched by their settings, rate ratios, noise, what differs.

On the two run folders recorded by pipeprof (see test_report_html): ``run-cpu-two-sources`` (FP32 and
BF16, files and memory) and ``run-cpu-files`` (FP32, files), both mobilenet_v3_small, light preset,
batch 4, workers 0 and 1, on the same 2-core machine minutes apart.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from pipeprof.analysis.compare import compare, reference_rate
from pipeprof.cli import main
from pipeprof.results import load_run

DATA = Path(__file__).parent / "data"
A, B = DATA / "run-cpu-two-sources", DATA / "run-cpu-files"


@pytest.fixture(scope="module")
def runs():
    return [load_run(A), load_run(B)]


@pytest.fixture(scope="module")
def result(runs):
    return compare(runs, ["a", "b"])


def _ok(run):
    return run.trials[run.trials["status"] == "ok"]


def test_trials_match_by_settings_not_id(runs, result):
    df = result.ratios
    b = _ok(runs[1])
    assert len(df) == len(b)  # every trial of b has its twin in a (b's settings are a subset of a's)
    assert set(df["kind"]) == set(b["kind"])
    assert set(df["precision"].dropna()) == {"fp32"} and set(df["source"].dropna()) == {"files"}
    a, b = (_ok(r).set_index("trial_id")["samples_per_s"] for r in runs)
    for _, r in df.iterrows():  # trial ids spell out the settings: the oracle for what matched what
        assert r["rate_a"] == a[r["trial"]] and r["rate_b"] == b[r["trial"]]
        assert r["ratio"] == pytest.approx(r["rate_b"] / r["rate_a"])


def test_within_noise_means_the_intervals_overlap(runs, result):
    a, b = (_ok(r).set_index("trial_id") for r in runs)
    checked = 0
    for _, r in result.ratios.iterrows():
        tid = r["trial"]
        lo_a, hi_a = a.loc[tid, ["samples_per_s_ci95_low", "samples_per_s_ci95_high"]]
        lo_b, hi_b = b.loc[tid, ["samples_per_s_ci95_low", "samples_per_s_ci95_high"]]
        if r["within_noise"] is not None:
            assert r["within_noise"] == (lo_a <= hi_b and lo_b <= hi_a)
            checked += 1
    assert checked >= 6


def test_reference_normalised_ratio(runs, result):
    ref_a, ref_b = (reference_rate(r.meta) for r in runs)
    points = runs[0].meta["cpu_reference"]["start"]["points"]
    assert ref_a > 0 and ref_b > 0 and max(p["processes"] for p in points) == 2  # the all-cores point of 2
    for run, ref in zip(runs, (ref_a, ref_b)):  # the mean of start and end at 2 processes, read off run.json
        at_two = [
            p["decodes_per_s"]
            for w in ("start", "end")
            for p in run.meta["cpu_reference"][w]["points"]
            if p["processes"] == 2
        ]
        assert len(at_two) == 2 and ref == pytest.approx(sum(at_two) / 2)
    df = result.ratios
    assert df["reference_ratio"].iloc[0] == pytest.approx(ref_b / ref_a)
    assert df["normalised_ratio"].tolist() == pytest.approx((df["ratio"] / (ref_b / ref_a)).tolist())


def test_what_differs_is_named(result):
    fields = {d.field: d.values for d in result.differences}
    assert fields["config.data.source"][1] == [{"kind": "files", "path": None, "label": "files"}]
    assert fields["config.model.precision"] == [["fp32", "bf16"], ["fp32"]]
    assert "config.name" not in fields and "config.out_dir" not in fields  # names, not settings


def test_a_run_against_itself(runs):
    same = compare([runs[1], runs[1]], ["b", "b again"])
    assert same.differences == []
    assert same.ratios["ratio"].tolist() == pytest.approx([1.0] * len(same.ratios))
    assert same.ratios["within_noise"].notna().sum() >= 6 and same.ratios["within_noise"].dropna().all()


def test_cli_writes_html_and_prints_markdown(tmp_path, capsys):
    out = tmp_path / "c.html"
    assert main(["compare", str(A), str(B), "--html", str(out)]) == 0
    md = capsys.readouterr().out
    assert "| ratio | within noise |" in md and "## What differs" in md
    assert "config.model.precision" in md and re.search(r"\| (within noise|differs) \|", md)
    html = out.read_text()
    assert 'id="table-ratios"' in html and 'id="fig-compare-0"' in html and 'id="differences"' in html
    assert "<script" not in html
    refs = re.findall(r'(?:src|href)="([^"]+)"|url\(([^)]+)\)', html)
    assert all(t.startswith("#") for pair in refs for t in pair if t)


def test_compare_needs_two_runs(capsys):
    assert main(["compare", str(A)]) == 2
    assert "two runs" in capsys.readouterr().err


def test_a_run_with_an_action_applied_sits_beside_the_run_without_it(tmp_path):
    """The rerun changed the decoder in every trial (pil → cv2) and ran 10% faster: its trials are matched
    across the decoder, and the baseline's decoder action trial (+8%, -3% to +19% at 1 worker) is set beside
    the rerun's end-to-end gain at 1 worker (+10%: inside its interval)."""
    import copy
    import shutil

    from pipeprof.report.comparison import render_compare_markdown

    base = load_run(B)
    base.meta = copy.deepcopy(base.meta) | {
        "action_trials": {
            "rows": [
                {
                    "action": "decoder",
                    "status": "ok",
                    "num_workers": 1,
                    "action_gain_frac": 0.08,
                    "action_gain_ci95_low": -0.03,
                    "action_gain_ci95_high": 0.19,
                },
                {
                    "action": "decoder",
                    "status": "ok",
                    "num_workers": 1,
                    "batch_size": 64,
                    "action_gain_frac": 0.3,
                    "action_gain_ci95_low": 0.2,
                    "action_gain_ci95_high": 0.4,
                },
            ]
        }
    }  # another group's: batch 64, not run here
    shutil.copytree(B, tmp_path / "rerun")
    rerun = load_run(tmp_path / "rerun")
    has = rerun.trials["decoder"].notna()
    rerun.trials.loc[has, "decoder"] = "cv2"
    for col in ("samples_per_s", "samples_per_s_ci95_low", "samples_per_s_ci95_high"):
        rerun.trials.loc[has, col] *= 1.1
    c = compare([base, rerun], ["pil", "cv2"])
    assert c.changed == {"cv2": {"decoder": ("pil", "cv2")}}
    assert len(c.ratios) == len(_ok(base))  # every ok trial matched, across the decoder
    decoded = c.ratios[c.ratios["kind"].isin(["cpu_pipeline", "end_to_end"])]
    assert decoded["ratio"].tolist() == pytest.approx([1.1] * len(decoded))
    a, elsewhere = c.actions
    assert elsewhere["rerun_gain"] is None and elsewhere["agrees"] is None  # no end-to-end trial at its settings
    assert (a["action"], a["setting"], a["agrees"]) == ("decoder", "decoder", True)
    assert a["rerun_gain"] == pytest.approx(0.10)
    text = render_compare_markdown(c, [base, rerun])
    assert "`cv2` changed decoder pil → cv2 in every trial" in text
    # the stored symmetric -3% to +19% by the rule of ratios (stats.gain_bounds): 1.08 x exp(∓0.11 / 1.08) - 1
    assert (
        "measured +8.0% (95% interval -2.5% to +19.6%) at 1 worker; the rerun's end-to-end trial there: "
        "+10.0%, inside the trial's interval" in text
    )
    # two runs that differ in no setting wholesale match as before: nothing is said to have changed
    assert compare([base, load_run(B)], ["a", "b"]).changed == {"b": {}}
    # a setting no action changes (the model) still keeps trials apart: only the decoder is matched across
    has = rerun.trials["model"].notna()
    rerun.trials.loc[has, "model"] = "resnet50"
    other = compare([base, rerun], ["pil", "resnet"])
    assert other.changed == {"resnet": {"decoder": ("pil", "cv2")}}
    assert not other.ratios["model"].isin(["resnet50"]).any() and len(other.ratios) < len(_ok(base))
