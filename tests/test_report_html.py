"""The HTML report (report.html), read the way a person and a browser read it.

The run folders under tests/data were recorded by ``pipeprof run`` itself on a 2-core CPU machine
(mobilenet_v3_small, batch 4, light preset, workers 0 and 1, short windows); machine-specific
paths were made relative afterwards. ``run-cpu-two-sources``: FP32 and BF16, sources files and
memory, from an ImageFolder tree whose path is ``ds/<script>alert(1)</script>`` (a hostile name:
it must show as text). ``run-cpu-files``: the same with FP32 and files only.
"""

from __future__ import annotations

import re
import shutil
from pathlib import Path

import pandas as pd
import pytest

from pipeprof.cli import main
from pipeprof.report.html import render_html
from pipeprof.results import load_run

DATA = Path(__file__).parent / "data"
RUN = DATA / "run-cpu-two-sources"
HOSTILE = "<script>alert(1)</script>"
EXPECTED_FIGURES = [
    "fig-curve-0",
    "fig-curve-1",
    "fig-curve-2",
    "fig-curve-3",
    "fig-step-split",
    "fig-timeline",
    "fig-stages",
    "fig-precision",
    "fig-storage",
]
NOT_APPLICABLE = ["fig-mode", "fig-scaling"]  # one mode, no GPU-count axis in this run


@pytest.fixture(scope="module")
def run():
    return load_run(RUN)


@pytest.fixture(scope="module")
def page(tmp_path_factory) -> Path:
    """report.html as ``pipeprof report RUN --html FILE`` writes it."""
    path = tmp_path_factory.mktemp("html") / "report.html"
    assert main(["report", str(RUN), "--html", str(path)]) == 0
    return path


def section(html: str, ident: str) -> str:
    """The text of the element with id ``ident`` up to its closing tag of the same name."""
    m = re.search(rf'<(\w+)[^>]*\bid="{ident}"', html)
    assert m, f"no element with id {ident}"
    return html[m.start() : html.index(f"</{m.group(1)}>", m.end())]


def printed_equals(text: str, value: float) -> bool:
    """``text`` is ``value`` rounded to the digits printed (thousands separators allowed)."""
    digits = text.replace(",", "")
    decimals = len(digits.partition(".")[2])
    return abs(float(digits) - value) <= 0.5 * 10**-decimals + 1e-9


def test_every_expected_figure_and_table_is_there(page):
    html = page.read_text()
    ids = set(re.findall(r'<(?:figure|table|section)[^>]*\bid="([^"]+)"', html))
    assert set(EXPECTED_FIGURES) <= ids
    assert {"answer", "table-actions", "table-review"} <= ids
    assert not set(NOT_APPLICABLE) & ids
    for fig in EXPECTED_FIGURES:  # each figure holds a drawing, not an empty frame
        assert section(html, fig).count("<path") > 5, fig
    assert html.count("<details>") >= 4  # machine, config, versions, CPU reference folded at the bottom


def test_answer_sentences_carry_the_stored_numbers(run, page):
    answer = section(page.read_text(), "answer")
    groups = run.meta["analysis"]["groups"]
    curves = pd.DataFrame(run.meta["analysis"]["curves"])
    pattern = re.compile(  # the interval as "± h", or as its two ends where it is wide (summary._interval)
        r"with (\d+) workers? training runs at ([\d,.]+)(?: ± ([\d,.]+)| \(([\d,.]+)–([\d,.]+)\)) samples/s; "
        r"the step on the CPU alone takes ([\d,.]+) samples/s(?:, below[^;]*)?; set num_workers=(\d+)\."
    )
    found = [
        (m, html_label)
        for html_label, m in zip(re.findall(r'<span class="group">(.*?)</span>', answer), pattern.finditer(answer))
    ]
    assert len(found) == len(groups) == 4
    for (m, label), g in zip(found, groups):
        row = curves[
            (curves["num_workers"] == g.workers)
            & (curves["precision"] == g.key["precision"])
            & (curves["source"] == g.key["source"])
        ].iloc[0]
        where = {"files": "files warm", "memory": "memory"}[g.key["source"]]
        assert label == f"mobilenet_v3_small {g.key['precision']} · light · batch 4 · {where}"
        assert int(m.group(1)) == int(m.group(7)) == g.workers
        assert printed_equals(m.group(2), g.samples_per_s)
        lo, hi = row["samples_per_s_ci95_low"], row["samples_per_s_ci95_high"]
        if m.group(3) is not None:
            assert printed_equals(m.group(3), (hi - lo) / 2)
        else:
            assert printed_equals(m.group(4), lo) and printed_equals(m.group(5), hi)
        assert printed_equals(m.group(6), row["step_bound_samples_per_s"])


def test_actions_and_review_table_are_the_stored_figures(run, page):
    html = page.read_text()
    actions = [a for g in run.meta["analysis"]["groups"] for a in g.actions]
    assert section(html, "table-actions").count("<tr>") == len(actions) + 1  # + the header row
    review = section(html, "table-review")
    ceilings = run.trials[run.trials["kind"] == "gpu_ceiling"].set_index("precision")["samples_per_s"]
    rows = [re.findall(r"<td[^>]*>([^<]*)</td>", r) for r in re.findall(r"<tr>(.*?)</tr>", review)]
    cells = {r[1]: r for r in rows if r}  # the header row has <th> cells only
    assert set(cells) == {"fp32", "bf16"}
    for precision, row in cells.items():
        assert printed_equals(row[2], ceilings[precision])
    assert printed_equals(cells["bf16"][-1].rstrip("×"), ceilings["bf16"] / ceilings["fp32"])


