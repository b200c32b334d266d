"""Console and markdown renderings of a run: one table model, two formatters.

The main table is one per group (model, precision, preset, batch): a row per
worker count with the end-to-end figures beside the bounds measured in isolation
at the same settings (``analysis.curves``).
"""

from __future__ import annotations

import math

import pandas as pd

from pipeprof.analysis import groups
from pipeprof.answer import Answer, CoresNeeded
from pipeprof.stats import signed_pct

from .summary import answer_lines, at_trial_words, gain_interval, gpu_count, group_answers, shape

TEXT_HEADERS = {"kind", "setting", "verdict", "!"}
# (header, column, format): units are in the headers, fractions print as %
CURVE_COLUMNS = [
    ("w", "num_workers", "{:d}"),
    ("samples/s", "samples_per_s", "si"),
    ("CV", "samples_per_s_cv", "{:.1%}"),
    ("wait", "data_wait_frac", "{:.0%}"),
    ("GPU%", "gpu_util_pct_mean", "{:.0f}"),
    ("CPU%", "cpu_util_pct_mean", "{:.0f}"),
    ("RAM MB", "pss_mb_steady", "{:,.0f}"),
    ("CPU/s", "cpu_bound_samples_per_s", "si"),
    ("I/O/s", "io_bound_samples_per_s", "si"),
    ("GPU/s", "step_bound_samples_per_s", "si"),
    ("pred/s", "predicted_samples_per_s", "si"),
    ("err", "prediction_error_frac", "{:+.0%}"),
    ("verdict", "verdict", "{}"),
]
ISOLATION_COLUMNS = [
    ("kind", "kind", "{}"),
    ("setting", "setting", "{}"),
    ("bs", "batch_size", "{:d}"),
    ("w", "num_workers", "{:d}"),
    ("samples/s", "samples_per_s", "si"),
    ("CV", "samples_per_s_cv", "{:.1%}"),
    ("MB/s", "read_mb_s", "si"),
    ("p50 ms", "read_latency_ms_p50", "si"),
    ("p99 ms", "read_latency_ms_p99", "si"),
    ("disk", "disk_read_frac", "{:.0%}"),
]
LEGEND = (
    "w: DataLoader workers · samples/s: median of the timed windows · CV: spread across windows · "
    "wait: share of wall time blocked on next(loader) · GPU%/CPU%: mean utilisation in the windows · "
    "RAM MB: main + workers at steady state (PSS: shared pages counted once) · CPU/s, I/O/s, GPU/s: the loader "
    "alone, the raw reads alone and the step alone, at the same settings · pred/s: predicted from those "
    "bounds (err: prediction − measured, relative) · verdict: the bound the trial sits on, from its own data "
    "wait and busy cores first · p50/p99 ms: per-read latency of the raw reads · disk: share of the bytes "
    "read that came from the disk, not the page cache · (emulated): a throttled source's speed is imposed, "
    "not measured"
)


def legend(device: str) -> str:
    """The legend in the device's words: a machine without a GPU has a step, not a GPU."""
    return LEGEND if device == "cuda" else LEGEND.replace("GPU%/CPU%", "CPU%").replace("GPU/s", "step/s")


def si(value: float) -> str:
    """3 significant figures with a k/M suffix: 47454 → 47.5k."""
    # thresholds compare the value as it will be rounded, so 999.7 prints "1000", not "1e+03"
    for scale, suffix in ((1e6, "M"), (1e3, "k")):
        if abs(float(f"{value / scale:.3g}")) >= 10:
            scaled = value / scale
            return f"{scaled:.3g}{suffix}" if abs(float(f"{scaled:.3g}")) < 1000 else f"{scaled:.0f}{suffix}"
    if abs(float(f"{value:.3g}")) >= 1000:
        return f"{value:.0f}"
    return f"{value:.3g}" if abs(value) >= 1 else f"{value:.2g}"


