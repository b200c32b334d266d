"""Bounds and verdicts: each end-to-end trial beside the bounds measured alone, the
predicted rate and the verdict.

The prediction model (why not just ``min`` of the bounds):

* with workers, loading overlaps the step, so the slower side binds:
  ``min(step, cpu(w_eff), io(w))``; ``w_eff`` caps the workers at the cores left
  after the training process's own CPU use (measured in the gpu_ceiling trial),
  because the isolated cpu_pipeline trial had those cores to itself;
* with 0 workers the main process alternates loading and stepping, so per-sample
  times add: ``1 / (1/cpu(0) + 1/gpu)``;
* with the GPU pipeline (``augment.device: cuda``) the step shares its device with the decode and augment:
  the step's side is bounded by the ``gpu_shared`` trial, which ran the two together on one batch of bytes
  held in memory (serially or overlapped, as the row did) beside each alone. Serially that is the per-batch
  sum (the trial records ``serial_model_samples_per_s``, 1 / (1/step + 1/pipeline), to check it); overlapped
  it lies between the sum and the slower of the two, where the SMs the two share put it: only together is it
  measured, so the bound is the together rate, not a model of their contention.
"""

from __future__ import annotations

import math
from typing import NamedTuple

import numpy as np
import pandas as pd

from pipeprof.schema import GROUP_KEYS, OVERLAPPED, overlap_mode

NEAR_BEST = 0.95  # "reaches the best rate" means within 5% of it: window CVs are a few %
BALANCED = 0.05  # two bounds within 5% of each other: neither change alone helps much

# which settings each isolated bound shares with an end-to-end trial
BOUND_KEYS = {
    "gpu_ceiling": ["model", "precision", "mode", "batch_size", "image_size", "gpus", "p2p"],
    "cpu_pipeline": [
        "preset",
        "augment_device",
        "augment_overlap",
        "gpu_decoder",
        "decoder",
        "source",
        "cache_state",
        "batch_size",
        "num_workers",
        "pin_memory",
        "image_size",
        "gpus",
    ],
    "storage_fetch": ["source", "cache_state", "batch_size", "num_workers"],
    "gpu_shared": [
        "model",
        "precision",
        "mode",
        "batch_size",
        "image_size",
        "preset",
        "augment_device",
        "augment_overlap",
        "step_first",
        "staged",
        "gpu_decoder",
        "gpus",
    ],
}
BOUND_COLUMN = {
    "gpu_ceiling": "step_bound_samples_per_s",
    "cpu_pipeline": "cpu_bound_samples_per_s",
    "storage_fetch": "io_bound_samples_per_s",
    "gpu_shared": "shared_bound_samples_per_s",
}
# the hand-off limit (trial kind ``handoff``): one per pipeline, whatever its worker count (and whichever decoder
# and overlap the GPU pipeline has: the hand-off passes the same bytes)
HANDOFF_KEYS = [k for k in BOUND_KEYS["cpu_pipeline"] if k not in ("num_workers", "augment_overlap", "gpu_decoder")]


def ok(df: pd.DataFrame, kind: str) -> pd.DataFrame:
    """Successful trials of one kind (the stage-timing-off twins excluded)."""
    if df.empty or "kind" not in df:
        return df.iloc[0:0]
    sel = (df["kind"] == kind) & (df["status"] == "ok")
    if "stage_timing" in df:
        sel &= df["stage_timing"].astype("boolean").fillna(True)
    return df[sel & df["samples_per_s"].notna()] if "samples_per_s" in df else df[sel]


def present_group_keys(df: pd.DataFrame) -> list[str]:
    return [k for k in GROUP_KEYS if k in df]


def groups(df: pd.DataFrame):
    """(key dict, sub-frame) per model/precision/preset/batch/source group, NaN-safe."""
    keys = present_group_keys(df)
    if df.empty:
        return []
    return [({k: _clean(v) for k, v in zip(keys, key)}, sub) for key, sub in df.groupby(keys, dropna=False)]


def _clean(value):
    if isinstance(value, float) and math.isnan(value):
        return None
    return value.item() if hasattr(value, "item") else value


