"""The default console is one screen; --full keeps every trial's note; a reason is said once per group."""

import io
from collections import Counter

import pytest
from rich.console import Console


def _screen(run, width: int) -> list[str]:
    from pipeprof.report.console import render_console

    buf = io.StringIO()
    render_console(run, Console(file=buf, width=width, color_system=None))
    return buf.getvalue().splitlines()


# `pipeprof run` prints two lines before the report (the dataset, the run folder) and one after (report.html):
# the report's own lines get the rest of the 25-line screen
SCREEN, AROUND = 25, 3


@pytest.mark.parametrize("width", [120])
def test_the_default_console_is_one_screen_and_says_a_reason_once(cpu_run_dir, width):
    from pipeprof.results import load_run

    run = load_run(cpu_run_dir)
    lines = _screen(run, width)
    assert len(lines) <= SCREEN - AROUND, "\n".join(lines)
    repeated = [r for r, n in Counter(a.get("why_not_tried") for a in _actions(run)).items() if r and n > 1]
    text = "\n".join(lines)
    assert all(text.count(r) == 1 for r in repeated)


def _actions(run):
    from pipeprof.report.summary import group_answers

    return [x for a in group_answers(run) for x in a.actions if not x.get("tried")]


def test_the_noise_line_counts_the_trials_flags_and_full_keeps_every_note(cpu_run_dir):
    from pipeprof.report.console import noise_line, render_text
    from pipeprof.results import load_run

    run = load_run(cpu_run_dir)
    wide = int(run.trials["unstable"].astype("boolean").fillna(False).sum())
    assert f"{wide} of " in noise_line(run)
    full = render_text(run)
    flagged = run.trials[run.trials["unstable"].astype("boolean").fillna(False)]
    assert all(t in full for t in flagged["trial_id"])


def test_a_narrow_screen_drops_whole_columns_in_order_and_keeps_the_count():
    from pipeprof.report.console import fit_columns

    headers = ["w", "samples/s", "CV", "wait", "RAM MB", "I/O/s", "step/s", "verdict"]
    rows = [["1", "20.9", "8.1%", "1%", "1,342", "22.7k", "2.34", "cores-bound"]]
    widths = [1, 9, 4, 4, 6, 5, 6, 11]  # each column's widest cell or header
    need = lambda cols: sum(widths[headers.index(h)] + 2 for h in cols) + len(cols) + 1  # noqa: E731
    assert fit_columns(headers, rows, None) == (headers, rows)
    assert fit_columns(headers, rows, need(headers))[0] == headers  # exactly fits: nothing dropped
    kept, cut = fit_columns(headers, rows, need(headers) - 1)
    assert kept == [h for h in headers if h != "RAM MB"] and cut == [[c for c in rows[0] if c != "1,342"]]
    narrow = ["w", "samples/s", "wait", "step/s", "verdict"]  # RAM, I/O/s, CV gone, in that order
    assert fit_columns(headers, rows, need(narrow))[0] == narrow


def test_the_first_screen_at_80_columns_cuts_no_cell_of_the_curve(cpu_run_dir):
    from pipeprof.report.console import curve_tables
    from pipeprof.results import load_run

    run = load_run(cpu_run_dir)
    lines = _screen(run, 80)
    (title, headers, rows), *_ = curve_tables(run)
    head = next(line for line in lines if line.split()[:2] == ["w", "samples/s"])
    assert "…" not in head and max(len(line) for line in lines) <= 80
    body = lines[lines.index(head) + 2]  # under the rule
    assert body.split()[0] == rows[0][0] and body.split()[-1] == rows[0][-1]  # the count and the verdict, whole