def _cell(value, fmt: str) -> str:
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return "–"
    try:
        if fmt == "si":
            return si(float(value))
        text = fmt.format(int(value) if fmt == "{:d}" else value)
        return "+0%" if text == "-0%" else text  # a signed change that rounds to zero has no sign
    except (TypeError, ValueError):
        return str(value)


def curve_columns(device: str) -> list:
    """The curve table's columns; on a machine without a GPU the step's words, and no GPU%."""
    if device == "cuda":
        return CURVE_COLUMNS
    return [
        ("step/s", col, fmt) if col == "step_bound_samples_per_s" else (h, col, fmt)
        for h, col, fmt in CURVE_COLUMNS
        if col != "gpu_util_pct_mean"
    ]


def note_of(r) -> str:
    """Why a row's figure is missing, not to be trusted, or argued with ('' when it is fine)."""
    if r.get("status") != "ok":
        return f"{r.get('status')}: {r.get('error')}"
    text = lambda key: r.get(key) if isinstance(r.get(key), str) else None  # noqa: E731
    notes = [
        f"unstable: {r.get('unstable_reason')}" if r.get("unstable") is True else None,
        text("cache_note"),
        f"bounds disagree: {text('disagreement')}" if text("disagreement") else None,
    ]
    return "; ".join(n for n in notes if n)


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


def _storage(r) -> list:
    """Source label, cache state (when it applies) and an emulated mark."""
    state = r.get("cache_state")
    return [r.get("source"), None if state == "n/a" else state, "(emulated)" if r.get("emulated") is True else None]


def _setting(r) -> str:
    parts = {
        "gpu_ceiling": [r.get("model"), r.get("precision")],
        "cpu_pipeline": [r.get("preset"), r.get("decoder"), *_storage(r)],
        "storage_fetch": _storage(r),
    }.get(r["kind"], [])
    text = " ".join(str(p) for p in parts if p is not None and p == p)
    return f"{text} ({shape(r)})" if shape(r) else text


def _group_title(key: dict, curve: pd.DataFrame, device: str) -> str:
    ceiling = curve["step_bound_samples_per_s"].dropna()
    what = "GPU" if device == "cuda" else "step (on CPU)"
    tail = f" — {what} ceiling {ceiling.iloc[0]:,.1f} samples/s" if len(ceiling) else ""
    where = " ".join(
        str(p)
        for p in _storage(key | {"emulated": bool(curve.get("emulated", pd.Series([False])).any())})
        if p is not None and p == p
    )
    where = f" · {where}" if where else ""
    extra = f" · {shape(key)}" if shape(key) else ""
    return f"{key['model']} {key['precision']} · {key['preset']} · batch {key['batch_size']}{where}{extra}{tail}"


def _device(run) -> str:
    return run.meta.get("config", {}).get("device", "cuda")


def sections(run) -> tuple[list[tuple[str, list[str], list[list[str]]]], list[str]]:
    """The report's tables as (title, headers, rows), and the footnotes they refer to: the curve
    rows as the analysis stored them, then the isolated trials from trials.parquet."""
    df, out, notes = run.trials, [], []
    if df.empty:
        return out, notes
    device = _device(run)
    for key, curve in groups(pd.DataFrame(run.meta.get("analysis", {}).get("curves", []))):
        out.append((_group_title(key, curve, device), *table(curve, curve_columns(device), notes)))
    analysed = "analysis" in run.meta  # a run that stopped early saved none: its end-to-end rows go here too
    failed_e2e = df[(df["kind"] == "end_to_end") & ((df["status"] != "ok") | (not analysed))]
    iso = pd.concat([df[df["kind"] != "end_to_end"], failed_e2e])
    if len(iso):
        iso = iso.assign(setting=iso.apply(_setting, axis=1))
        title = "Isolated bounds (and failed trials)" if analysed else "Trials as measured (no analysis saved)"
        out.append((title, *table(iso, ISOLATION_COLUMNS, notes)))
    return out, notes


