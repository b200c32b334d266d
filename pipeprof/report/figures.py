"""The report's figures: matplotlib (Agg) drawn into inline SVG, from what the run stored.

Each builder returns a list of :class:`Figure` (empty when the run has nothing to show for it,
e.g. no second precision), so the page leaves out what does not apply. Every figure has a stable
``id`` the tests and links use. Nothing here analyses: the curves, bounds, intervals and the
recommended count are the stored values; the figures only select rows and draw them.
"""

from __future__ import annotations

import io
import re
from typing import NamedTuple

import matplotlib
import pandas as pd

# the object API, not pyplot: no backend is switched or GUI touched in the caller's process (a notebook
# keeps its own), and SVG is written by matplotlib's own renderer
from matplotlib.figure import Figure as Canvas
from matplotlib.patches import Rectangle

from pipeprof.analysis import BOUND_KEYS, GROUP_KEYS, ok
from pipeprof.analysis.bounds import matching

from .summary import group_answers, group_label, rate

# one colour per meaning, the same in every figure
COLOURS = {
    "end_to_end": "#1f77b4",
    "cpu_pipeline": "#ff7f0e",
    "storage_fetch": "#2ca02c",
    "step": "#d62728",
    "predicted": "#7f7f7f",
    "gpu_ceiling": "#d62728",
    "monitor_overhead": "#9467bd",
}
SPLIT = [("data wait", "#ff7f0e"), ("host→device copy", "#9467bd"), ("compute", "#1f77b4")]
# (panel title, per-GPU columns or not, monitor field): a panel appears where the timeline has values
TIMELINE = [
    ("GPU util %", "gpu", "util_pct"),
    ("SM clock MHz", "gpu", "sm_clock_mhz"),
    ("GPU temp °C", "gpu", "temp_c"),
    ("GPU power W", "gpu", "power_w"),
    ("CPU util %", None, "cpu_util_pct"),
    ("disk read MB/s", None, "disk_read_mb_s"),
]
STYLE = {
    "svg.fonttype": "none",
    "font.family": "sans-serif",
    "font.size": 10,
    "axes.spines.top": False,
    "axes.spines.right": False,
    "axes.grid": True,
    "grid.alpha": 0.3,
    "legend.frameon": False,
}


class Figure(NamedTuple):
    """One figure of the page: its stable id, a title, the inline SVG and a caption in words."""

    id: str
    title: str
    svg: str
    caption: str


def to_svg(fig, fig_id: str) -> str:
    """The figure as an inline <svg>: no XML prolog or DTD (a URL the page must not name), and every
    internal id prefixed with ``fig_id`` so that several figures on one page do not share ids."""
    buf = io.StringIO()
    fig.savefig(buf, format="svg", bbox_inches="tight", metadata={"Date": None, "Creator": None})
    text = buf.getvalue()
    text = text[text.index("<svg") :]
    text = re.sub(r"<metadata>.*?</metadata>", "", text, flags=re.S)
    text = re.sub(r'\bid="([^"]+)"', rf'id="{fig_id}-\1"', text)
    return re.sub(r'(url\(#|href="#)([^")]+)', rf"\g<1>{fig_id}-\2", text)


def _subplots(nrows: int = 1, ncols: int = 1, *, figsize: tuple, **kw):
    """(figure, axes) like pyplot.subplots, on a figure no pyplot state knows of."""
    fig = Canvas(figsize=figsize)
    return fig, fig.subplots(nrows, ncols, **kw)


def _bound_rows(trials: pd.DataFrame, kind: str, like) -> pd.DataFrame:
    """The ``kind`` trials at ``like``'s settings (those the bound shares with it), by worker count."""
    rows = matching(ok(trials, kind), like, [k for k in BOUND_KEYS[kind] if k != "num_workers"])
    return rows.sort_values("num_workers") if len(rows) else rows