# what each bound adds beside its rate and noise: {trial column: curves' column}
EXTRA = {
    "gpu_ceiling": {"main_cpu_pct_mean": "main_cores_step", "step_threads": "ceiling_threads"},
    "cpu_pipeline": {"main_cpu_pct_mean": "loader_main_cpu_pct"},
    "storage_fetch": {"mean_sample_kb": "mean_sample_kb"},
    "gpu_shared": {
        "step_alone_samples_per_s": "shared_step_alone",
        "pipeline_alone_samples_per_s": "shared_pipeline_alone",
        "serial_model_samples_per_s": "shared_serial_model",
        "gpu_overlap_frac": "shared_overlap_frac",
    },
}
HANDOFF_COLUMNS = ["handoff_samples_per_s", "handoff_ci95_low", "handoff_ci95_high", "handoff_main_us_per_sample"]


class Join(NamedTuple):
    """Which trials make each row of :func:`curves`, as positions in the trials table, in the order curves
    returns its rows: ``e2e`` the end-to-end trial of each row; ``bounds`` per bound kind (and ``handoff``) the
    trial joined beside it (-1: none at its settings), a kind that measured nothing absent. Which trials join
    depends on settings and status, never on the figures, so the re-draws of the confidence join once and fill
    each draw's figures in (the join's merges and sort were a third of a re-draw's time: docs/measured.md)."""

    e2e: np.ndarray
    bounds: dict


def join(trials: pd.DataFrame) -> Join:
    """The rows :func:`curves` joins: each end-to-end trial beside the first successful trial of each bound kind
    at its settings (``BOUND_KEYS``; the hand-off's ``HANDOFF_KEYS``), then sorted by group and workers."""
    t = trials.reset_index(drop=True).assign(_pos=np.arange(len(trials)))
    e2e = ok(t, "end_to_end")
    if e2e.empty:  # e.g. a run interrupted before its first end-to-end trial: nothing to join onto
        return Join(np.zeros(0, int), {})
    bounds = {}
    for kind, keys in [*BOUND_KEYS.items(), ("handoff", HANDOFF_KEYS)]:
        bound = ok(t, kind)
        if bound.empty:
            continue
        on = [k for k in keys if k in e2e and k in bound]
        right = bound[on + ["_pos"]].drop_duplicates(on).rename(columns={"_pos": f"_pos_{kind}"})
        e2e = e2e.merge(right, on=on, how="left")
        bounds[kind] = f"_pos_{kind}"
    e2e = e2e.sort_values(present_group_keys(e2e) + ["num_workers"])
    return Join(e2e["_pos"].to_numpy(int), {k: e2e[c].fillna(-1).to_numpy(int) for k, c in bounds.items()})


def figures(values: pd.Series) -> pd.Series:
    """A column of figures as numbers: NaN where a row has none. A figure that no row of a table measured is None
    in every row, and pandas keeps such a column as objects, which no arithmetic takes (a watched validation loop
    whose short window the CPU sampler missed, on a loaded machine, ended its watch's analysis in a TypeError)."""
    return pd.to_numeric(values) if values.dtype == object else values


def _take(values: pd.Series, at: np.ndarray):
    """``values`` at positions ``at``, NaN where -1 (as a left join leaves a row with no match)."""
    v = values.to_numpy()
    if (at >= 0).all():
        return v[at]
    out = v.astype(float)[np.maximum(at, 0)]
    out[at < 0] = np.nan
    return out


