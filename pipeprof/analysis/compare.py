"""Two or more stored runs side by side: which trials match, their rate ratios, what differs.

Pure functions over loaded runs (``results.load_run``): no I/O, no drawing; ``report.comparison``
renders what they return. Trials match by their settings (kind, model, precision, preset, source,
cache state, batch, workers, ...), never by trial id. A ratio is "within noise" when the two trials'
95% intervals overlap. Each run's CPU reference (a fixed JPEG decode, ``reference``) says how fast
the machine's cores were: a CPU-bound ratio divided by the references' ratio is the pipeline's
change with the machine's speed taken out.
"""

from __future__ import annotations

from typing import NamedTuple, Optional

import pandas as pd

from pipeprof.stats import gain_bounds

#: the settings that make two trials the same measurement (those a run lacks are left out)
SETTINGS = [
    "kind",
    "model",
    "precision",
    "mode",
    "preset",
    "decoder",
    "augment_device",
    "source",
    "cache_state",
    "batch_size",
    "num_workers",
    "pin_memory",
    "image_size",
    "input_dtype",
    "stage_timing",
    "gpus",
    "p2p",
]
#: a setting changed wholesale between two runs -> the action trial (``pipeprof.actions``) that tries that change
ACTION_OF = {"decoder": "decoder", "augment_device": "gpu_pipeline", "pin_memory": "pin_memory"}
#: config fields that name a run rather than change what it measures
NOT_SETTINGS = {"name", "out_dir", "data.cache_dir"}
MACHINE = [
    "cpu_model",
    "cores.usable",
    "memory.total_gb",
    "torch.version",
    "torch.device_names",
    "pillow_jpeg.version",
    "libraries",
]
#: of those, the ones that make two runs another machine's (the CI guard's refusal): the CPU, its usable cores, the
#: GPUs and torch; memory, Pillow's JPEG library and the other libraries only differ
IDENTITY = [f"machine.{f}" for f in ("cpu_model", "cores.usable", "torch.device_names", "torch.version")]


class Difference(NamedTuple):
    """A field whose value is not the same in every run: its dotted name and each run's value."""

    field: str
    values: list


def flatten(d: dict, prefix: str = "") -> dict:
    """Nested dicts as {'section.key': value}; lists and scalars are leaves."""
    out = {}
    for k, v in d.items():
        name = f"{prefix}{k}"
        out |= flatten(v, f"{name}.") if isinstance(v, dict) and v else {name: v}
    return out


def _machine(meta: dict) -> dict:
    flat = flatten(meta.get("machine") or {})
    return {f"machine.{k}": v for k, v in flat.items() if any(k == m or k.startswith(f"{m}.") for m in MACHINE)}


def differences(runs: list) -> list[Difference]:
    """Config fields and machine facts (CPU, cores, GPUs, versions) whose values differ between runs."""
    flats = [
        {f"config.{k}": v for k, v in flatten(r.meta.get("config") or {}).items() if k not in NOT_SETTINGS}
        | _machine(r.meta)
        for r in runs
    ]
    fields = sorted(set().union(*flats))
    return [
        Difference(f, [fl.get(f) for fl in flats])
        for f in fields
        if any(fl.get(f) != flats[0].get(f) for fl in flats[1:])
    ]


def reference_rate(meta: dict, processes: Optional[int] = None, at: tuple = ("start", "end")) -> Optional[float]:
    """Decodes/s of the CPU reference at its largest process count (or at ``processes``), the mean of its readings
    ``at`` the run's start and end; None where the run has none there."""

    def point(points: list) -> Optional[dict]:
        if processes is None:
            return max(points, key=lambda p: p["processes"])
        return next((p for p in points if p.get("processes") == processes), None)

    ref = meta.get("cpu_reference") or {}
    found = [point(ref[w]["points"]) for w in at if (ref.get(w) or {}).get("points")]
    rates = [p["decodes_per_s"] for p in found if p is not None]
    return sum(rates) / len(rates) if rates else None


def _key(value) -> str:
    """A setting as matching text: missing is '', 4.0 is '4' (a column with gaps is stored as float)."""
    if value is None or (isinstance(value, float) and value != value):
        return ""
    if isinstance(value, float) and value.is_integer():
        return str(int(value))
    return str(value)


def _text(df: pd.DataFrame, cols: list[str]) -> pd.Series:
    return (
        df[cols].apply(lambda c: c.map(_key)).agg("|".join, axis=1)
        if len(df) and cols
        else pd.Series("", index=df.index, dtype=str)
    )


def _keyed(trials: pd.DataFrame, cols: list[str]) -> pd.DataFrame:
    """The run's ok trials keyed by ``cols``; two trials that share a key but differ in a setting the
    other run lacks cannot be matched one to one, and raise rather than one being dropped."""
    ok = trials[(trials["status"] == "ok") & trials["samples_per_s"].notna()] if len(trials) else trials
    ok = ok.assign(_match=_text(ok, cols))
    rest = [c for c in SETTINGS if c in ok and c not in cols]
    clash = ok.assign(_rest=_text(ok, rest)).groupby("_match")["_rest"].nunique()
    if (clash > 1).any():
        raise ValueError(
            f"trials {clash[clash > 1].index[0]!r} differ only in {rest}, which the other run "
            "lacks: they cannot be matched"
        )
    return ok.drop_duplicates("_match")


def _interval(df: pd.DataFrame, side: str) -> pd.Series:
    col = f"samples_per_s_ci95_{side}"
    return df[col] if col in df else pd.Series(float("nan"), index=df.index)