def _band(ax, df: pd.DataFrame, colour: str, label: str, **line) -> None:
    """A rate against workers with its 95% interval shaded (where the rows recorded one)."""
    ax.plot(df["num_workers"], df["samples_per_s"], color=colour, label=label, **line)
    if "samples_per_s_ci95_low" in df and df["samples_per_s_ci95_low"].notna().any():
        ax.fill_between(
            df["num_workers"],
            df["samples_per_s_ci95_low"].astype(float),
            df["samples_per_s_ci95_high"].astype(float),
            color=colour,
            alpha=0.15,
            linewidth=0,
        )


def _skipped(run, g: dict) -> list[int]:
    """Worker counts the adaptive search left out for this group (``g``: its settings; run.json ``search``)."""
    found = []
    for s in (run.meta.get("search") or {}).get("skipped", []):
        m = re.match(r"end_to_end at (\d+) workers \((.*)\)", s.get("trial", ""))
        if m and all(str(g.get(k)) in m.group(2).split() for k in ("model", "precision", "preset")):
            found.append(int(m.group(1)))
    return found


def _top(*frames_cols) -> float:
    """The largest value among (frame, column) pairs that hold one."""
    vals = [pd.to_numeric(df[c], errors="coerce").max() for df, c in frames_cols if len(df) and c in df]
    vals = [v for v in vals if v == v]
    return max(vals) if vals else 1.0


def _storage_line(ax, io_: pd.DataFrame, top: float) -> None:
    """The storage bound, or a note when it lies far above the rest (drawn, it would flatten the curves)."""
    if io_.empty:
        return
    if io_["samples_per_s"].min() <= 3 * top:
        _band(ax, io_, COLOURS["storage_fetch"], "storage alone", marker="^", markersize=4, linewidth=1.2)
        return
    ax.text(
        0.01,
        0.97,
        f"storage alone: {rate(io_['samples_per_s'].min())}–{rate(io_['samples_per_s'].max())} "
        "samples/s, far above this scale",
        transform=ax.transAxes,
        va="top",
        fontsize=9,
        color=COLOURS["storage_fetch"],
    )


def _curve_axes(ax, run, g: dict, e2e: pd.DataFrame) -> None:
    """The bounds and the end-to-end curve of the group whose settings are ``g``."""
    trials = run.trials
    like = pd.Series(g)  # the group's settings, with the first end-to-end trial's others (decoder, pin_memory, ...)
    if "trial_id" in trials and "trial_id" in e2e:
        first = trials[trials["trial_id"] == e2e["trial_id"].iloc[0]]
        like = first.iloc[0] if len(first) else like
    cpu = _bound_rows(trials, "cpu_pipeline", like)
    io_ = _bound_rows(trials, "storage_fetch", like)
    top = _top(
        (e2e, "samples_per_s_ci95_high"),
        (e2e, "samples_per_s"),
        (e2e, "step_bound_samples_per_s"),
        (e2e, "predicted_samples_per_s"),
        (cpu, "samples_per_s"),
    )
    if len(cpu):
        _band(ax, cpu, COLOURS["cpu_pipeline"], "CPU pipeline alone", marker="s", markersize=4, linewidth=1.2)
    _storage_line(ax, io_, top)
    step = e2e["step_bound_samples_per_s"].dropna()
    if len(step):
        ax.axhline(
            float(step.iloc[0]),
            color=COLOURS["step"],
            linestyle="--",
            linewidth=1.2,
            label=f"step ceiling {rate(float(step.iloc[0]))}/s",
        )
    if "predicted_samples_per_s" in e2e and e2e["predicted_samples_per_s"].notna().any():
        ax.plot(
            e2e["num_workers"],
            e2e["predicted_samples_per_s"].astype(float),
            linestyle=":",
            marker="o",
            markerfacecolor="white",
            color=COLOURS["predicted"],
            label="predicted from the bounds (inferred)",
        )
    inferred = e2e["inferred"].fillna(False).astype(bool) if "inferred" in e2e else pd.Series(False, index=e2e.index)
    _band(ax, e2e, COLOURS["end_to_end"], "end to end", linewidth=2)
    ax.scatter(
        e2e.loc[~inferred, "num_workers"],
        e2e.loc[~inferred, "samples_per_s"],
        color=COLOURS["end_to_end"],
        zorder=3,
        label="measured",
    )
    if inferred.any():
        ax.scatter(
            e2e.loc[inferred, "num_workers"],
            e2e.loc[inferred, "samples_per_s"],
            facecolor="white",
            edgecolor=COLOURS["end_to_end"],
            zorder=3,
            label="inferred",
        )
    ax.set_xticks(sorted(set(e2e["num_workers"].astype(int)) | set(cpu.get("num_workers", pd.Series()).astype(int))))