def curves(trials: pd.DataFrame, rows: Join | None = None) -> pd.DataFrame:
    """End-to-end trials with ``step_bound_/cpu_bound_/io_bound_samples_per_s`` joined on,
    plus ``main_cores_step``: CPU the training process used in the gpu_ceiling trial, and
    ``loader_main_cpu_pct``: CPU of the main process in the cpu_pipeline trial (the hand-off).

    A bound missing (trial kind switched off or failed) is NaN. ``rows``: ``join(trials)`` when the caller has
    it (a re-draw of the same trials: only their figures differ).
    """
    rows = join(trials) if rows is None else rows
    t = trials.reset_index(drop=True)
    out = t.iloc[rows.e2e].reset_index(drop=True)
    if out.empty:  # e.g. a run interrupted before its first end-to-end trial: nothing to join onto
        return out
    noise, joined = _half_frac(t), {}
    for kind, col in BOUND_COLUMN.items():
        at = rows.bounds.get(kind)
        if at is None:
            joined[col] = float("nan")
            continue
        columns = {
            col: t["samples_per_s"],
            f"{col}_noise": noise,
            **{new: t[old] for old, new in EXTRA.get(kind, {}).items() if old in t},
        }
        joined |= {name: _take(figures(values), at) for name, values in columns.items()}
    if "main_cores_step" in joined:
        joined["main_cores_step"] = joined["main_cores_step"] / 100
    joined |= _handoff(t, rows.bounds.get("handoff"))
    # the bounds' figures replace the end-to-end row's own columns of their names (``mean_sample_kb``: only
    # storage_fetch reads bytes, so the row's own is empty; kept, a merge split it into _x and _y)
    out = out.drop(columns=[c for c in joined if c in out])
    # the joined columns at once: assigned one at a time they were a large share of a re-draw's time
    return pd.concat([out, pd.DataFrame(joined, index=out.index)], axis=1)


def _handoff(t: pd.DataFrame, at: np.ndarray | None) -> dict:
    """``handoff_samples_per_s`` and its 95% interval beside each end-to-end row of the same pipeline, and
    ``handoff_main_us_per_sample``: the training process's CPU to receive and pin a sample's batch share (its
    CPU in the hand-off trial, which runs no step, over that trial's rate)."""
    if at is None:
        return {c: float("nan") for c in HANDOFF_COLUMNS}
    rate = t["samples_per_s"]
    low = t.get("samples_per_s_ci95_low", rate).fillna(rate)
    high = t.get("samples_per_s_ci95_high", rate).fillna(rate)
    main = (
        figures(t["main_cpu_pct_mean"]) / 100 / rate * 1e6 if "main_cpu_pct_mean" in t else pd.Series(np.nan, t.index)
    )
    return {c: _take(v.astype(float), at) for c, v in zip(HANDOFF_COLUMNS, (rate, low, high, main))}


def _half_frac(df: pd.DataFrame) -> pd.Series:
    """Half-width of each trial's 95% interval relative to its rate (NaN where not recorded)."""
    if "samples_per_s_ci95_high" not in df:
        return pd.Series(float("nan"), index=df.index)
    return (df["samples_per_s_ci95_high"] - df["samples_per_s_ci95_low"]) / 2 / df["samples_per_s"]


# ---- per-trial verdicts ------------------------------------------------------------


def stage_cost_s(row: pd.Series) -> float | None:
    """Worker CPU seconds per sample from the stage clocks (their sum); None without them."""
    stage_us = sum(v for k, v in row.items() if k.startswith("stage_us_per_sample.") and v == v)
    return stage_us * 1e-6 if stage_us else None


def waits_on_storage(cpu: float, io: float) -> bool:
    """The loader bound sits at the storage bound (within 2 x BALANCED): its rate is the bytes' arrival
    rate, so what the loader measured is the storage, not the CPU."""
    return _known(cpu) and _known(io) and cpu >= (1 - 2 * BALANCED) * io


def at_handoff(rate_high: float, row: pd.Series) -> bool:
    """A rate (the upper end of its interval) reaches the measured hand-off limit (the lower end of its
    interval, less 2 x BALANCED: a real loader runs a little below the bare hand-off)."""
    low = row.get("handoff_ci95_low")
    return _known(low) and _known(rate_high) and rate_high >= (1 - 2 * BALANCED) * low


def worker_capacity(row: pd.Series) -> float | None:
    """Samples/s the workers' own CPU time allows: workers / (stage seconds per sample)."""
    cost = stage_cost_s(row)
    return max(row["num_workers"], 1) / cost if cost else None


def matching(df: pd.DataFrame, like: pd.Series, keys) -> pd.DataFrame:
    """The rows of ``df`` with ``like``'s values in ``keys`` (missing matches missing; a key absent
    from either side is not compared)."""
    for k in keys:
        if k in df and k in like:
            df = df[df[k].eq(like[k]) | (df[k].isna() & pd.isna(like[k]))]
    return df


