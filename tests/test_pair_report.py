"""report.html's evidence of the answer's pair trial, read from run.json's ``pair_trials`` as it was stored: the
pick, its rival, the pairs and windows, each side's rate, the ratio with its 95% interval, and what it decided.

The synthetic folders are tests/data/run-cpu-files (a real run, recorded before the pair trial) with a pair
trial's row added, made by the functions a run makes it with (``paired_columns`` on real windows, ``pair_row``,
``pair_decision``); the last test reads the suite's measured CPU run (tests/conftest.py), which ran its own."""

from __future__ import annotations

import html
import json
import math
import re
import shutil
import statistics
from dataclasses import replace
from pathlib import Path

import pytest

from pipeprof.analysis.confidence import PAIR_KIND, pair_columns, pair_decision
from pipeprof.measure.windows import Paired, Window
from pipeprof.orchestrate.action_trials import pair_row, spec_of
from pipeprof.report.html import render_html
from pipeprof.results import load_run
from pipeprof.trials.action_trial import paired_columns

DATA = Path(__file__).parent / "data" / "run-cpu-files"
LINE = re.compile(
    r"Pair trial: num_workers=(\d+) \(the pick\) against (\d+) \(its nearest rival\), (\d+) pairs of alternating "
    r"windows on one step \((\d+) windows\): ([\d,.]+) against ([\d,.]+) samples/s, the pick's rate over the "
    r"rival's ([\d.]+)x \(95% interval ([\d.]+)-([\d.]+)\); ([^.]*)\."
)


def printed_equals(text: str, value: float) -> bool:
    """``text`` is ``value`` rounded to the digits printed (thousands separators allowed)."""
    digits = text.replace(",", "")
    return abs(float(digits) - value) <= 0.5 * 10 ** -len(digits.partition(".")[2]) + 1e-9


def pair_lines(page: str) -> list[str]:
    return [html.unescape(p) for p in re.findall(r'<p class="small pair">(.*?)</p>', page)]


def _stored_row(pick_rates: list[float], rival_rates: list[float], pick: int = 1, rival: int = 0) -> dict:
    """The row confirm_answers stores for these windows (1 s each): the pick's settings from the recorded run's
    end-to-end trial, action_trial's columns (the rival its variant A, the pick its baseline B) as pair_row
    stores them, and the decision's ratio."""
    run = load_run(DATA)
    e2e = run.trials[(run.trials["kind"] == "end_to_end") & (run.trials["num_workers"] == pick)].iloc[0]
    spec = replace(spec_of(e2e), kind=PAIR_KIND, action=f"num_workers={rival}")
    wins = [Window(float(i), float(i + 1), r, 1) for i, r in enumerate(rival_rates + pick_rates)]
    got = paired_columns(Paired(a=wins[: len(rival_rates)], b=wins[len(rival_rates) :], planned_pairs=4), 25.0)
    row = spec.columns() | {"status": "ok", "error": None, "rival_workers": rival} | pair_row(got)
    return row | pair_columns(pair_decision(pick, rival, row["window_rates"], row["baseline_window_rates"]))


def _folder(tmp_path: Path, rows: list[dict]) -> Path:
    """run-cpu-files copied with ``rows`` as its run.json's ``pair_trials``."""
    folder = tmp_path / "run"
    shutil.copytree(DATA, folder)
    meta = json.loads((folder / "run.json").read_text())
    meta["pair_trials"] = {"rows": rows}
    (folder / "run.json").write_text(json.dumps(meta))
    return folder


def _check(line: str, row: dict) -> str:
    """The printed figures of ``line`` against the stored ``row``; the decision's words."""
    m = LINE.fullmatch(line)
    assert m, line
    assert (int(m[1]), int(m[2]), int(m[3]), int(m[4])) == (
        row["num_workers"],
        row["rival_workers"],
        row["pairs"],
        row["windows"],
    )
    assert printed_equals(m[5], row["samples_per_s"]) and printed_equals(m[6], row["baseline_samples_per_s"])
    assert printed_equals(m[7], row["pair_ratio"])
    assert printed_equals(m[8], row["pair_ratio_ci95_low"]) and printed_equals(m[9], row["pair_ratio_ci95_high"])
    return m[10]


def test_a_separating_pair_trial_prints_its_stored_pick_rival_ratio_and_interval(tmp_path):
    row = _stored_row([21.0, 22.0, 21.5, 20.8], [1.3, 1.4, 1.2, 1.35])
    # the ratio the row stores: the pick's over the rival's, the pairs' geometric mean
    logs = [math.log(a / b) for a, b in zip(row["window_rates"], row["baseline_window_rates"])]
    assert row["pair_ratio"] == pytest.approx(math.exp(statistics.fmean(logs)))
    assert "action_gain_frac" not in row and row["pair_separated"] and row["pair_workers"] == 1
    page = render_html(load_run(_folder(tmp_path, [json.loads(json.dumps(row))])))
    (line,) = pair_lines(page)
    assert _check(line, row) == "separated: num_workers=1 answered"
    answer = page[page.index('id="answer"') : page.index("</section>")]
    assert '<p class="small pair">' in answer  # under the answer's evidence, in its section


def test_a_pair_trial_that_cannot_separate_the_two_says_the_machines_drift(tmp_path):
    row = _stored_row([20.0, 21.0, 19.0, 22.0], [21.0, 19.5, 20.5, 20.0])
    assert not row["pair_separated"] and row["pair_ratio_ci95_low"] < 1 < row["pair_ratio_ci95_high"]
    failed = row | {"status": "error", "error": "RuntimeError: a worker died", "num_workers": 0, "rival_workers": 1}
    (line, other) = pair_lines(render_html(load_run(_folder(tmp_path, [row, failed]))))
    assert _check(line, row) == "within the machine's drift: num_workers=0, the smaller count, answered"
    assert other.startswith("Pair trial: num_workers=0 (the pick) against 1 (its nearest rival) ended error: ")
    assert other.endswith("the sweep's answer stands.")


def test_the_measured_runs_pair_trial_stores_its_ratio_and_the_report_prints_it(cpu_run_dir):
    """The suite's measured run (0 and 1 workers) ran its pair trial: its row carries the pick's rate over the
    rival's from its own windows, no action gain, and report.html prints the stored figures."""
    run = load_run(cpu_run_dir)
    rows = [r for r in (run.meta.get("pair_trials") or {}).get("rows", []) if r.get("status") == "ok"]
    assert rows, run.meta.get("pair_trials")
    lines = pair_lines(render_html(run))
    assert len(lines) == len(run.meta["pair_trials"]["rows"])
    for row, line in zip(rows, lines):
        assert not {"action_gain_frac", "action_gain_ci95_low", "action_gain_ci95_high"} & set(row)
        logs = [math.log(a / b) for a, b in zip(row["window_rates"], row["baseline_window_rates"])]
        assert row["pair_ratio"] == pytest.approx(math.exp(statistics.fmean(logs)))
        assert row["samples_per_s"] == pytest.approx(statistics.median(row["window_rates"]))
        if row["pair_ratio_ci95_low"] is not None:
            assert 0 < row["pair_ratio_ci95_low"] < row["pair_ratio"] < row["pair_ratio_ci95_high"]
            _check(line, row)
