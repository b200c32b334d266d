"""The self-contained HTML report: ``out/<run>/report.html``.

One file that works offline: the CSS is inline, the figures are inline SVG (``figures``), there is
no script and nothing is fetched. Every string that comes from the user or the file system
(paths, names, error texts, config values) goes through :func:`esc`. The page reads the stored
run only: the answer and actions from ``summary``, the tables from ``console.sections``.
"""

from __future__ import annotations

import json
import os
from html import escape
from pathlib import Path

import yaml

from pipeprof.stats import signed_pct

from . import figures as F
from .console import curve_tables, legend, recommendation_lines, reference_line, sections
from .summary import (
    actions,
    answers,
    at_trial_words,
    best_action_line,
    confidence_line,
    gain_interval,
    group_answers,
    pair_trial_line,
    pair_trials,
    rate,
    review_table,
    why,
)

REPORT = "report.html"
CSS = """
body{font:15px/1.5 system-ui,-apple-system,"Segoe UI",Roboto,"DejaVu Sans",sans-serif;color:#1d2329;
  background:#f6f7f9;margin:0}
main{max-width:1120px;margin:0 auto;padding:24px 28px 48px;background:#fff;min-height:100vh}
h1{font-size:26px;margin:0 0 4px}
h2{font-size:20px;margin:36px 0 10px;border-bottom:2px solid #e3e6ea;padding-bottom:4px}
h3{font-size:16px;margin:22px 0 6px}.sub{color:#5b6670;margin:0}
.answer{background:#eef5ff;border-left:5px solid #1f77b4;padding:12px 18px;margin:18px 0;font-size:17px}
.answer p{margin:6px 0}.answer .group{display:block;font-size:13px;color:#5b6670}
table{border-collapse:collapse;margin:8px 0 14px;font-size:13.5px;font-variant-numeric:tabular-nums}
th,td{padding:4px 10px;border-bottom:1px solid #e3e6ea;text-align:right;vertical-align:top}
th{background:#f0f2f5;font-weight:600}td.t,th.t{text-align:left}td:not(.t){white-space:nowrap}
tr:nth-child(even) td{background:#fafbfc}
.wrap{overflow-x:auto}figure{margin:16px 0 28px}figure svg{max-width:100%;height:auto}
figcaption{color:#5b6670;font-size:13px}.small{font-size:13px;color:#5b6670}
details{margin:8px 0;border:1px solid #e3e6ea;border-radius:4px;padding:6px 12px}summary{cursor:pointer;font-weight:600}
pre{white-space:pre-wrap;word-break:break-word;font-size:12.5px;background:#f6f7f9;padding:10px}
ul.notes li{margin:4px 0}
"""


def esc(value) -> str:
    """Text for the page: None and NaN as a dash, anything else escaped (quotes too)."""
    if value is None or (isinstance(value, float) and value != value):
        return "–"
    return escape(str(value), quote=True)


def page(title: str, body: str) -> str:
    """A complete offline page around ``body`` (already escaped HTML)."""
    return (
        f'<!DOCTYPE html>\n<html lang="en"><head><meta charset="utf-8">'
        f'<meta name="viewport" content="width=device-width, initial-scale=1">'
        f"<title>{esc(title)}</title><style>{CSS}</style></head>\n<body><main>\n{body}\n</main></body></html>\n"
    )


def table_html(headers: list[str], rows: list[list], table_id: str = "", text_cols: frozenset = frozenset()) -> str:
    """A table of escaped cells; ``text_cols`` (header names) align left."""
    ident = f' id="{esc(table_id)}"' if table_id else ""
    cls = ["t" if h in text_cols else "" for h in headers]
    head = "".join(f'<th class="{c}">{esc(h)}</th>' for h, c in zip(headers, cls))
    body = "".join(
        "<tr>" + "".join(f'<td class="{c}">{esc(v)}</td>' for v, c in zip(row, cls)) + "</tr>" for row in rows
    )
    return f'<div class="wrap"><table{ident}><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table></div>'


def _header(run) -> str:
    meta, machine = run.meta, run.meta.get("machine", {})
    cfg, data = meta.get("config", {}), meta.get("config", {}).get("data", {})
    gpus = ", ".join(g.get("name", "?") for g in machine.get("gpus", []) if isinstance(g, dict)) or "no GPU"
    dataset = meta.get("dataset") or {}
    facts = [
        f"{dataset['images']} images" if dataset.get("images") else None,
        f"{dataset['mean_kb']:.0f} KB mean" if dataset.get("mean_kb") else None,
    ]
    where = data.get("path") or data.get("factory")
    return (
        f'<h1>pipeprof report</h1><p class="sub">run <b>{esc(run.path.name)}</b> · {esc(meta.get("status"))}'
        f" · device {esc(cfg.get('device'))} · {esc(machine.get('cpu_model'))}, "
        f"{esc(machine.get('cores', {}).get('usable'))} usable cores · {esc(gpus)}</p>"
        f'<p class="sub">data: {esc(data.get("kind"))}{f" <code>{esc(where)}</code>" if where else ""}'
        f"{''.join(f' · {esc(f)}' for f in facts if f)}</p>"
    )