def test_the_page_reads_in_the_first_screens_order_with_each_reason_once(page):
    """The answer, the curve, what would help, then the evidence (figures, trials, notes, details); in "What would
    help" the rows one reason held back are one row, so no reason repeats within a group."""
    html = page.read_text()
    at = [html.index(mark) for mark in ('id="answer"', "<h2>The curve</h2>", "What would help", "<h2>Figures</h2>")]
    assert at == sorted(at) and html.index("<h2>Trials</h2>") > at[-1]
    rows = [
        re.findall(r"<td[^>]*>([^<]*)</td>", r) for r in re.findall(r"<tr>(.*?)</tr>", section(html, "table-actions"))
    ]
    held = [(r[0], r[-1]) for r in rows if r and r[-1].startswith("not tried: ")]
    assert len(held) == len(set(held))


def test_nothing_is_fetched(page):
    html = page.read_text()
    # an SVG's xmlns names a namespace; it is never fetched
    refs = re.findall(
        r'(?:\bsrc|\bhref)\s*=\s*["\']?([^"\'\s>]+)|url\(\s*["\']?([^)"\']+)|@import\s+["\']?([^"\';]+)', html
    )
    targets = [t for group in refs for t in group if t]
    assert targets and all(t.startswith("#") for t in targets), [t for t in targets if not t.startswith("#")]
    assert not re.search(r"<(script|link|img|iframe|object|embed)\b", html, re.I)


def test_hostile_names_show_as_text(run, page):
    assert run.meta["config"]["data"]["path"].endswith(HOSTILE)  # the recorded run really has the name
    html = page.read_text()
    assert HOSTILE not in html
    shown = "ds/&lt;script&gt;alert(1)&lt;/script&gt;"
    assert f"<code>{shown}</code>" in html  # the header names the dataset
    assert html.count(shown) >= 3  # and the resolved config and the machine snapshot show it again


def test_figures_that_do_not_apply_are_left_out():
    """A run of the first schema (no stage clocks, no second precision or source) still renders."""
    html = render_html(load_run(DATA / "run-schema1"))
    assert 'id="answer"' in html and 'id="fig-curve-0"' in html
    assert not re.search(r'id="fig-(precision|storage|mode|scaling)"', html)


def test_console_prints_the_answer_above_the_tables(run):
    from pipeprof.report.console import render_text

    text = render_text(run)
    first_table = text.index("step (on CPU) ceiling")
    assert text.index("set num_workers=") < first_table


def test_report_csv_writes_the_trials(tmp_path, run, capsys):
    copy = shutil.copytree(RUN, tmp_path / RUN.name)
    assert main(["report", str(copy), "--csv"]) == 0
    assert str(copy / "trials.csv") in capsys.readouterr().out
    back = pd.read_csv(copy / "trials.csv")
    assert list(back.columns) == list(run.trials.columns)
    assert back["samples_per_s"].tolist() == pytest.approx(run.trials["samples_per_s"].tolist(), nan_ok=True)


def test_pipeprof_run_writes_report_html(cpu_run_dir):
    """A real (tiny) `pipeprof run` ends with report.html in its folder (conftest's shared run), its answer
    naming the count the run recommends."""
    html = (cpu_run_dir / "report.html").read_text()
    (group,) = load_run(cpu_run_dir).meta["analysis"]["groups"]
    assert 'id="fig-curve-0"' in html and f"set num_workers={group.workers}" in html


def _browser():
    sync = pytest.importorskip("playwright.sync_api")
    chromium = shutil.which("chromium")
    if chromium is None:
        pytest.skip("Debian's chromium is not installed (.ci/run installs it)")
    return sync, chromium


def test_report_renders_in_a_real_browser(page, tmp_path):
    import numpy as np
    from PIL import Image

    sync, chromium = _browser()
    errors = []
    with sync.sync_playwright() as p:
        browser = p.chromium.launch(executable_path=chromium, args=["--no-sandbox"])
        tab = browser.new_page(viewport={"width": 1280, "height": 900})
        tab.on("console", lambda msg: errors.append(msg.text) if msg.type == "error" else None)
        tab.on("pageerror", lambda exc: errors.append(str(exc)))
        tab.goto(page.as_uri())
        assert tab.locator("#answer").is_visible()
        assert "set num_workers=" in tab.locator("#answer").inner_text()
        assert tab.locator("#fig-curve-0 svg").bounding_box()["width"] > 400
        tab.screenshot(path=str(tmp_path / "first-screen.png"))  # what a reader sees before scrolling
        tab.screenshot(path=str(tmp_path / "report.png"), full_page=True)
        browser.close()
    assert errors == []
    pixels = np.asarray(Image.open(tmp_path / "report.png").convert("L"), dtype=float)
    assert pixels.shape[0] > 3000 and pixels.std() > 20  # a long page with text and figures, not a blank one
