"""Two or more runs side by side (``pipeprof compare``): an HTML page and markdown for an issue.

Both format a :class:`pipeprof.compare.Comparison` (the pure matching and ratios) and the runs'
stored curves; neither compares anything itself.
"""

from __future__ import annotations

import json

from pipeprof.analysis.compare import Comparison
from pipeprof.stats import workers_text

from . import figures as F
from .console import reference_line
from .html import esc, page, table_html
from .summary import answer_lines, rate

# the settings the ratio table shows first (those that vary between its rows); stage_timing tells the
# stage-clock overhead twin (False) from its cpu_pipeline trial
SETTING_HEADERS = [
    "kind",
    "model",
    "precision",
    "mode",
    "preset",
    "source",
    "cache_state",
    "batch_size",
    "stage_timing",
    "num_workers",
    "gpus",
]
TEXT = frozenset({"kind", "model", "precision", "mode", "preset", "source", "cache_state", "run", "within noise"})


def _verdict(within) -> str:
    if within is None or within != within:
        return "no interval"
    return "within noise" if within else "differs"


def _cell(value) -> str:
    if value is None or (isinstance(value, float) and value != value):
        return "–"
    return str(int(value)) if isinstance(value, float) and value.is_integer() else str(value)


def ratio_rows(c: Comparison) -> tuple[list[str], list[list[str]], str]:
    """(headers, rows, common) of the ratio table: the settings that vary between rows, each rate, the
    ratio, noise, the reference-normalised ratio; ``common`` names the settings every row shares."""
    df = c.ratios
    present = [s for s in SETTING_HEADERS + ["run"] if s in df and df[s].notna().any()]
    varying = [s for s in present if df[s].dropna().map(str).nunique() > 1 or s == "kind"]
    common = " · ".join(f"{s} {_cell(df[s].dropna().iloc[0])}" for s in present if s not in varying)
    headers = varying + ["baseline samples/s", "samples/s", "ratio", "within noise", "÷ CPU ref. ratio"]
    rows = []
    for _, r in df.iterrows():
        norm = r.get("normalised_ratio")
        rows.append(
            [_cell(r[s]) for s in varying]
            + [
                rate(r["rate_a"]),
                rate(r["rate_b"]),
                f"{r['ratio']:.2f}×",
                _verdict(r["within_noise"]),
                "–" if norm is None or norm != norm else f"{norm:.2f}×",
            ]
        )
    return headers, rows, common


def _show(value) -> str:
    """A config or machine value as text: missing as such, structures as compact JSON."""
    if value is None:
        return "(not recorded)"
    return value if isinstance(value, str) else json.dumps(value, default=str)


def _differences(c: Comparison) -> list[str]:
    return [
        f"{d.field}: " + "; ".join(f"{lab} = {_show(v)}" for lab, v in zip(c.labels, d.values)) for d in c.differences
    ]


def _pct(v) -> str:
    return f"{v:+.1%}" if v is not None and v == v else "–"


def _changes(c: Comparison) -> list[str]:
    """Per later run, the settings it changed wholesale (trials matched across them), then each such change
    that the baseline's action trials tried: the trial's gain beside the rerun's."""
    out = [
        f"`{lab}` changed {', '.join(f'{k} {a} → {b}' for k, (a, b) in ch.items())} in every trial: its trials "
        "are matched to the baseline's across it"
        for lab, ch in c.changed.items()
        if ch
    ]
    for a in c.actions:
        agree = {
            True: "inside the trial's interval",
            False: "outside the trial's interval",
            None: "no end-to-end trial at its settings to set beside it",
        }[a["agrees"]]
        out.append(
            f"`{a['run']}` ({a['setting']} {a['to']}): the baseline's action trial measured "
            f"{_pct(a['trial_gain'])} (95% interval {_pct(a['trial_low'])} to {_pct(a['trial_high'])}) at "
            f"{workers_text(a['num_workers'])}; the rerun's end-to-end trial there: {_pct(a['rerun_gain'])}, "
            f"{agree}"
        )
    return out


