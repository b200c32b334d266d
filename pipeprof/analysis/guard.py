"""The CI guard: is a new run slower than its base beyond a threshold *and* beyond the two runs' measured noise?

``pipeprof compare BASE NEW --fail-if-slower [PCT]`` reads what :func:`guard` returns. Each trial of the new run
that matches one of the base (``compare.ratios``: the same settings, never the same trial id) gets a change and
its 95% interval:

- from the two trials' window rates where both runs stored them (``stats.ratio_ci95``: the ratio of the means,
  the log ratio's standard error), else from their intervals' far ends (new low over base high, and so on);
- widened by the runs' own spread where a side pooled several runs (``bench regress``, ``run_rates``: each run's
  mean): windows of one run share its process, its memory layout and the machine's state then, so their spread
  leaves out how much a whole run moves (docs/measured.md: a same-config A B B A read beyond the noise);
  the interval of the ratio of the runs' means, where wider, is the one read;
- widened by the machine's drift: each run carries a CPU reference (a fixed JPEG decode timed at its start and
  end, ``compare.reference_rate``); where the two references differ, the interval spans both the raw change and
  the change with the references' ratio taken out, since a CPU-bound rate moves with the cores' speed and a
  GPU-bound one does not.

A trial is *slower* when its change is below ``-threshold`` and its whole interval below zero; *within noise*
otherwise. Runs whose machines differ (CPU model, usable cores, GPUs, torch) are compared only when allowed, and
the result says so. Pure: no I/O; the command line prints the lines and sets the exit status.
"""

from __future__ import annotations

import math
from typing import NamedTuple, Optional

from pipeprof.stats import ratio_ci95

from .compare import IDENTITY, differences, ratios


class Change(NamedTuple):
    """One matching trial: the new rate against the base's, its change and 95% interval, and the reading."""

    trial: str
    kind: str
    base_samples_per_s: float
    new_samples_per_s: float
    change_frac: float
    low_frac: float
    high_frac: float
    slower: bool
    basis: str  # how the interval was read (windows, intervals, with the references' drift)


class Guarded(NamedTuple):
    verdict: str  # 'slower', 'within noise', 'no matching trial', 'other machine'
    changes: list[Change]
    machine: list  # the identity fields that differ ([] on one machine)
    threshold_frac: float

    @property
    def failed(self) -> bool:
        return self.verdict == "slower"


def _windows(value) -> Optional[list[float]]:
    rates = list(value) if value is not None and not isinstance(value, float) else []
    return rates if len(rates) >= 2 else None


def _change(row, base_windows, new_windows, ref: Optional[float], runs=(None, None)) -> tuple[float, float, float, str]:
    """(change, low, high, basis) of one matching pair; ``runs``: each side's per-run mean rates, where it pooled
    several runs."""
    a, b = _windows(base_windows), _windows(new_windows)
    if a and b:
        change, low, high = ratio_ci95(b, a)
        basis = f"windows ({len(a)} and {len(b)})"
        ra, rb = _windows(runs[0]), _windows(runs[1])
        if ra and rb:  # a few runs of one machine: their spread read with both sides' degrees of freedom
            _, run_low, run_high = ratio_ci95(rb, ra, pooled_df=True)
            if run_low < low or run_high > high:
                low, high = min(low, run_low), max(high, run_high)
                basis += f", widened by the runs' spread ({len(ra)} and {len(rb)} runs)"
        elif any(r is not None and not isinstance(r, float) for r in runs):  # a list of one run (NaN: none kept)
            basis += ", the runs' spread not read (one run on a side)"
    else:
        change = row["rate_b"] / row["rate_a"] - 1
        lo_a, hi_a, lo_b, hi_b = (row.get(k) for k in ("lo_a", "hi_a", "lo_b", "hi_b"))
        known = all(v is not None and v == v for v in (lo_a, hi_a, lo_b, hi_b))
        low, high = (lo_b / hi_a - 1, hi_b / lo_a - 1) if known else (change, change)
        basis = "the trials' intervals" if known else "the medians only (no interval stored)"
    if ref and not math.isclose(ref, 1.0):
        low, high = min(low, (1 + low) / ref - 1), max(high, (1 + high) / ref - 1)
        basis += f", widened by the CPU references' drift ({ref - 1:+.1%})"
    return change, low, high, basis