def _same_pipeline(c: pd.DataFrame, like: pd.Series) -> pd.DataFrame:
    return matching(c, like, [k for k in BOUND_KEYS["cpu_pipeline"] if k != "num_workers"])


class CpuCurve(NamedTuple):
    """The loader alone at one setting: worker counts and their samples/s, sorted by workers."""

    workers: np.ndarray
    rates: np.ndarray


def cpu_curve(trials: pd.DataFrame, like: pd.Series) -> CpuCurve:
    """(workers, samples/s) of every cpu_pipeline trial at ``like``'s settings, sorted by workers.

    Taken from the cpu_pipeline trials themselves, not the end-to-end rows, so
    worker counts measured only in isolation still shape the curve.
    """
    return curve_at(trials, cpu_curve_rows(trials, like))


def cpu_curve_rows(trials: pd.DataFrame, like: pd.Series) -> np.ndarray:
    """Positions in ``trials`` of the trials :func:`cpu_curve` reads at ``like``'s settings, in its order: which
    they are depends on settings and status, never on the figures (the re-draws find them once)."""
    t = trials.reset_index(drop=True)
    c = _same_pipeline(ok(t, "cpu_pipeline"), like)
    c = c[["num_workers", "samples_per_s"]].dropna().drop_duplicates("num_workers").sort_values("num_workers")
    return c.index.to_numpy(int)


def worker_cores(trials: pd.DataFrame, rows: np.ndarray, usable: float) -> np.ndarray:
    """The cores the workers of the loader-alone trials at positions ``rows`` (:func:`cpu_curve_rows`) had: their
    count, or, where the count oversubscribed what the training process's own receiving left of the ``usable``
    cores (its measured CPU in that trial), what it left; NaN for a count past the cores (oversubscription, not
    more cores: left out as the curve's envelope leaves it out). The x of the curve that answers "how many cores"
    (the what-if, cores per GPU, the size table): read as counts, workers beside a busy receiving thread put the
    measuring machine's own cores under what it ran (docs/measured.md, "The size table against CPU masks").
    Never above the count, and non-decreasing along it."""
    t = trials.iloc[rows]
    w = t["num_workers"].to_numpy(float)
    main = figures(t["main_cpu_pct_mean"]).to_numpy(float) / 100 if "main_cpu_pct_mean" in t else np.zeros(len(w))
    had = np.minimum(w, usable - np.nan_to_num(main, nan=0.0))
    inside = w <= max(usable, 1)
    had[inside] = np.maximum.accumulate(np.maximum(had[inside], 0.0)) if inside.any() else had[inside]
    return np.where(inside, had, np.nan)


def cores_curve(trials: pd.DataFrame, like: pd.Series, usable: float) -> CpuCurve:
    """:func:`cpu_curve` with the cores its workers had (:func:`worker_cores`) for their counts: the curve the
    questions of cores read (what-if, cores per GPU, the size table); the recommended count reads counts."""
    t = trials.reset_index(drop=True)
    rows = cpu_curve_rows(t, like)
    return CpuCurve(worker_cores(t, rows, usable), t["samples_per_s"].to_numpy(float)[rows])


def curve_at(trials: pd.DataFrame, rows: np.ndarray) -> CpuCurve:
    """The :class:`CpuCurve` of the trials at positions ``rows`` (:func:`cpu_curve_rows`)."""
    return CpuCurve(trials["num_workers"].to_numpy(float)[rows], trials["samples_per_s"].to_numpy(float)[rows])


def handoff_interval(trials: pd.DataFrame, like: pd.Series) -> tuple[float, float]:
    """(low, high) of the 95% interval of the hand-off limit the ``handoff`` trial measured at ``like``'s
    pipeline; (inf, inf) when the run did not measure it. Never inferred: a limit stated to the user is one
    this run measured."""
    h = matching(ok(trials, "handoff"), like, HANDOFF_KEYS)
    if h.empty:
        return math.inf, math.inf
    rate = h["samples_per_s"]
    low = h["samples_per_s_ci95_low"].fillna(rate) if "samples_per_s_ci95_low" in h else rate
    high = h["samples_per_s_ci95_high"].fillna(rate) if "samples_per_s_ci95_high" in h else rate
    return float(low.max()), float(high.max())