def curve_figures(run) -> list[Figure]:
    """samples/s against num_workers per group, the bounds drawn in, the recommended count marked."""
    out = []
    curves = pd.DataFrame(run.meta.get("analysis", {}).get("curves", []))
    for i, a in enumerate(group_answers(run) if len(curves) else []):
        e2e = matching(curves, a.key, GROUP_KEYS).sort_values("num_workers")
        if e2e.empty:
            continue
        with matplotlib.rc_context(STYLE):
            fig, ax = _subplots(figsize=(7.5, 3.6))
            _curve_axes(ax, run, a.key, e2e.astype({"samples_per_s": float}))
            w = a.workers
            ax.scatter(
                [w],
                [a.samples_per_s],
                s=220,
                marker="*",
                color="#ffbf00",
                edgecolor="black",
                zorder=4,
                label=f"recommended: {w} worker{'' if w == 1 else 's'}",
            )
            skipped = _skipped(run, a.key)
            if skipped:
                ax.scatter(skipped, [0] * len(skipped), marker="x", color="grey", label="not measured (search)")
            ax.set(xlabel="num_workers", ylabel="samples/s", ylim=(0, None))
            ax.legend(loc="center left", bbox_to_anchor=(1.01, 0.5), fontsize=9)
            fid = f"fig-curve-{i}"
            out.append(
                Figure(
                    fid,
                    f"samples/s against num_workers — {group_label(a.key)}",
                    to_svg(fig, fid),
                    "Shaded: 95% interval of each trial's windows. Filled dots: measured end to end; "
                    "hollow dots: predicted from the bounds measured alone.",
                )
            )
    return out


def _trial_label(r) -> str:
    parts = [r.get("model"), r.get("precision"), r.get("preset"), r.get("source"), f"w={int(r['num_workers'])}"]
    return " ".join(str(p) for p in parts if p is not None and p == p)


def step_split_figure(run) -> list[Figure]:
    """Per end-to-end trial, where a step's time goes: data wait, host→device copy, compute (ms)."""
    e2e = ok(run.trials, "end_to_end")
    need = {"data_wait_frac", "batch_ms_mean", "h2d_ms_mean", "compute_ms_p50"}
    if e2e.empty or not need <= set(e2e):
        return []
    e2e = e2e.sort_values(["model", "precision", "preset", "num_workers"]).iloc[::-1]
    parts = [e2e["data_wait_frac"] * e2e["batch_ms_mean"], e2e["h2d_ms_mean"], e2e["compute_ms_p50"]]
    with matplotlib.rc_context(STYLE):
        fig, ax = _subplots(figsize=(7.5, 0.9 + 0.32 * len(e2e)))
        labels = [_trial_label(r) for _, r in e2e.iterrows()]
        left = pd.Series(0.0, index=e2e.index)
        for (name, colour), ms in zip(SPLIT, parts):
            ms = ms.fillna(0.0).astype(float)
            ax.barh(labels, ms, left=left, color=colour, label=name, height=0.6)
            left += ms
        ax.scatter(e2e["batch_ms_mean"], labels, marker="|", s=200, color="black", zorder=3, label="wall time per step")
        ax.set(xlabel="ms per step")
        ax.grid(axis="y", visible=False)
        ax.legend(loc="lower left", bbox_to_anchor=(0, 1.0), ncol=4, fontsize=9)
        return [
            Figure(
                "fig-step-split",
                "Where a step's time goes",
                to_svg(fig, "fig-step-split"),
                "Data wait: share of wall time blocked on next(loader) × time per step; copy and compute: "
                "mean copy and median step time. On a GPU they overlap the wait (the loop is asynchronous), "
                "so the bars can pass the wall time.",
            )
        ]