def guard(
    base, new, threshold_frac: float = 0.05, allow_other_machine: bool = False, across: Optional[dict] = None
) -> Guarded:
    """The guard's reading of ``new`` against ``base`` (loaded runs, ``results.load_run``); see the module.
    ``across``: settings that differ wholesale between the two and are what is compared (``compare.changed``)."""
    diffs = [d for d in differences([base, new]) if d.field in IDENTITY]
    if diffs and not allow_other_machine:
        return Guarded("other machine", [], diffs, threshold_frac)
    table = ratios(base, new, "new", across or {})

    def column(name: str) -> dict:
        """A side's ``name`` by trial id; an id two trials share (a run from before ids named a step's uint8
        input) reads as unknown, not as the other trial's."""
        out = {}
        for side, run in (("a", base), ("b", new)):
            col = run.trials.set_index("trial_id")[name] if name in run.trials else None
            out[side] = col[~col.index.duplicated(keep=False)] if col is not None else None
        return out

    def pair(col: dict, row) -> tuple:
        return tuple(col[s].get(row[t]) if col[s] is not None else None for s, t in (("a", "trial"), ("b", "trial_b")))

    windows, runs = column("window_rates"), column("run_rates")
    changes = []
    for _, row in table.iterrows():
        wa, wb = pair(windows, row)
        change, low, high, basis = _change(row, wa, wb, row.get("reference_ratio"), pair(runs, row))
        slower = change < -threshold_frac and high < 0
        kind = str(row.get("kind", ""))
        changes.append(Change(str(row["trial"]), kind, row["rate_a"], row["rate_b"], change, low, high, slower, basis))
    if not changes:
        return Guarded("no matching trial", [], diffs, threshold_frac)
    return Guarded("slower" if any(c.slower for c in changes) else "within noise", changes, diffs, threshold_frac)


def lines(g: Guarded) -> list[str]:
    """The guard's words: the verdict, each slower trial (or the closest call), the machines' differences."""
    pct = f"{g.threshold_frac:.0%}"
    if g.verdict == "other machine":
        return [
            "other machine: the runs' machines differ ("
            + "; ".join(f"{d.field}: {d.values[0]} vs {d.values[1]}" for d in g.machine)
            + "): compared only with --allow-other-machine"
        ]
    if g.verdict == "no matching trial":
        return ["no matching trial: the two runs measured no trial with the same settings"]
    out = []
    if g.machine:
        out.append("note: the runs come from different machines (--allow-other-machine): " + ", ".join(
            d.field for d in g.machine
        ))  # fmt: skip
    shown = [c for c in g.changes if c.slower] or [min(g.changes, key=lambda c: c.change_frac)]
    for c in shown:
        where = (
            f"beyond the {pct} threshold and the runs' noise"
            if c.slower
            else "within the runs' noise"
            if c.high_frac >= 0
            else f"slower beyond the noise but within the {pct} threshold"
        )
        out.append(
            f"{c.kind} {c.trial}: {c.new_samples_per_s:,.1f} vs {c.base_samples_per_s:,.1f} samples/s, "
            f"{c.change_frac:+.1%} ({c.low_frac:+.1%} … {c.high_frac:+.1%}), {where} [{c.basis}]"
        )
    head = (
        f"slower: {sum(c.slower for c in g.changes)} of {len(g.changes)} matching trials"
        if g.failed
        else f"within noise: none of {len(g.changes)} matching trials slower beyond {pct} and the runs' noise"
    )
    return [head] + out