def recommendation_lines(run) -> list[str]:
    """The evidence below the answers (each group's pick, cores and actions), then the run's own figures, one line
    each, every one with its number and where it came from."""
    analysis = run.meta.get("analysis", {})
    lines = [line for a in group_answers(run) for line in _group_lines(a)]
    lines += _page_cache_lines(run.meta.get("storage") or {}, analysis)
    lines += [e["text"] for e in analysis.get("epochs", [])]
    lines += _trust_lines(analysis) + data_lines(analysis)
    lines += [
        _overhead_line(o) for o in analysis.get("stage_timing_overhead", []) if "on_samples_per_s" in o
    ]  # without it: a run from before the alternating measurement
    lines += [
        _overhead_line(o, "the 10 Hz monitor", ("monitored", "unmonitored"))
        for o in analysis.get("monitor_overhead", [])
    ]
    ref = reference_line(run.meta.get("cpu_reference"))
    return lines + ([ref] if ref else [])


def _group_lines(a: Answer) -> list[str]:
    """One group's evidence below its answer: how its count was picked, cores per GPU and its first three
    actions. The answer itself is worded once, by ``summary.answer``, and printed once, above the tables
    (:func:`print_answer`): these lines do not say it again."""
    where = " ".join(str(p) for p in _storage(a.key) if p is not None and p == p)
    k = a.key
    head = (
        f"{k['model']} {k['precision']} {k['preset']} bs{k['batch_size']}"
        + (f" {where}" if where else "")
        + (f" ({shape(k)})" if shape(k) else "")
    )
    tied = [w for w in a.tied_with_best if w != a.workers]
    tie = f"; tied within noise: {', '.join(map(str, tied))}" if tied else ""
    best = f"{a.best_workers} worker{'' if a.best_workers == 1 else 's'}"
    lines = [
        f"{head}: num_workers={a.workers} is the {a.criterion} (best {a.best_samples_per_s:,.1f} samples/s "
        f"at {best}{tie})"
    ]
    if a.cores_needed is not None:
        lines.append(_cores_line(head, a.cores_needed, gpu_count(k)))
    if a.cpu_figures_skipped:
        lines.append(f"{head}: no cores-per-GPU or what-if: {a.cpu_figures_skipped}")
    lines += [line for x in a.actions[:3] if (line := _action_line(head, x))]
    skipped = [
        f"{x['action']} ({x['why_not_tried']})"
        for x in a.actions[3:]
        if x.get("tried") is False and x.get("why_not_tried") and x.get("gain_frac") is None
    ]
    return lines + ([f"{head}: not tried: {'; '.join(skipped)}"] if skipped else [])


def _cores_line(head: str, need: CoresNeeded, gpus: int = 1) -> str:
    """Cores to reach the step ceiling: per GPU on one GPU; for N GPUs the job's figure, and per GPU."""
    if need.cores is None:
        return f"{head}: no core count feeds the step ceiling: {need.basis}"
    extra = ", extrapolated beyond the workers measured" if need.extrapolated else ""
    what = "cores per GPU" if gpus == 1 else f"cores for the {gpus} GPUs ({need.cores / gpus:.1f} per GPU)"
    return f"{head}: {need.cores} {what} to reach the step ceiling ({need.basis}{extra})"


def _action_line(head: str, a: dict) -> str | None:
    """An action as its trial measured it beside its prediction; else its prediction, labelled as one when it
    was not tried, with why; or a finding (no gain, no rate); None for anything else."""
    if a.get("tried"):
        return _measured_line(head, a)
    if a["gain_frac"] is None and a.get("predicted_samples_per_s") is None:
        why = f"not tried: {a['why_not_tried']}" if a.get("why_not_tried") else ""
        return f"{head}: {a['action']} ({'; '.join(x for x in (a['basis'], why) if x)})"
    if a["gain_frac"] is None:
        return None
    noise = ", within the measured noise: not shown to help" if a.get("within_noise") else ""
    tried = f"; a prediction, not tried: {a['why_not_tried']}" if a.get("why_not_tried") else ""
    return (
        f"{head}: {a['action']} → {a['predicted_samples_per_s']:,.1f} samples/s predicted "
        f"({signed_pct(a['gain_frac'])}{noise}; {a['basis']}{tried})"
    )