def _one_value(trials: pd.DataFrame, col: str):
    """The single value ``col`` holds over a run's ok trials (missing ignored), else None."""
    ok = trials[trials["status"] == "ok"] if len(trials) and "status" in trials else trials
    values = ok[col].dropna().map(_key).unique() if col in ok else []
    return values[0] if len(values) == 1 else None


def changed(base, other, cols=tuple(ACTION_OF)) -> dict:
    """The settings of ``cols`` (default: the action settings, :data:`ACTION_OF`) one run changed wholesale against
    the other (``decoder``: pil in every trial of the first, cv2 in every trial of the second): setting ->
    (base's value, other's). Trials are matched across them, so a run with an action applied sits beside the run
    without it; any other setting (model, precision, ...) still keeps trials apart."""
    out = {}
    for col in cols:
        a, b = _one_value(base.trials, col), _one_value(other.trials, col)
        if a is not None and b is not None and a != b:
            out[col] = (a, b)
    return out


def ratios(base, other, label: str, across: dict = {}) -> pd.DataFrame:  # noqa: B006 - read only
    """One row per trial of ``other`` whose settings match one of ``base`` (across the settings in
    ``across``, :func:`changed`): both rates, the ratio, whether their 95% intervals overlap, and the
    ratio over the CPU references' ratio."""
    cols = [c for c in SETTINGS if c in base.trials and c in other.trials and c not in across]
    a, b = _keyed(base.trials, cols), _keyed(other.trials, cols)
    m = a.assign(lo=_interval(a, "low"), hi=_interval(a, "high")).merge(
        b.assign(lo=_interval(b, "low"), hi=_interval(b, "high"))[["_match", "samples_per_s", "lo", "hi", "trial_id"]],
        on="_match",
        suffixes=("_a", "_b"),
    )
    ref_a, ref_b = reference_rate(base.meta), reference_rate(other.meta)
    ref = ref_b / ref_a if ref_a and ref_b else None
    known = m[["lo_a", "hi_a", "lo_b", "hi_b"]].notna().all(axis=1)
    overlap = (m["lo_a"] <= m["hi_b"]) & (m["lo_b"] <= m["hi_a"])
    out = m[cols].assign(
        trial=m["trial_id_a"],
        trial_b=m["trial_id_b"],
        run=label,
        rate_a=m["samples_per_s_a"],
        rate_b=m["samples_per_s_b"],
        ratio=m["samples_per_s_b"] / m["samples_per_s_a"],
        within_noise=overlap.where(known, None),
        lo_a=m["lo_a"],
        hi_a=m["hi_a"],
        lo_b=m["lo_b"],
        hi_b=m["hi_b"],
        reference_ratio=ref,
    )
    out["normalised_ratio"] = out["ratio"] / ref if ref else None
    return out.reset_index(drop=True)


def action_checks(base, label: str, table: pd.DataFrame, across: dict) -> list[dict]:
    """For each setting in ``across`` that an action trial tries: each of the baseline run's action trials
    for it (measured gain and interval) beside the rerun's end-to-end ratio at that trial's settings (its
    model, batch, workers, ...), and whether the ratio falls in the trial's interval."""
    out = []
    for col, (was, now) in across.items():
        for trial in (base.meta.get("action_trials") or {}).get("rows", []):
            if trial.get("status") != "ok" or trial.get("action") != ACTION_OF[col]:
                continue
            e2e = table[(table["run"] == label) & (table["kind"] == "end_to_end")]
            for c in (c for c in SETTINGS if c in e2e and c in trial and c != "kind"):
                e2e = e2e[e2e[c].map(_key) == _key(trial.get(c))]
            ratio = float(e2e["ratio"].iloc[0]) if len(e2e) == 1 else None
            lo, hi = gain_bounds(
                trial.get("action_gain_frac"), trial.get("action_gain_ci95_low"), trial.get("action_gain_ci95_high")
            )
            out.append(
                {
                    "run": label,
                    "setting": col,
                    "from": was,
                    "to": now,
                    "action": trial.get("action"),
                    "num_workers": trial.get("num_workers"),
                    "trial_gain": trial.get("action_gain_frac"),
                    "trial_low": lo,
                    "trial_high": hi,
                    "rerun_gain": ratio - 1 if ratio is not None else None,
                    "agrees": None if ratio is None or lo is None or hi is None else bool(lo <= ratio - 1 <= hi),
                }
            )
    return out


class Comparison(NamedTuple):
    """What ``compare`` found: the runs' labels, matching trials' ratios, differing settings, references,
    the settings each later run changed wholesale, and the baseline's action trials beside those changes."""

    labels: list[str]
    ratios: pd.DataFrame
    differences: list[Difference]
    references: list[Optional[float]]
    changed: dict = {}
    actions: list = []


def compare(runs: list, labels: list[str]) -> Comparison:
    """Every later run against the first (the baseline): ratios of matching trials, what differs."""
    if len(runs) < 2:
        raise ValueError("compare needs two runs or more")
    across = {lab: changed(runs[0], r) for r, lab in zip(runs[1:], labels[1:])}
    rows = pd.concat([ratios(runs[0], r, lab, across[lab]) for r, lab in zip(runs[1:], labels[1:])], ignore_index=True)
    return Comparison(
        labels,
        rows,
        differences(runs),
        [reference_rate(r.meta) for r in runs],
        across,
        [a for lab in labels[1:] for a in action_checks(runs[0], lab, rows, across[lab])],
    )
