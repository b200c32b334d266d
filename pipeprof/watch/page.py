"""report.html of a watch: the sweep's page (``report.html``) with the watch's own answer on top.

The page below is the shared renderer's, drawn from the stored rows and analysis; above it, what a
watch adds: how the watch ended, each loader's verdict per rank, the slowest rank, the pause and its
recommendation, the lines the console printed (``live.summary``), escaped.
"""

from __future__ import annotations

from pipeprof.report.html import REPORT, esc

from .live import summary

MARK = "<main>\n"


def section(run, tune) -> str:
    items = "".join(f"<p>{esc(line.strip())}</p>" for line in summary(run, tune)[:-1])
    command = " ".join(run.meta.get("command") or [])
    return (
        f'<section id="watch" class="answer"><p class="group">pipeprof watch -- {esc(command)}</p>{items}</section>\n'
    )


def with_watch_section(run, tune, path=None) -> None:
    """Put :func:`section` at the top of a report page of the run (written by ``report.html.write_report``;
    ``path``: where, the run's report.html by default)."""
    path = path or run.path / REPORT
    text = path.read_text(encoding="utf-8")
    if MARK in text:
        path.write_text(text.replace(MARK, MARK + section(run, tune), 1), encoding="utf-8")