def _timeline_series(tl: pd.DataFrame) -> list[tuple[str, list[str]]]:
    """(panel title, columns) for each monitor measure the timeline holds values of."""
    out = []
    for title, prefix, field in TIMELINE:
        cols = [c for c in tl if re.fullmatch(rf"gpu\d+_{field}", c)] if prefix else [field]
        cols = [c for c in cols if c in tl and pd.to_numeric(tl[c], errors="coerce").notna().any()]
        if cols:
            out.append((title, cols))
    return out


def _shade_trials(ax, tl: pd.DataFrame, t0: float, kinds: dict) -> None:
    """Each trial's measured windows shaded in its kind's colour (warm-up left clear)."""
    measured = tl[tl["phase"] == "measure"] if "phase" in tl else tl
    for tid, rows in measured.dropna(subset=["trial_id"]).groupby("trial_id"):
        kind = kinds.get(tid, "")
        ax.axvspan(
            rows["t_s"].min() - t0, rows["t_s"].max() - t0, color=COLOURS.get(kind, "grey"), alpha=0.12, linewidth=0
        )


def timeline_figure(run) -> list[Figure]:
    """The monitor's measures over the whole run, the trials' measured windows shaded by kind."""
    tl = run.timeline
    if tl.empty or "t_s" not in tl:
        return []
    series = _timeline_series(tl)
    if not series:
        return []
    t0 = float(tl["t_s"].min())
    kinds = dict(zip(run.trials["trial_id"], run.trials["kind"])) if "trial_id" in run.trials else {}
    with matplotlib.rc_context(STYLE):
        fig, axes = _subplots(len(series), 1, sharex=True, figsize=(7.5, 0.4 + 1.35 * len(series)), squeeze=False)
        for ax, (title, cols) in zip(axes[:, 0], series):
            for c in cols:
                ax.plot(tl["t_s"] - t0, pd.to_numeric(tl[c], errors="coerce"), linewidth=0.8, label=c)
            _shade_trials(ax, tl, t0, kinds)
            ax.set_ylabel(title, rotation=0, ha="right", va="center")
            if title.endswith("%"):
                ax.set_ylim(0, 105)
            if len(cols) > 1:  # beside the panel: inside it would cover the lines
                ax.legend(loc="center left", bbox_to_anchor=(1.01, 0.5), fontsize=8)
        axes[-1, 0].set_xlabel("seconds since the monitor started")
        handles = [
            Rectangle((0, 0), 1, 1, color=COLOURS[k], alpha=0.3) for k in sorted(set(kinds.values())) if k in COLOURS
        ]
        height = fig.get_figheight()
        fig.subplots_adjust(top=1 - 0.45 / height)  # room for the kinds' legend, no more
        fig.legend(
            handles,
            [k for k in sorted(set(kinds.values())) if k in COLOURS],
            loc="upper center",
            ncol=5,
            fontsize=8,
            bbox_to_anchor=(0.5, 1.0),
        )
        return [
            Figure(
                "fig-timeline",
                "Monitor timeline",
                to_svg(fig, "fig-timeline"),
                "10 Hz monitor samples over the run; shaded: each trial's measured windows, coloured by "
                "its kind (warm-up clear).",
            )
        ]