def _measured_line(head: str, a: dict) -> str:
    """'→ measured R vs B samples/s (+g, 95% interval, verified or not); predicted +p' for a tried action."""
    if not a.get("measured"):
        return f"{head}: {a['action']}: its action trial ended {a.get('status')}: {str(a.get('error'))[:160]}"
    ci = gain_interval(a.get("measured_gain_ci95_low"), a.get("measured_gain_ci95_high"), a.get("ci_level") or 0.95)
    ci = f", {ci}" if ci else ", one pair: no interval"
    verdict = ("verified" if a.get("verified") else "not shown to help") + (
        f"; unstable: {a['unstable_reason']}" if a.get("unstable") else ""
    )
    rebased = at_trial_words(a.get("gain_frac"), a.get("predicted_gain_at_trial_frac"))
    predicted = (
        f"; predicted {signed_pct(a['gain_frac'])}{rebased} ({a['basis']})" if a.get("gain_frac") is not None else ""
    )
    return (
        f"{head}: {a['action']} → measured {a['measured_samples_per_s']:,.1f} vs "
        f"{a['baseline_samples_per_s']:,.1f} samples/s ({signed_pct(a['measured_gain_frac'])}{ci}: {verdict})"
        f"{predicted}"
        f"{_worker_cost(a)}"
    )


def _worker_cost(a: dict) -> str:
    """Where a prediction missed: what a sample cost the workers on each side in the trial (their stage clocks),
    the measured form of the share the prediction removed."""
    now, was = a.get("worker_us_per_sample"), a.get("baseline_worker_us_per_sample")
    if a.get("agrees") is not False or not (now and was):
        return ""
    return (
        f"; outside the measured interval: in the trial a sample cost the workers {now:,.0f} µs against "
        f"{was:,.0f} µs ({signed_pct(now / was - 1)})"
    )


def _page_cache_lines(storage: dict, analysis: dict) -> list[str]:
    if storage.get("fits_in_page_cache") and (
        len(storage.get("sources", {})) > 1
        or analysis.get("epochs")
        or set(storage.get("cache_states", ["warm"])) != {"warm"}
    ):
        return [
            f"dataset {storage['dataset_total_mb']:,.1f} MB, {storage['dataset_samples']} samples: "
            f"{storage['fits_in_page_cache']['reason']}"
        ]
    return []


def _trust_lines(analysis: dict) -> list[str]:
    """How far the run's figures can be trusted: unstable trials and the model's prediction error."""
    lines = []
    if analysis.get("unstable_trials"):
        causes = ", ".join(f"{c}: {n}" for c, n in analysis.get("unstable_causes", {}).items())
        lines.append(
            f"{analysis['unstable_trials']} of {analysis['trials']} trials unstable (95% interval wider "
            f"than ±5% of the median){f' — likely causes: {causes}' if causes else ''}"
        )
    err = analysis.get("prediction_error_abs_median")
    if err is not None:
        lines.append(
            f"prediction accuracy: median |predicted − measured| / measured = {err:.1%} over "
            f"{len(analysis.get('verdicts', []))} end-to-end trials"
        )
    return lines