def handoff_limit(trials: pd.DataFrame, like: pd.Series) -> float:
    """Samples/s the loader's hand-off passes at ``like``'s pipeline: the upper end of the measured interval
    (a limit must not sit below what the machine did); inf when unmeasured."""
    return handoff_interval(trials, like)[1]


def cpu_at(workers: float, ws: np.ndarray, rates: np.ndarray) -> float:
    """CPU bound at a (possibly fractional) worker count, interpolated on the measured curve."""
    if not len(ws):
        return float("nan")
    return float(np.interp(workers, ws, rates))


def load_cost_s(row: pd.Series, ws: np.ndarray, rates: np.ndarray, cores: float = math.inf) -> float | None:
    """Worker CPU seconds per sample: the stage clocks' sum, else the cores the fewest workers
    measured could use over their rate (w workers on fewer cores use only the cores)."""
    cost = stage_cost_s(row)
    if cost:
        return cost
    pos = ws > 0
    return float(min(ws[pos][0], cores) / rates[pos][0]) if pos.any() else None


def _known(x) -> bool:
    return x is not None and x == x and x > 0


def predict(row: pd.Series, ws: np.ndarray, rates: np.ndarray, cores: float) -> tuple[float, dict]:
    """Predicted end-to-end samples/s and the bounds it used (see the module docstring).

    Bounds: ``step`` (the step alone: the GPU ceiling, or the CPU step's), ``cpu`` (loader
    alone at these workers, capped at the cores the step leaves free), ``io`` (raw reads
    alone), and ``cores``: the CPU budget when the step and the workers share the machine,
    cores / (step CPU s + worker CPU s per sample). The last one matters where the step
    itself burns CPU (CPU training, or a small machine); on a GPU box it is rarely the lowest.
    """
    step, io, w = gpu_side(row), row.get("io_bound_samples_per_s"), row["num_workers"]
    if w == 0:
        cpu = row.get("cpu_bound_samples_per_s")
        if _known(row.get("shared_bound_samples_per_s")):
            # the GPU pipeline's loader alone already holds its decode/augment. Overlapped, a producer thread loads
            # while the step runs: the slower side binds (the step's with the pipeline beside it), nothing adds;
            # serially, the loader in turn with the step alone
            if overlap_mode(row) in OVERLAPPED:
                bounds = {"step": step, "cpu": cpu, "io": io, "cores": None}
                return (min(step, cpu) if _known(step) and _known(cpu) else float("nan")), bounds
            step = step_bound(row)
        bounds = {"step": step, "cpu": cpu, "io": io, "cores": None}
        serial = [step, cpu] if _known(step) and _known(cpu) else []
        return (1 / sum(1 / b for b in serial) if serial else float("nan")), bounds
    main, main_s = _step_cpu(row)
    # the step holds its cores only while it runs: at most the share of the time the loader lets it run (a loop
    # fed at a ninth of its step's rate alone steps a ninth of the time, and its workers have the rest)
    alone = row.get("cpu_bound_samples_per_s")
    duty = min(1.0, alone / step) if _known(alone) and _known(step) else 1.0
    w_eff = min(w, max(cores - main * duty, 1.0))
    cpu = cpu_at(w_eff, ws, rates) if w_eff < w else row.get("cpu_bound_samples_per_s")
    load = load_cost_s(row, ws, rates, cores)
    budget = cores / (main_s + load) if main_s is not None and load else None
    bounds = {"step": step, "cpu": cpu, "io": io, "cores": budget}
    if not (_known(step) and _known(cpu)):
        return float("nan"), bounds
    return min(b for b in bounds.values() if _known(b)), bounds


def _step_cpu(row: pd.Series) -> tuple[float, float | None]:
    """(cores the training process holds in this trial, its CPU seconds per sample).

    A CPU step holds its threads (``step_threads``); a GPU step about what it used in the
    ceiling trial. Per sample: its CPU in the ceiling over the ceiling's rate (unscaled: the
    work per sample does not change with the threads that share it).
    """
    main = row.get("main_cores_step")
    main = 1.0 if not _known(main) else float(main)
    ceiling = row.get("step_bound_samples_per_s")
    per_sample = main / ceiling if _known(ceiling) else None
    threads = row.get("step_threads")
    return (float(threads) if _known(threads) else main), per_sample