def stage_figure(run) -> list[Figure]:
    """Per-stage CPU cost per sample (ms) as bars, one panel per preset (cpu_pipeline trials)."""
    cpu = ok(run.trials, "cpu_pipeline")
    cols = [c for c in cpu if c.startswith("stage_us_per_sample.")]
    if cpu.empty or not cols or "preset" not in cpu:
        return []
    per = cpu.groupby("preset")[cols].median().dropna(axis=1, how="all")
    with matplotlib.rc_context(STYLE):
        fig, axes = _subplots(
            1, len(per), figsize=(3.8 * len(per) + 0.5, 0.8 + 0.3 * per.shape[1]), sharey=True, squeeze=False
        )
        names = [c.split(".", 1)[1] for c in per.columns][::-1]
        for ax, (preset, row) in zip(axes[0], per.iterrows()):
            values = (row.values / 1e3)[::-1]
            ax.barh(names, values, color=COLOURS["cpu_pipeline"])
            for y, v in enumerate(values):
                if v == v:
                    ax.text(v, y, f" {v:.2f}", va="center", fontsize=8)
            ax.set(title=str(preset), xlabel="ms CPU per sample")
            ax.grid(axis="y", visible=False)
        return [
            Figure(
                "fig-stages",
                "CPU cost per sample, by stage",
                to_svg(fig, "fig-stages"),
                "Worker CPU time per sample for read, decode, each transform and collate, timed inside "
                "the workers (median over the cpu_pipeline trials of each preset).",
            )
        ]


def _bar_axes(labels: list[str], series: dict[str, list[float]], fmt: str = "{:,.0f}", colours: dict = None):
    """(fig, ax) of grouped vertical bars: one group per label, one bar per series, each bar labelled
    with its value; as wide as its bars need; a log scale when the values span more than 20x."""
    fig, ax = _subplots(figsize=(min(7.5, 2.6 + 0.75 * len(labels) * len(series)), 3.2))
    n = len(series)
    width = 0.8 / max(n, 1)
    for i, (name, values) in enumerate(series.items()):
        xs = [j + (i - (n - 1) / 2) * width for j in range(len(labels))]
        bars = ax.bar(xs, values, width=width * 0.95, label=name, color=(colours or {}).get(name, f"C{i}"))
        ax.bar_label(bars, labels=["" if v != v else fmt.format(v) for v in values], fontsize=8, padding=2)
    ax.set_xticks(
        range(len(labels)), labels, rotation=20 if len(labels) > 4 else 0, ha="right" if len(labels) > 4 else "center"
    )
    ax.grid(axis="x", visible=False)
    values = [v for vs in series.values() for v in vs if v == v and v > 0]
    if values and max(values) > 20 * min(values):
        ax.set_yscale("log")
    if n > 1:
        ax.legend(loc="lower left", bbox_to_anchor=(0, 1.02), ncol=n, fontsize=9)
    return fig, ax


def _ceilings(run) -> pd.DataFrame:
    """The step ceilings as stored, one row per model × precision × mode (× GPUs), the best if repeated."""
    ceil = ok(run.trials, "gpu_ceiling")
    if ceil.empty:
        return ceil
    ceil = ceil.assign(mode=ceil["mode"].fillna("train") if "mode" in ceil else "train")
    keys = [k for k in ("model", "precision", "mode", "gpus") if k in ceil]
    return ceil.groupby(keys, as_index=False)["samples_per_s"].max()


def precision_figure(run) -> list[Figure]:
    """Step speed-up of each precision over FP32 for the same model and mode (when FP32 and another ran)."""
    ceil = _ceilings(run)
    if ceil.empty or "fp32" not in set(ceil["precision"]) or ceil["precision"].nunique() < 2:
        return []
    keys = [k for k in ("model", "mode", "gpus") if k in ceil and (k == "model" or ceil[k].nunique() > 1)]
    fp32 = ceil[ceil["precision"] == "fp32"][keys + ["samples_per_s"]].rename(columns={"samples_per_s": "fp32"})
    other = ceil[ceil["precision"] != "fp32"].merge(fp32, on=keys)
    if other.empty:
        return []
    other = other.assign(
        speedup=other["samples_per_s"] / other["fp32"], label=other[keys].astype(str).agg(" ".join, axis=1)
    )
    table = other.pivot_table(index="label", columns="precision", values="speedup")
    labels, series = list(table.index), {p: table[p].astype(float).tolist() for p in table.columns}
    with matplotlib.rc_context(STYLE):
        fig, ax = _bar_axes(labels, series, "{:.2f}×")
        ax.axhline(1.0, color="black", linewidth=0.8)
        ax.set(ylabel="step rate ÷ FP32", title=None if len(series) > 1 else f"{next(iter(series))} ÷ fp32")
        return [
            Figure(
                "fig-precision",
                "Precision: step speed-up over FP32",
                to_svg(fig, "fig-precision"),
                "The step alone (gpu_ceiling) at each precision over the same model's FP32 step.",
            )
        ]


