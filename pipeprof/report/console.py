"""Console and markdown renderings of a run: one table model, two formatters.

The main table is one per group (model, precision, preset, batch): a row per
worker count with the end-to-end figures beside the bounds measured in isolation
at the same settings (``analysis.curves``).
"""
from __future__ import annotations

import math

import pandas as pd

from ..analysis import curves, groups

TEXT_HEADERS = {"kind", "setting", "verdict", "!"}
# (header, column, format): units are in the headers, fractions print as %
CURVE_COLUMNS = [
    ("w", "num_workers", "{:d}"), ("samples/s", "samples_per_s", "si"),
    ("CV", "samples_per_s_cv", "{:.1%}"), ("wait", "data_wait_frac", "{:.0%}"),
    ("GPU%", "gpu_util_pct_mean", "{:.0f}"), ("CPU%", "cpu_util_pct_mean", "{:.0f}"),
    ("RAM MB", "pss_mb_steady", "{:,.0f}"), ("CPU/s", "cpu_bound_samples_per_s", "si"),
    ("I/O/s", "io_bound_samples_per_s", "si"), ("GPU/s", "gpu_bound_samples_per_s", "si"),
    ("pred/s", "predicted_samples_per_s", "si"), ("err", "prediction_error_frac", "{:+.0%}"),
    ("verdict", "verdict", "{}"),
]
ISOLATION_COLUMNS = [
    ("kind", "kind", "{}"), ("setting", "setting", "{}"), ("bs", "batch_size", "{:d}"),
    ("w", "num_workers", "{:d}"), ("samples/s", "samples_per_s", "si"),
    ("CV", "samples_per_s_cv", "{:.1%}"), ("MB/s", "read_mb_s", "si"),
]
LEGEND = ("w: DataLoader workers · samples/s: median of the timed windows · CV: spread across windows · "
          "wait: share of wall time blocked on next(loader) · GPU%/CPU%: mean utilisation in the windows · "
          "RAM MB: main + workers at steady state (PSS: shared pages counted once) · CPU/s, I/O/s, GPU/s: the loader alone, the raw reads alone "
          "and the step alone, at the same settings · pred/s: predicted from those bounds "
          "(err: prediction − measured, relative) · verdict: the bound the trial sits on")


def si(value: float) -> str:
    """3 significant figures with a k/M suffix: 47454 → 47.5k."""
    for scale, suffix in ((1e6, "M"), (1e3, "k")):
        if abs(value) >= 10 * scale:
            return f"{value / scale:.3g}{suffix}" if value / scale < 1000 else f"{value / scale:.0f}{suffix}"
    return f"{value:.4g}" if abs(value) >= 1000 else f"{value:.3g}" if abs(value) >= 1 else f"{value:.2g}"


def _cell(value, fmt: str) -> str:
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return "–"
    try:
        if fmt == "si":
            return si(float(value))
        return fmt.format(int(value) if fmt == "{:d}" else value)
    except (TypeError, ValueError):
        return str(value)


def note_of(r) -> str:
    """Why a row's figure is missing or not to be trusted ('' when it is fine)."""
    if r.get("status") != "ok":
        return f"error: {r.get('error')}"
    return f"unstable: {r.get('unstable_reason')}" if r.get("unstable") is True else ""


def table(df: pd.DataFrame, columns, notes: list[str]) -> tuple[list[str], list[list[str]]]:
    """(headers, rows of strings); a flagged row gets a [n] mark and its note appended to ``notes``."""
    headers = [c[0] for c in columns] + ["!"]
    rows = []
    for _, r in df.iterrows():
        cells = [_cell(r.get(col), fmt) for _, col, fmt in columns]
        note = note_of(r)
        if note:
            notes.append(f"[{len(notes) + 1}] {r['trial_id']}: {note}")
        rows.append(cells + [f"[{len(notes)}]" if note else ""])
    return headers, rows


def _setting(r) -> str:
    parts = {"gpu_ceiling": [r.get("model"), r.get("precision")], "cpu_pipeline": [r.get("preset"), r.get("decoder")],
             "storage_fetch": [r.get("source")]}.get(r["kind"], [])
    return " ".join(str(p) for p in parts if p is not None and p == p)


def _group_title(key: dict, curve: pd.DataFrame, device: str) -> str:
    ceiling = curve["gpu_bound_samples_per_s"].dropna()
    what = "GPU" if device == "cuda" else "step (on CPU)"
    tail = f" — {what} ceiling {ceiling.iloc[0]:,.1f} samples/s" if len(ceiling) else ""
    return f"{key['model']} {key['precision']} · {key['preset']} · batch {key['batch_size']}{tail}"