def _answer(run) -> str:
    pairs = answers(run)
    failed = run.meta.get("analysis", {}).get("failures") or {}  # analysis.failures: why, and what it rests on
    if not pairs:
        why_not = (
            failed.get("no_answer")
            or "No answer: no end-to-end trial finished, or the run stopped before its analysis."
        )
        return f'<section id="answer" class="answer"><p>{esc(why_not)}</p></section>'
    items = "".join(
        f'<p><span class="group">{esc(label)}</span>{esc(text)}</p>'
        + "".join(f'<p class="small">{esc(x)}</p>' for x in (best_action_line(a), confidence_line(a), why(a)) if x)
        # the pair trial under the answer's evidence: its pick, rival, ratio and interval as its row stored them
        + "".join(f'<p class="small pair">{esc(pair_trial_line(r))}</p>' for r in pair_trials(run, a))
        for (label, text), a in zip(pairs, group_answers(run))
    )
    rests = f'<p class="small">{esc(failed["rests_on"])}</p>' if failed.get("rests_on") else ""
    return f'<section id="answer" class="answer">{items}{rests}</section>'


ACTION_HEADERS = [
    "group",
    "action",
    "predicted samples/s",
    "predicted gain",
    "measured samples/s (baseline)",
    "measured gain",
    "verified",
    "basis; why not tried",
]


def _action_row(a) -> list:
    """One row of "What would help": the prediction beside the measurement, or labelled a prediction."""
    finding = a.gain_frac is None and not a.tried and not a.why_not_tried  # "the GPU is the limit"
    predicted = (
        "finding"
        if finding
        else (
            "–"
            if a.gain_frac is None
            else f"{signed_pct(a.gain_frac)}"
            + at_trial_words(a.gain_frac, a.gain_at_trial)
            + (" (within noise)" if a.within_noise else "")
        )
    )
    if a.measured:
        measured = f"{rate(a.measured_samples_per_s)} ({rate(a.baseline_samples_per_s)})"
        ci = gain_interval(*a.measured_gain_ci95, a.ci_level) or "one pair: no interval"
        gain = f"{signed_pct(a.measured_gain_frac)} ({ci})"
        verified = ("yes" if a.verified else "no") + (" (unstable)" if a.unstable else "")
        note = "; ".join(x for x in (a.basis, f"unstable: {a.unstable}" if a.unstable else "") if x)
    elif a.tried:
        measured, gain, verified, note = "–", "–", "no", f"action trial failed: {a.error}"
    else:
        measured, gain, verified = "–", "–", "prediction" if a.tried is False and a.gain_frac is not None else "–"
        note = "; ".join(x for x in (a.basis, f"not tried: {a.why_not_tried}" if a.why_not_tried else "") if x)
    return [a.group, a.action, rate(a.predicted_samples_per_s), predicted, measured, gain, verified, note]


def _held_back(a) -> str | None:
    """Why a row of "What would help" folds into its group's line of the same reason (the first screen's rule,
    ``console.action_summary_lines``); None for a row shown whole: tried, predicted to help beyond the noise, or a
    finding (no gain to predict, nothing to try: "the GPU is the limit")."""
    if a.tried or (a.gain_frac is not None and not a.within_noise):
        return None
    if a.gain_frac is not None:
        return "predicted within the measured noise"
    return a.why_not_tried


def _action_rows(run) -> list[list]:
    """The rows of "What would help": each shown whole, then per group and reason one row for those it held
    back, naming them ("7 changes: …") with the reason once."""
    rows, folded = [], {}
    for a in actions(run):
        why = _held_back(a)
        if why is None:
            rows.append(_action_row(a))
        else:
            folded.setdefault((a.group, why), []).append(a.action)
    for (group, why), names in folded.items():
        what = names[0] if len(names) == 1 else f"{len(names)} changes: " + "; ".join(names)
        rows.append([group, what, "–", "–", "–", "–", "–", f"not tried: {why}"])
    return rows


def _curve(run) -> str:
    """Each group's curve as the first screen prints it (``console.curve_tables``), under the answer."""
    parts = [
        f"<h3>{esc(title)}</h3>" + table_html(headers, rows, text_cols=frozenset({"verdict"}))
        for title, headers, rows in curve_tables(run)
    ]
    return "<h2>The curve</h2>" + "".join(parts) if parts else ""