def _references(c: Comparison, runs: list) -> list[str]:
    out = []
    for lab, run, ref in zip(c.labels, runs, c.references):
        line = reference_line(run.meta.get("cpu_reference")) or "no CPU reference recorded"
        out.append(f"{lab}: {line}" + (f" — {ref:,.0f} decodes/s on all cores (start and end mean)" if ref else ""))
    return out


def _counts(c: Comparison) -> str:
    df = c.ratios
    within = int((df["within_noise"] == True).sum())  # noqa: E712 - None (no interval) is neither
    return (
        f"{len(df)} matching trials: {within} within noise, "
        f"{int((df['within_noise'] == False).sum())} differ, "  # noqa: E712
        f"{int(df['within_noise'].isna().sum())} without an interval"
    )


def render_compare_markdown(c: Comparison, runs: list) -> str:
    """The comparison as markdown, for pasting into an issue."""
    headers, rows, common = ratio_rows(c)
    parts = [
        f"# pipeprof compare: {', '.join(f'`{lab}`' for lab in c.labels)}",
        "",
        f"Baseline `{c.labels[0]}`; ratio = run ÷ baseline. {_counts(c)}.",
        "",
    ]
    diffs = _differences(c)
    parts += ["## What differs", ""] + ([f"- {d}" for d in diffs] or ["- nothing in the configs or machines"])
    changes = _changes(c)
    parts += ["", "## Changed in every trial", ""] + [f"- {x}" for x in changes] if changes else []
    parts += [
        "",
        "## Matching trials",
        "",
        f"Every row: {common}." if common else "",
        "| " + " | ".join(headers) + " |",
        "|" + "---|" * len(headers),
    ]
    parts += ["| " + " | ".join(cell.replace("|", "/") for cell in row) + " |" for row in rows]
    parts += ["", "## Answers", ""] + [
        f"- `{lab}`: {line}" for lab, run in zip(c.labels, runs) for line in answer_lines(run)
    ]
    parts += ["", "## CPU reference", ""] + [f"- {line}" for line in _references(c, runs)]
    return "\n".join(parts) + "\n"


def render_compare_html(c: Comparison, runs: list) -> str:
    """The comparison as one offline HTML page: overlaid curves, the ratio table, what differs."""
    headers, rows, common = ratio_rows(c)
    diffs = _differences(c) or ["nothing in the configs or machines"]
    answers = "".join(
        f"<li><b>{esc(lab)}</b>: {esc(line)}</li>" for lab, run in zip(c.labels, runs) for line in answer_lines(run)
    )
    figs = "".join(
        f'<figure id="{esc(f.id)}"><h3>{esc(f.title)}</h3>{f.svg}<figcaption>{esc(f.caption)}</figcaption></figure>'
        for f in F.compare_figures(runs, c.labels)
    )
    body = [
        f'<h1>pipeprof compare</h1><p class="sub">{" · ".join(esc(lab) for lab in c.labels)} — baseline '
        f"<b>{esc(c.labels[0])}</b>; ratio = run ÷ baseline. {esc(_counts(c))}.</p>",
        '<h2>What differs</h2><ul id="differences">'
        + "".join(f"<li>{esc(d)}</li>" for d in diffs)
        + "".join(f'<li class="changed">{esc(x)}</li>' for x in _changes(c))
        + "</ul>",
        f'<h2>Answers</h2><ul class="notes">{answers}</ul>',
        "<h2>Curves</h2>" + figs,
        "<h2>Matching trials</h2>"
        + (f'<p class="small">Every row: {esc(common)}.</p>' if common else "")
        + table_html(headers, rows, "table-ratios", TEXT)
        + '<p class="small">Within noise: the two trials\' 95% intervals overlap. Ratio ÷ CPU reference ratio: '
        "the ratio with the machines' measured CPU speed taken out (meaningful for CPU-bound trials).</p>",
        '<h2>CPU reference</h2><ul class="notes">'
        + "".join(f"<li>{esc(x)}</li>" for x in _references(c, runs))
        + "</ul>",
    ]
    return page("pipeprof compare · " + " vs ".join(c.labels), "\n".join(body))