def data_lines(analysis: dict) -> list[str]:
    """Per trial, the bad samples skipped and the outsize images met, with the first paths."""
    lines = [
        f"{r['trial_id']}: skipped {r['bad_samples']} sample(s) that could not be read or decoded "
        f"({r.get('bad_samples_frac') or 0:.1%}{'; trial failed' if r.get('status') != 'ok' else ''}), first: "
        f"{r.get('bad_samples_first')}"
        for r in analysis.get("bad_samples", [])
    ]
    for r in analysis.get("large_images", []):
        cost = r.get("large_images_cost_frac")
        share = f", {cost:.0%} of the workers' clocked time" if cost is not None else ""
        lines.append(
            f"{r['trial_id']}: {r['large_images']} outsize image(s) above data.max_pixels{share}, first: "
            f"{r.get('large_images_first')}"
        )
    return lines


def _overhead_line(o: dict, what: str = "stage clocks", modes: tuple = ("clocked", "unclocked")) -> str:
    verdict = "" if o.get("resolved") else ": not distinguishable from zero"
    interval = (
        "one pair of windows: no interval"
        if o["overhead_ci95_low"] is None
        else f"95% interval {o['overhead_ci95_low']:+.1%} to {o['overhead_ci95_high']:+.1%}{verdict}"
    )
    return (
        f"{what} cost {o['overhead_frac']:+.1%} ({interval}) of the {o['preset']} pipeline rate at "
        f"{o['num_workers']} workers ({o['on_samples_per_s']:,.1f} {modes[0]} vs {o['off_samples_per_s']:,.1f} "
        f"{modes[1]} samples/s, windows alternated on one loader)"
    )


def reference_line(ref: dict) -> str | None:
    """One console line: the machine's decode rates at start and end, and its drift."""
    if not ref or "start" not in ref:
        return None

    def fmt(m: dict) -> str:
        return ", ".join(
            f"{p['processes']} proc {p['decodes_per_s']:,.0f}/s"
            + (f" ({p['per_process_min']:,.0f}–{p['per_process_max']:,.0f} per proc)" if p["processes"] > 1 else "")
            for p in m["points"]
        )

    text = f"machine CPU reference (fixed JPEG decode): start {fmt(ref['start'])}"
    d = ref.get("drift", {}).get("largest_frac")
    if "end" in ref and d is not None:
        text += (
            f"; end {fmt(ref['end'])}; drift {d:+.1%} (CPU-bound rates of two runs that differ by no "
            "more than the machine moved do not show a change in the pipeline)"
        )
    return text


def render_markdown(run) -> str:
    parts = [f"# pipeprof run `{run.path.name}`", ""] + ([f"_{run.unfinished()}_", ""] if run.unfinished() else [])
    parts += [f"**{line}**  " for line in answer_lines(run)] + [""]
    tables, notes = sections(run)
    for title, headers, rows in tables:
        parts += [f"## {title}", "", "| " + " | ".join(headers) + " |", "|" + "---|" * len(headers)]
        parts += ["| " + " | ".join(c.replace("|", "/") for c in row) + " |" for row in rows] + [""]
    parts += [f"{n}  " for n in notes] + ["", f"_{legend(_device(run))}_", ""]
    recs = recommendation_lines(run)
    if recs:
        parts += ["## Recommendations", ""] + [f"- {line}" for line in recs] + [""]
    return "\n".join(parts)


def render_text(run) -> str:
    """The console report as plain text (no colour), for files and pipes."""
    from io import StringIO

    from rich.console import Console

    buffer = StringIO()
    render_console(run, Console(file=buffer, width=140, color_system=None), full=True)
    return buffer.getvalue()


def print_answer(run, console) -> None:
    """The answer's lines in bold: at the top of the console report, and as soon as the run has it (before
    its action trials, which take a minute or more; the report after them says again with what they found)."""
    for line in answer_lines(run):
        console.print(line, style="bold", markup=False, highlight=False)