def _actions(run) -> str:
    rows = _action_rows(run)
    if not rows:
        return ""
    return (
        "<h2>What would help, ranked</h2>"
        + table_html(ACTION_HEADERS, rows, "table-actions", frozenset({"group", "action", "basis; why not tried"}))
        + '<p class="small">Predicted gain: the change over the measured rate with the same model as the verdicts '
        '("within noise": not larger than the trial\'s own 95% interval). Measured: an action trial, the change '
        "and its baseline in alternating windows on one step at the recommended worker count; verified: the whole "
        "interval of the gain lies above zero (95%, or for k trials of a group each at 1 - 5%/k, so that all hold "
        "together and the best of them is not named on chance). A row not tried stays a prediction and says why; "
        "the rows one reason held back are one row, that reason said once.</p>"
    )


REVIEW_HEADERS = {
    "model": "model",
    "precision": "precision",
    "gpus": "GPUs",
    "train_samples_per_s": "train img/s (step alone)",
    "inference_samples_per_s": "inference img/s (step alone)",
    "end_to_end_samples_per_s": "end to end img/s (best workers)",
    "train_over_fp32": "train ÷ FP32",
    "inference_over_fp32": "inference ÷ FP32",
    "train_scaling": "train scaling (1 = linear)",
    "inference_scaling": "inference scaling (1 = linear)",
}


def _review_cell(col: str, value, precision: str) -> str:
    if value is None or value != value:
        return "–"
    if col.endswith("_over_fp32"):
        return "–" if precision == "fp32" else f"{value:.2f}×"
    if col.endswith("_scaling"):
        return f"{value:.2f}"
    return rate(value) if col.endswith("_samples_per_s") else str(value)


def _review(run) -> str:
    table = review_table(run)
    if table.empty:
        return ""
    cols = [c for c in REVIEW_HEADERS if c in table]
    rows = [[_review_cell(c, r[c], r["precision"]) for c in cols] for _, r in table.iterrows()]
    return (
        "<h2>Images per second, model × precision</h2>"
        + table_html([REVIEW_HEADERS[c] for c in cols], rows, "table-review", frozenset({"model", "precision"}))
        + '<p class="small">Step alone: the train (or inference) step on a batch already on the device '
        "(gpu_ceiling). End to end: the best rate over the worker counts measured, the pipeline feeding the "
        "step. ÷ FP32: the same model, mode and GPU count in FP32.</p>"
    )


def _figures(run, loads: list) -> str:
    out = []
    for build in (
        F.curve_figures,
        F.step_split_figure,
        F.timeline_figure,
        F.stage_figure,
        F.precision_figure,
        F.mode_figure,
        F.storage_figure,
        F.scaling_figure,
    ):
        out += build(run)
    out += F.sizing_figure(loads)
    return "".join(
        f'<figure id="{esc(f.id)}"><h3>{esc(f.title)}</h3>{f.svg}<figcaption>{esc(f.caption)}</figcaption></figure>'
        for f in out
    )


def _sizing(loads: list, pairs) -> str:
    """``pipeprof size`` for this run alone (its ``analysis.workstation.workloads``: none where the analysis
    skipped the cores figures, a CPU step, the GPU pipeline): the candidate table at 1 GPU and the cores of
    :data:`analysis.workstation.DEFAULT_CORES`, the buyer's lines, and the model against the run's own masked
    pairs where it measured some (``pairs``: ``analysis.workstation.masked_pairs``); nothing where it has no
    workload."""
    from pipeprof.analysis import workstation as ws

    from .workstation import at_least, sentence

    if not loads:
        return ""
    rows, target = ws.table(loads, ws.grid(list(ws.DEFAULT_CORES), [1])), ws.DEFAULT_TARGET
    best = ws.cheapest(rows, target)
    body = [
        [
            r["workload"],
            r["machine"],
            f"{r['samples_per_s']:,.0f} ({r['samples_per_s_low']:,.0f}–{r['samples_per_s_high']:,.0f})",
            r["binding"],
            f"{r['of_ceiling_frac']:.0%} (≥ {at_least(r['of_ceiling_low_frac'])})",
            r["note"],
        ]
        for _, r in rows.iterrows()
    ]
    lines = "".join(f"<li>{esc(t)}</li>" for t in sentence(rows, best, target))
    return (
        '<h2 id="sizing">Sizing: cores per GPU</h2>'
        + f"<ul>{lines}</ul>"
        + table_html(
            ["workload", "machine", "samples/s (range)", "binding", "of the step's ceiling", "note"],
            rows=body,
            table_id="table-sizing",
            text_cols=frozenset({"workload", "machine", "binding", "note"}),
        )
        + '<p class="small">From this run alone (<code>pipeprof size RUN_DIR... --machines FILE</code> reads several '
        f"runs and priced machines): the target is {target:.0%} of the step's ceiling; a figure past the cores "
        "this run measured is extrapolated.</p>" + _pairs(pairs)
    )