def mode_figure(run) -> list[Figure]:
    """Train against inference step rates per model × precision (when the run has both modes)."""
    ceil = _ceilings(run)
    if ceil.empty or ceil["mode"].nunique() < 2:
        return []
    table = ceil.pivot_table(index=["model", "precision"], columns="mode", values="samples_per_s", aggfunc="max")
    labels = [f"{m} {p}" for m, p in table.index]
    with matplotlib.rc_context(STYLE):
        fig, ax = _bar_axes(labels, {mode: table[mode].astype(float).tolist() for mode in table.columns})
        ax.set(ylabel="samples/s (step alone)")
        return [
            Figure(
                "fig-mode",
                "Train against inference",
                to_svg(fig, "fig-mode"),
                "The step alone (gpu_ceiling) in train and in inference mode.",
            )
        ]


def storage_figure(run) -> list[Figure]:
    """Best rate of the raw reads, the CPU pipeline and end to end per source × cache state (2+ of them)."""
    kinds = ["storage_fetch", "cpu_pipeline", "end_to_end"]
    rows = pd.concat([ok(run.trials, k) for k in kinds])
    if rows.empty or "source" not in rows:
        return []
    rows = rows.assign(
        where=rows["source"].astype(str)
        + " "
        + rows.get("cache_state", pd.Series("", index=rows.index)).fillna("").replace("n/a", "").astype(str)
    )
    if rows["where"].nunique() < 2:
        return []
    best = rows.groupby(["where", "kind"])["samples_per_s"].max().unstack("kind")
    labels = [str(w).strip() for w in best.index]
    with matplotlib.rc_context(STYLE):
        fig, ax = _bar_axes(
            labels,
            {k.replace("_", " "): best[k].astype(float).tolist() for k in kinds if k in best},
            colours={k.replace("_", " "): COLOURS[k] for k in kinds},
        )
        ax.set(ylabel="best samples/s over workers")
        return [
            Figure(
                "fig-storage",
                "Storage: sources and cache states",
                to_svg(fig, "fig-storage"),
                "The best rate over the worker counts measured, per source and page-cache state.",
            )
        ]


def scaling_figure(run) -> list[Figure]:
    """End-to-end (or step) rate against GPU count beside linear scaling from one GPU (a ``gpus`` column)."""
    trials = run.trials
    if "gpus" not in trials or trials["gpus"].nunique() < 2:
        return []
    e2e = ok(trials, "end_to_end")
    rows = e2e if len(e2e) else ok(trials, "gpu_ceiling")
    best = rows.groupby(["model", "precision", "gpus"])["samples_per_s"].max().reset_index()
    with matplotlib.rc_context(STYLE):
        fig, ax = _subplots(figsize=(7.5, 3.4))
        for (model, precision), g in best.groupby(["model", "precision"]):
            g = g.sort_values("gpus")
            line = ax.plot(g["gpus"], g["samples_per_s"], marker="o", label=f"{model} {precision}")[0]
            one = g[g["gpus"] == 1]["samples_per_s"]
            if len(one):
                ax.plot(g["gpus"], g["gpus"] * float(one.iloc[0]), linestyle="--", color=line.get_color(), alpha=0.6)
        ax.set(xlabel="GPUs", ylabel="samples/s", ylim=(0, None))
        ax.legend(fontsize=9)
        return [
            Figure(
                "fig-scaling",
                "GPU-count scaling against linear",
                to_svg(fig, "fig-scaling"),
                "Solid: best measured rate at each GPU count; dashed: N × the one-GPU rate (linear).",
            )
        ]