def render_console(run, console=None, answer: bool = True, full: bool = False) -> None:
    """The run's report on the terminal: the answer first (``answer``), then, ``full``, every table and note;
    else the one screen of :func:`render_compact`."""
    from rich import box
    from rich.console import Console
    from rich.table import Table

    console = console or Console(width=None if Console().is_terminal else 140)
    if not full and run.meta.get("analysis"):  # no analysis stored (a damaged or unfinished run): the tables are all
        return render_compact(run, console, answer)
    if run.unfinished():
        console.print(run.unfinished(), style="yellow", markup=False, highlight=False, soft_wrap=True)
    if answer:
        print_answer(run, console)  # the answer first, the evidence below it
    tables, notes = sections(run)
    for title, headers, rows in tables:
        t = Table(title=title, box=box.SIMPLE_HEAD, title_justify="left", pad_edge=False)
        for h in headers:
            t.add_column(
                h,
                justify="left" if h in TEXT_HEADERS else "right",
                overflow="fold" if h in TEXT_HEADERS else "ellipsis",
            )
        for row in rows:
            t.add_row(*row)
        console.print(t)
    for n in notes:  # errors quote code and paths: a "[...]" in them is text, not markup
        console.print(f"  {n}", style="yellow", markup=False, highlight=False)
    console.print(legend(_device(run)), style="dim", highlight=False)
    for line in recommendation_lines(run):
        console.print(f"[bold]→[/bold] {line}", highlight=False)
    console.print(f"run folder: {run.path}", highlight=False)


def _short_action(a: dict) -> str:
    """An action in one line for the first screen: what to change and what it gave (measured) or would give
    (predicted); its basis and caveats are in ``--full``."""
    if a.get("tried") and a.get("measured"):
        verdict = "verified" if a.get("verified") else "not shown to help"
        return (
            f"{a['action']}: measured {a['measured_samples_per_s']:,.1f} vs {a['baseline_samples_per_s']:,.1f} "
            f"samples/s ({signed_pct(a['measured_gain_frac'])}, {verdict})"
        )
    if a.get("tried"):
        return f"{a['action']}: its action trial ended {a.get('status')}"
    predicted = f"{a['predicted_samples_per_s']:,.1f} samples/s predicted"
    return f"{a['action']}: {predicted} ({signed_pct(a['gain_frac'])}, not tried)"


def action_summary_lines(a: Answer, top: int = 3) -> list[str]:
    """One group's actions for the first screen: the top ``top`` tried or predicted to help beyond the measured
    noise, one line each, then one line per reason for the rest ("7 changes not tried: <reason>"): a reason said
    once per group, never once per row. The full list stays in :func:`recommendation_lines`."""
    shown, folded = [], {}
    for x in a.actions:
        helps = x.get("tried") or (x.get("gain_frac") is not None and not x.get("within_noise"))
        if helps and len(shown) < top:
            shown.append(_short_action(x))
        elif x.get("gain_frac") is not None and x.get("within_noise") and not x.get("tried"):
            folded.setdefault("predicted within the measured noise", []).append(x)
        elif not x.get("tried"):
            folded.setdefault(x.get("why_not_tried") or "no gain predicted", []).append(x)
    lines = list(shown)
    for why, xs in folded.items():
        n = len(xs)
        lines.append(f"{n} change{'' if n == 1 else 's'} not tried: {why}")
    return lines


def data_summary_lines(analysis: dict) -> list[str]:
    """The dataset's faults on the first screen, one line each kind: the bad samples skipped and the outsize
    images met, over how many trials, with the first paths of one trial (each trial's in ``--full``)."""
    lines = []
    for key, what in (
        ("bad_samples", "sample(s) that could not be read or decoded skipped"),
        ("large_images", "outsize image(s) above data.max_pixels met"),
    ):
        rows = analysis.get(key) or []
        if rows:
            most = max(int(r.get(key) or 0) for r in rows)
            lines.append(
                f"data: up to {most} {what} in each of {len(rows)} trial(s); first: {rows[0].get(key + '_first')}"
            )
    return lines