def sections(run) -> tuple[list[tuple[str, list[str], list[list[str]]]], list[str]]:
    """The report's tables as (title, headers, rows), and the footnotes they refer to."""
    df, out, notes = run.trials, [], []
    if df.empty:
        return out, notes
    verdicts = pd.DataFrame(run.meta.get("analysis", {}).get("verdicts", []))
    cv = curves(df)
    if len(verdicts) and len(cv):
        cv = cv.merge(verdicts[["trial_id", "verdict", "predicted_samples_per_s", "prediction_error_frac"]],
                      on="trial_id", how="left")
    for key, curve in groups(cv):
        device = run.meta.get("config", {}).get("device", "cuda")
        out.append((_group_title(key, curve, device), *table(curve, CURVE_COLUMNS, notes)))
    failed_e2e = df[(df["kind"] == "end_to_end") & (df["status"] != "ok")]
    iso = pd.concat([df[df["kind"] != "end_to_end"], failed_e2e])
    if len(iso):
        iso = iso.assign(setting=iso.apply(_setting, axis=1))
        out.append(("Isolated bounds (and failed trials)", *table(iso, ISOLATION_COLUMNS, notes)))
    return out, notes


def recommendation_lines(run) -> list[str]:
    """The answers, one line each, every one with its number and where it came from."""
    analysis = run.meta.get("analysis", {})
    lines = []
    for g in analysis.get("groups", []):
        head = f"{g['model']} {g['precision']} {g['preset']} bs{g['batch_size']}"
        lines.append(f"{head}: num_workers={g['recommended_workers']} gives {g['recommended_samples_per_s']:,.1f} "
                     f"samples/s, {g.get('verdict_at_recommended', '?')} (best {g['best_samples_per_s']:,.1f} at "
                     f"{g['best_workers']}; {g['criterion']})")
        need = g.get("cores_needed")
        if need:
            extra = ", extrapolated beyond the workers measured" if need["extrapolated"] else ""
            lines.append(f"{head}: {need['cores_needed']} cores per GPU to reach the step ceiling ({need['basis']}{extra})")
        for a in g.get("actions", [])[:3]:
            if a["gain_frac"] is not None:
                lines.append(f"{head}: {a['action']} → {a['predicted_samples_per_s']:,.1f} samples/s "
                             f"({a['gain_frac']:+.0%}; {a['basis']})")
    err = analysis.get("prediction_error_abs_median")
    if err is not None:
        lines.append(f"prediction accuracy: median |predicted − measured| / measured = {err:.1%} over "
                     f"{len(analysis.get('verdicts', []))} end-to-end trials")
    for o in analysis.get("stage_timing_overhead", []):
        verdict = "" if o.get("resolved") else f", within the run-to-run noise of ±{2 * o['noise_frac']:.0%}"
        lines.append(f"stage clocks cost {o['overhead_frac']:+.1%} of the {o['preset']} pipeline rate at "
                     f"{o['num_workers']} workers ({o['timed_samples_per_s']:,.1f} timed vs "
                     f"{o['untimed_samples_per_s']:,.1f} untimed samples/s{verdict})")
    return lines


def render_markdown(run) -> str:
    parts = [f"# pipeprof run `{run.path.name}`", ""]
    tables, notes = sections(run)
    for title, headers, rows in tables:
        parts += [f"## {title}", "", "| " + " | ".join(headers) + " |", "|" + "---|" * len(headers)]
        parts += ["| " + " | ".join(c.replace("|", "/") for c in row) + " |" for row in rows] + [""]
    parts += [f"{n}  " for n in notes] + ["", f"_{LEGEND}_", ""]
    recs = recommendation_lines(run)
    if recs:
        parts += ["## Recommendations", ""] + [f"- {line}" for line in recs] + [""]
    return "\n".join(parts)


def render_console(run, console=None) -> None:
    from rich import box
    from rich.console import Console
    from rich.table import Table

    console = console or Console(width=None if Console().is_terminal else 140)
    tables, notes = sections(run)
    for title, headers, rows in tables:
        t = Table(title=title, box=box.SIMPLE_HEAD, title_justify="left", pad_edge=False)
        for h in headers:
            t.add_column(h, justify="left" if h in TEXT_HEADERS else "right")
        for row in rows:
            t.add_row(*row)
        console.print(t)
    for n in notes:
        console.print(f"  {n}", style="yellow", highlight=False)
    console.print(LEGEND, style="dim", highlight=False)
    for line in recommendation_lines(run):
        console.print(f"[bold]→[/bold] {line}", highlight=False)
    console.print(f"run folder: {run.path}", highlight=False)