def _pairs(pairs) -> str:
    if pairs.empty:
        return ""
    body = [
        [
            r["workload"],
            str(r["cores"]),
            f"{r['all_cpus_samples_per_s']:,.0f}",
            f"{r['masked_samples_per_s']:,.0f}",
            f"{r['predicted_samples_per_s']:,.0f}",
            f"{r['error_frac']:+.1%}"
            + ("" if r["error_low"] != r["error_low"] else f" ({r['error_low']:+.1%} … {r['error_high']:+.1%})"),
            f"{r['curve_ratio'] / r['measured_ratio'] - 1:+.1%}",
        ]
        for _, r in pairs.iterrows()
    ]
    return (
        "<h3>The model against masked pairs in this run</h3>"
        + table_html(
            ["workload", "cores", "all CPUs/s", "masked/s", "predicted/s", "error (interval)", "error on the curve"],
            rows=body,
            table_id="table-pairs",
            text_cols=frozenset({"workload"}),
        )
        + '<p class="small">Each pair (<code>trials: cores_pair</code>) alternated its windows between all CPUs and a '
        "mask of as many CPUs as workers; predicted: the all-CPU windows' rate times the model's ratio of those "
        "cores to those workers on all CPUs, for the same minutes, at the CPU cost a sample the pair's all-CPU "
        "windows measured; error on the curve: the same ratio at the cost its curve's trials measured, in other "
        "minutes.</p>"
    )


def _trial_tables(run) -> str:
    tables, notes = sections(run)
    parts = [
        f"<h3>{esc(title)}</h3>" + table_html(headers, rows, text_cols=frozenset({"kind", "setting", "verdict"}))
        for title, headers, rows in tables
    ]
    parts += [f'<p class="small">{esc(n)}</p>' for n in notes]
    device = run.meta.get("config", {}).get("device", "cuda")
    return "<h2>Trials</h2>" + "".join(parts) + f'<p class="small">{esc(legend(device))}</p>'


def _details(run) -> str:
    meta = run.meta
    machine = {k: v for k, v in meta.get("machine", {}).items() if k != "libraries"}
    versions = {
        "pipeprof": meta.get("pipeprof_version"),
        "schema": meta.get("schema_version"),
        **meta.get("machine", {}).get("libraries", {}),
    }
    blocks = [
        ("Machine snapshot", json.dumps(machine, indent=2, default=str)),
        ("Resolved config", yaml.safe_dump(meta.get("config", {}), sort_keys=False)),
        ("Versions", yaml.safe_dump(versions, sort_keys=False)),
        (
            "CPU reference",
            "\n\n".join(
                filter(
                    None, [reference_line(meta.get("cpu_reference")), json.dumps(meta.get("cpu_reference"), indent=2)]
                )
            ),
        ),
        ("What each timer measured", yaml.safe_dump(meta.get("timed_regions", {}), sort_keys=False)),
        ("Adaptive search", json.dumps(meta.get("search"), indent=2) if meta.get("search") else None),
    ]
    return '<h2 id="details">Run details</h2>' + "".join(
        f"<details><summary>{esc(title)}</summary><pre>{esc(text)}</pre></details>" for title, text in blocks if text
    )


def render_html(run) -> str:
    """The whole report of a stored run as one HTML page."""
    from pipeprof.analysis.workstation import masked_pairs, workloads

    notes = "".join(f"<li>{esc(line)}</li>" for line in recommendation_lines(run))
    loads = workloads(run)  # read once, for the sizing figure and its table
    body = [
        _header(run),
        _answer(run),
        _curve(run),
        _actions(run),
        _review(run),
        "<h2>Figures</h2>",
        _figures(run, loads),
        _sizing(loads, masked_pairs(run) if loads else None),
        _trial_tables(run),
        f'<h2>Notes</h2><ul class="notes">{notes}</ul>' if notes else "",
        _details(run),
    ]
    return page(f"pipeprof · {run.path.name}", "\n".join(body))


def write_report(run, path: str | Path | None = None) -> Path:
    """Write :func:`render_html` to ``path`` (default: the run folder's report.html), atomically."""
    path = Path(path) if path is not None else run.path / REPORT
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(render_html(run), encoding="utf-8")
    os.replace(tmp, path)
    return path
