"""Console and markdown renderings of a run: one table model, two formatters."""
from __future__ import annotations

import math

import pandas as pd

# (header, column, format) — what each end-to-end row shows; units are in the headers
E2E_COLUMNS = [
    ("model", "model", "{}"), ("prec", "precision", "{}"), ("preset", "preset", "{}"),
    ("bs", "batch_size", "{:d}"), ("workers", "num_workers", "{:d}"),
    ("samples/s", "samples_per_s", "{:,.1f}"), ("CV %", "samples_per_s_cv", "{:.1%}"),
    ("data wait %", "data_wait_frac", "{:.0%}"), ("GPU util %", "gpu_util_pct_mean", "{:.0f}"),
    ("CPU util %", "cpu_util_pct_mean", "{:.0f}"), ("workers RSS MB", "workers_rss_mb_max", "{:,.0f}"),
]
ISOLATION_COLUMNS = [
    ("kind", "kind", "{}"), ("model", "model", "{}"), ("prec", "precision", "{}"), ("preset", "preset", "{}"),
    ("bs", "batch_size", "{:d}"), ("workers", "num_workers", "{:d}"),
    ("samples/s", "samples_per_s", "{:,.1f}"), ("CV %", "samples_per_s_cv", "{:.1%}"),
    ("MB/s", "read_mb_s", "{:,.1f}"),
]


def _cell(value, fmt: str) -> str:
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return "–"
    try:
        return fmt.format(int(value) if fmt == "{:d}" else value)
    except (TypeError, ValueError):
        return str(value)


def table(df: pd.DataFrame, columns) -> tuple[list[str], list[list[str]]]:
    """(headers, rows of strings) for the given column spec; failed/unstable trials flagged."""
    headers = [c[0] for c in columns] + ["note"]
    rows = []
    for _, r in df.iterrows():
        cells = [_cell(r.get(col), fmt) for _, col, fmt in columns]
        note = f"ERROR {r['error']}" if r.get("status") != "ok" else (
            f"unstable: {r['unstable_reason']}" if r.get("unstable") else "")
        rows.append(cells + [note])
    return headers, rows


def sections(run) -> list[tuple[str, list[str], list[list[str]]]]:
    """The report's tables as (title, headers, rows)."""
    df = run.trials
    out = []
    if not df.empty:
        out.append(("End-to-end", *table(df[df["kind"] == "end_to_end"], E2E_COLUMNS)))
        iso = df[df["kind"] != "end_to_end"]
        if len(iso):
            out.append(("Isolated bounds", *table(iso, ISOLATION_COLUMNS)))
    return out


def recommendation_lines(run) -> list[str]:
    lines = []
    for g in run.meta.get("analysis", {}).get("groups", []):
        lines.append(f"{g['model']} {g['precision']} {g['preset']} bs{g['batch_size']}: num_workers="
                     f"{g['recommended_workers']} gives {g['recommended_samples_per_s']:,.1f} samples/s "
                     f"(best {g['best_samples_per_s']:,.1f} at {g['best_workers']}; {g['criterion']})")
    return lines


def render_markdown(run) -> str:
    parts = [f"# pipeprof run `{run.path.name}`", ""]
    for title, headers, rows in sections(run):
        parts += [f"## {title}", "", "| " + " | ".join(headers) + " |", "|" + "---|" * len(headers)]
        parts += ["| " + " | ".join(c.replace("|", "/") for c in row) + " |" for row in rows]
        parts.append("")
    recs = recommendation_lines(run)
    if recs:
        parts += ["## Recommendations", ""] + [f"- {line}" for line in recs] + [""]
    return "\n".join(parts)


def render_console(run, console=None) -> None:
    from rich.console import Console
    from rich.table import Table

    console = console or Console()
    for title, headers, rows in sections(run):
        t = Table(title=title, show_lines=False)
        for i, h in enumerate(headers):
            t.add_column(h, justify="right" if 0 < i < len(headers) - 1 and h not in ("model", "prec", "preset", "kind") else "left")
        for row in rows:
            t.add_row(*row)
        console.print(t)
    for line in recommendation_lines(run):
        console.print(f"[bold]→[/bold] {line}")
    console.print(f"run folder: {run.path}")