def noise_line(run) -> str:
    """One line: how far the machine moved (the CPU reference's drift), how many trials were wide, and their
    likeliest causes where one was seen ("unseen" is no cause: such a trial counts as wide, with no cause)."""
    analysis = run.meta.get("analysis", {})
    drift = ((run.meta.get("cpu_reference") or {}).get("drift") or {}).get("largest_frac")
    moved = f"the machine moved {drift:+.1%} (CPU reference)" if drift is not None else "machine drift not measured"
    wide, total = analysis.get("unstable_trials", 0), analysis.get("trials", 0)
    causes = {c: n for c, n in analysis.get("unstable_causes", {}).items() if c not in ("unseen", "unattributed")}
    cause = "; seen: " + ", ".join(f"{c} in {n}" for c, n in causes.items()) if causes else ""
    return f"noise: {moved}; {wide} of {total} trials wide (95% interval over ±5%){cause}"


# the curve's columns a narrow screen gives up first, last to first: the count, the rate, the verdict, the wait
# and the bounds stay; RAM, CPU/s and I/O/s (in --full and report.html) go first
DROP_ORDER = ["RAM MB", "I/O/s", "CPU/s", "CV", "err", "pred/s", "CPU%", "GPU%", "GPU/s", "step/s", "wait"]


def fit_columns(headers: list[str], rows: list[list[str]], width: int | None) -> tuple[list[str], list[list[str]]]:
    """The columns of a table that fit ``width`` characters whole (rich's simple box: one space either side of
    each cell, a blank divider between cells and at the edges), dropping them in :data:`DROP_ORDER`; a cut cell
    ("sample…") or a vanished count column tells a reader nothing. ``width`` None: all of them."""
    keep = list(range(len(headers)))

    def need(cols) -> int:
        cells = sum(max(len(headers[i]), *(len(r[i]) for r in rows)) + 2 for i in cols) if rows else 0
        return cells + len(cols) + 1  # the box's blank dividers between columns and at both edges

    for name in DROP_ORDER:
        if width is None or need(keep) <= width:
            break
        keep = [i for i in keep if headers[i] != name]
    return [headers[i] for i in keep], [[r[i] for i in keep] for r in rows]


def curve_tables(run) -> list[tuple[str, list[str], list[list[str]]]]:
    """Each group's curve for the first screen and the top of report.html: (title, headers, rows), without the
    "!" column (its marks point at footnotes shown in ``--full``)."""
    device = _device(run)
    out = []
    for key, curve in groups(pd.DataFrame(run.meta.get("analysis", {}).get("curves", []))):
        headers, rows = table(curve, curve_columns(device), [])
        out.append((_group_title(key, curve, device), headers[:-1], [r[:-1] for r in rows]))
    return out


def render_compact(run, console, answer: bool = True) -> None:
    """The first screen: the answer, the curve tables, each group's top actions (the rest folded, one line a
    reason), one noise line and the run folder. The evidence (isolated bounds, footnotes, legend, every action)
    is in report.html and ``pipeprof report RUN --full``."""
    from rich import box
    from rich.table import Table

    if run.unfinished():
        console.print(run.unfinished(), style="yellow", markup=False, highlight=False, soft_wrap=True)
    if answer:
        print_answer(run, console)
    for title, headers, rows in curve_tables(run):
        headers, rows = fit_columns(headers, rows, console.width)
        t = Table(title=title, box=box.SIMPLE_HEAD, title_justify="left", pad_edge=False)
        for h in headers:
            t.add_column(h, justify="left" if h in TEXT_HEADERS else "right", overflow="ellipsis", no_wrap=True)
        for row in rows:
            t.add_row(*row)
        console.print(t)
    for a in group_answers(run):
        for line in action_summary_lines(a):
            console.print(f"→ {line}", markup=False, highlight=False)
    for line in data_summary_lines(run.meta.get("analysis", {})):
        console.print(line, markup=False, highlight=False)
    console.print(noise_line(run), markup=False, highlight=False)
    console.print(f"run folder: {run.path} (the evidence: report.html, or pipeprof report RUN --full)", highlight=False)