def _group_key(row: pd.Series) -> tuple:
    """A curve row's group as text, the same across runs: missing is '' (a run without the column included)."""
    return tuple(
        "" if v is None or v != v else str(int(v)) if isinstance(v, float) and v.is_integer() else str(v)
        for v in (row.get(k) for k in GROUP_KEYS)
    )


def compare_figures(runs: list, labels: list[str]) -> list[Figure]:
    """End-to-end curves of several runs overlaid, one figure per group that two runs or more share."""
    curves = [pd.DataFrame(r.meta.get("analysis", {}).get("curves", [])) for r in runs]
    keyed = {}
    for label, df in zip(labels, curves):
        if df.empty:
            continue
        for key, rows in df.groupby(df.apply(_group_key, axis=1), sort=False):
            keyed.setdefault(key, []).append((label, rows.sort_values("num_workers")))
    out = []
    for i, entries in enumerate(v for v in keyed.values() if len(v) > 1):
        first = entries[0][1].iloc[0]
        with matplotlib.rc_context(STYLE):
            fig, ax = _subplots(figsize=(7.5, 3.4))
            for j, (label, rows) in enumerate(entries):
                _band(ax, rows.astype({"samples_per_s": float}), f"C{j}", label, marker="o", linewidth=2)
            ax.set(xlabel="num_workers", ylabel="samples/s", ylim=(0, None))
            ax.set_xticks(sorted({int(w) for _, rows in entries for w in rows["num_workers"]}))
            ax.legend(loc="center left", bbox_to_anchor=(1.01, 0.5), fontsize=9)
            fid = f"fig-compare-{i}"
            out.append(
                Figure(
                    fid,
                    f"end to end — {group_label(first.to_dict())}",
                    to_svg(fig, fid),
                    "Each run's end-to-end rate with its 95% interval shaded.",
                )
            )
    return out


def sizing_figure(loads: list) -> list[Figure]:
    """Per workload (``analysis.workstation.workloads`` of a run) the predicted samples/s on one GPU against the
    cores beside it: the interval as a band, past the cores measured dotted, the step's ceiling as a dashed line,
    the candidate core counts as points."""
    from pipeprof.analysis import workstation as ws

    if not loads:
        return []
    top = max(max(ws.DEFAULT_CORES), int(max(w.cores for w in loads)))
    cores = list(range(1, top + 1))
    with matplotlib.rc_context(STYLE):
        fig, ax = _subplots(figsize=(7.5, 3.6))
        for w in loads:
            rows = ws.table([w], ws.grid(cores, [1]))
            seen = rows[~rows["extrapolated"]]
            line = ax.plot(seen["cores"], seen["samples_per_s"], label=w.label)[0]
            colour = line.get_color()
            past = rows[rows["cores"] >= (seen["cores"].max() if len(seen) else 1)]
            ax.plot(past["cores"], past["samples_per_s"], linestyle=":", color=colour)
            ax.fill_between(
                rows["cores"], rows["samples_per_s_low"], rows["samples_per_s_high"], color=colour, alpha=0.15
            )
            ax.axhline(w.step[0], linestyle="--", color=colour, alpha=0.6)
            pts = rows[rows["cores"].isin(ws.DEFAULT_CORES)]
            ax.plot(pts["cores"], pts["samples_per_s"], "o", color=colour)
        ax.set(xlabel="cores per GPU", ylabel="samples/s (one GPU)", ylim=(0, None))
        ax.legend(fontsize=9)
        return [
            Figure(
                "fig-sizing",
                "Samples/s against the cores beside one GPU",
                to_svg(fig, "fig-sizing"),
                "Solid: predicted from this run's CPU curve at the cores it measured; dotted: extrapolated past "
                "them (the band's low end falls by the curve's per-worker fall-off per doubling); band: the "
                "interval; dashed: the step's ceiling; points: the candidates of the sizing table.",
            )
        ]