def step_bound(row: pd.Series) -> float | None:
    """The step's bound in this trial: the ceiling, scaled down when a CPU step had fewer threads here
    than in the ceiling trial (``confounders.step_threads``). Linear in threads: a lower estimate, as one
    thread of two usually does more than half the work (docs/measured.md, "The step")."""
    step, threads, alone = (row.get(k) for k in ("step_bound_samples_per_s", "step_threads", "ceiling_threads"))
    if _known(step) and _known(threads) and _known(alone) and threads < alone:
        return step * threads / alone
    return step


def gpu_side(row: pd.Series) -> float | None:
    """The step's side of the prediction: :func:`step_bound`, or where the GPU pipeline shares the step's device,
    the rate the two reached together in the ``gpu_shared`` trial (the lower: it holds the step's own time)."""
    step, shared = step_bound(row), row.get("shared_bound_samples_per_s")
    if _known(shared):
        return min(step, shared) if _known(step) else shared
    return step


def _noise(row: pd.Series, bound: str) -> float:
    """Relative half-width of the interval of the trial behind a bound (0 when unknown)."""
    v = _recorded_noise(row, bound)
    return 0.0 if v is None else v


def _recorded_noise(row: pd.Series, bound: str) -> float | None:
    """:func:`_noise`, None where the trial recorded no interval (or the bound is the computed cores budget)."""
    col = {"step": "step_bound_samples_per_s", "cpu": "cpu_bound_samples_per_s", "io": "io_bound_samples_per_s"}.get(
        bound
    )
    if bound == "step" and gpu_side(row) != step_bound(row):  # the GPU pipeline beside the step binds that side
        col = "shared_bound_samples_per_s"
    v = row.get(f"{col}_noise") if col else None
    return float(v) if v is not None and v == v else None


def prediction_noise(row: pd.Series, bounds: dict) -> float | None:
    """Relative half-width of the interval of the bound that sets :func:`predict`'s figure (its lowest), None where
    that trial's interval is not recorded (the cores budget is a computed figure: it has none of its own)."""
    known = [(v, k) for k, v in bounds.items() if _known(v)]
    return _recorded_noise(row, min(known)[1]) if known else None


def step_verdict(device: str) -> str:
    """What the step binding is called: the GPU on a GPU, the CPU step on a machine without one."""
    return "gpu-bound" if device == "cuda" else "step-bound"


def classify(row: pd.Series, bounds: dict, device: str = "cuda") -> str:
    """The isolated bounds' verdict: gpu-/step-bound, cpu-bound, io-bound, loader-bound or balanced.

    ``cores`` binding counts as cpu-bound (the machine's cores are the limit). Needs the
    step bound and the loader bound measured: with either missing it is 'unknown'.
    """
    if not (_known(bounds.get("step")) and (_known(bounds.get("cpu")) or _known(bounds.get("io")))):
        return "unknown"
    known = sorted((v, "cpu" if k == "cores" else k) for k, v in bounds.items() if _known(v))
    low, side = known[0]
    cpu, io = bounds.get("cpu"), bounds.get("io")
    if side == "cpu" and waits_on_storage(cpu, io):
        side = "io"  # the pipeline runs at the speed its bytes arrive: storage, not CPU, binds
    if side == "cpu" and _known(cpu) and cpu <= low * (1 + BALANCED) and row["num_workers"] > 0:
        if at_handoff(cpu, row):  # the loader alone runs at the measured hand-off limit
            return "loader-bound"
    # the loader chain (cpu, io) against the step: balanced when the two ends are within 5%, or
    # their measured intervals overlap (neither is shown to be the lower)
    chain = {"cpu", "io"}
    other = [(v, k) for v, k in known if (k in chain) != (side in chain)]
    if other and other[0][0] <= (1 + max(BALANCED, _noise(row, side) + _noise(row, other[0][1]))) * low:
        return "balanced"
    return step_verdict(device) if side == "step" else f"{side}-bound"
