"""How much the answer can be trusted: re-draw each trial's windows and ask again.

A run's answer (the num_workers to set, the side and the resource that bind) is computed from
medians of a few timed windows. On a shared machine those windows move by several percent
(docs/measured.md), so the same run repeated can pick a neighbouring count or a neighbouring
verdict. Here each trial's windows are resampled with replacement (a bootstrap: the rates, the
data-wait shares); the monitor's figures that have only an interval (busy cores, workers' CPU) are
drawn from it. The recommendation and the verdict are recomputed for every draw, and the answer's
confidence is how often they agree: "num_workers 14-16 (95% of re-draws); input side, cores (88%)".
Re-draws see only the noise inside the trials: an answer read from trials that shared the cores with
other processes (:func:`disturbed`) does not hold, however often its re-draws agree.

Pure: trials in, a dict per group out. ``draws`` and ``seed`` fix the result for a given table.
"""

from __future__ import annotations

import math
import statistics
from collections import Counter
from typing import NamedTuple, Optional

import numpy as np
import pandas as pd

from pipeprof.answer import Recommendation
from pipeprof.measure.noise import causes
from pipeprof.stats import mean_ci95, t95

from .advice import recommend_workers
from .bounds import BOUND_KEYS, GROUP_KEYS, NEAR_BEST, Join, cpu_curve_rows, curve_at, curves, groups, join
from .verdict import at_recommended, verdicts

DRAWS = 60  # shares move by about 1/sqrt(draws): ±6 points at 60, enough to say whether 80% holds; each draw
# reads the verdicts and the recommendation again (the draws share one layout: which trials join, which make each
# group and its loader curve; finding them again in every draw made the re-draws several times slower:
# docs/measured.md), so more would add seconds to every run
HOLDS = 0.80  # the answer holds when at least 80% of the re-draws give it
SPREAD = {"usable_busy_cores": "usable_busy_cores_mean", "workers_cpu_pct": "workers_cpu_pct_mean"}


def _t_interval(samples: np.ndarray, share: bool = False) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(median, ci95 low, ci95 high) of each row of ``samples`` (draws x windows), as the trials compute them
    (``stats.rate_bounds``: a rate's interval multiplicative; ``stats.share_bounds``: a share's within [0, 1])."""
    n = samples.shape[1]
    mean, sd = samples.mean(axis=1), samples.std(axis=1, ddof=1)
    half = t95(n) * sd / np.sqrt(n)
    if share:  # the mean window share first: data_wait_frac is a share of the whole time, not a median
        return mean, np.clip(mean - half, 0, 1), np.clip(mean + half, 0, 1)
    rel = np.minimum(half / np.where(mean > 0, mean, np.inf), 700.0)
    return np.median(samples, axis=1), mean * np.exp(-rel), mean * np.exp(rel)


def _windows(value) -> Optional[np.ndarray]:
    w = np.asarray(value, dtype=float) if isinstance(value, (list, tuple, np.ndarray)) else None
    return w if w is not None and len(w) >= 2 and np.isfinite(w).all() else None


def _redraw_windows(trials: pd.DataFrame, column: str, rng, draws: int) -> dict:
    """{row index: (median, low, high) arrays over the draws} from resampling each row's ``column``."""
    out = {}
    for i, value in trials.get(column, pd.Series(dtype=object)).items():
        w = _windows(value)
        if w is not None:
            out[i] = _t_interval(rng.choice(w, size=(draws, len(w)), replace=True), column == "window_data_wait")
    return out


def _redraw_spread(trials: pd.DataFrame, rng, draws: int) -> dict:
    """{column: draws x rows} for the monitor figures known only by their interval (normal, sd = half / 1.96)."""
    out = {}
    for name, mean_col in SPREAD.items():
        lo, hi = f"{name}_ci95_low", f"{name}_ci95_high"
        if not {mean_col, lo, hi} <= set(trials):
            continue
        mid, sd = trials[mean_col].to_numpy(float), (trials[hi] - trials[lo]).to_numpy(float) / 2 / 1.96
        sd = np.where(np.isfinite(sd), sd, 0.0)
        out[mean_col] = np.maximum(mid + rng.standard_normal((draws, len(trials))) * sd, 0.0)
    return out


def _draw(trials: pd.DataFrame, k: int, rates: dict, waits: dict, spread: dict) -> pd.DataFrame:
    """The table as re-draw ``k`` sees it: every resampled figure replaced, the rest as measured."""
    df = trials.copy()
    for figures, names in (
        (rates, ("samples_per_s", "samples_per_s_ci95_low", "samples_per_s_ci95_high")),
        (waits, ("data_wait_frac", "data_wait_frac_ci95_low", "data_wait_frac_ci95_high")),
    ):
        if not figures:
            continue
        rows = list(figures)
        med, lo, hi = (np.array([figures[i][j][k] for i in rows]) for j in range(3))
        for name, values in zip(names, (med, lo, hi)):
            column = df[name].to_numpy(float, copy=True) if name in df else np.full(len(df), np.nan)
            column[rows] = values
            df[name] = column
    for col, values in spread.items():
        df[col] = values[k]
    return df


def _lean(trials: pd.DataFrame) -> pd.DataFrame:
    """The columns the verdict and the recommendation read: the numbers, and the text that keys a trial to
    its group and bounds (each draw copies and joins the table: the rest would only slow it)."""
    # stage_timing too: True/False/None is an object column, and without it ``bounds.ok`` took the stage-clocks-off
    # twins (the overhead checks') for bounds in every re-draw, beside the rows the answer reads
    keys = {"kind", "status", "trial_id", "stage_timing", *GROUP_KEYS, *(k for ks in BOUND_KEYS.values() for k in ks)}
    keep = [c for c in trials if c in keys or pd.api.types.is_numeric_dtype(trials[c])]
    return trials[keep]


class Layout(NamedTuple):
    """Which trials each re-draw reads, found once: ``rows`` the curve rows' join (:func:`bounds.join`), and per
    group (key, its positions among the curve rows, the positions of its loader-alone trials in the table:
    ``bounds.cpu_curve_rows``). A draw changes figures, never settings or status, so these hold for every draw;
    finding them again (a groupby and a filter of the table per group) was half of each draw's time."""

    rows: Join
    groups: list


def layout(trials: pd.DataFrame) -> Layout:
    """The :class:`Layout` of the measured table (its draws share it)."""
    rows = join(trials)
    joined = curves(trials, rows)
    where = pd.Series(np.arange(len(joined)), index=joined.index)
    return Layout(
        rows,
        [
            (key, where[curve.index].to_numpy(int), cpu_curve_rows(trials, curve.iloc[0]))
            for key, curve in groups(joined)
        ],
    )


def _answers(df: pd.DataFrame, cores: float, device: str, at: Layout) -> dict:
    """{group key: (recommended workers, side, resource)} of one table (``at``: its :func:`layout`)."""
    joined = curves(df, at.rows)
    parts = [(key, joined.iloc[pos], curve_at(df, cpu)) for key, pos, cpu in at.groups]
    v = verdicts(df, cores, device, joined, parts)
    out = {}
    for key, curve, _ in parts:
        w = Recommendation.from_dict(recommend_workers(curve)).workers
        here = at_recommended(v[v["trial_id"].isin(curve["trial_id"])] if len(v) else v, w)
        side, res = (here["side"], here["resource"]) if here is not None else (None, None)
        out[group_id(key)] = (w, side, res)
    return out


def group_id(key: dict) -> tuple:
    """A group's key dict as a hashable id (the analysis's groups and these answers are matched on it)."""
    return tuple(sorted((k, str(x)) for k, x in key.items()))


def confidence(trials: pd.DataFrame, cores: float, device: str, draws: int = DRAWS, seed: int = 0) -> dict:
    """Per group key (as :func:`bounds.groups` names it): the answer, and how often the re-draws agree."""
    e2e = trials[trials.get("kind", pd.Series(dtype=object)) == "end_to_end"]
    if e2e.empty or "window_rates" not in trials:
        return {}
    rng = np.random.default_rng(seed)
    trials = trials.reset_index(drop=True)
    rates = _redraw_windows(trials, "window_rates", rng, draws)
    waits = _redraw_windows(trials, "window_data_wait", rng, draws)
    trials = _lean(trials)
    spread = _redraw_spread(trials, rng, draws)
    at = layout(trials)  # a draw changes figures, not which trials each group reads
    base = _answers(trials, cores, device, at)
    seen: dict = {key: [] for key in base}
    for k in range(draws):
        for key, answer in _answers(_draw(trials, k, rates, waits, spread), cores, device, at).items():
            seen.setdefault(key, []).append(answer)
    return {key: summarize(base[key], seen[key]) for key in base}


def disturbed(curve: pd.DataFrame) -> Optional[dict]:
    """Other processes' load on the run's CPUs in the trials the answer is read from (the group's end-to-end
    trials), where it could move the answer: the monitor flagged it (``measure.noise.causes``: a tenth of a
    core and 2% of the cores) and it held at least ``1 - NEAR_BEST`` of the usable cores, the most it can take
    from a rate that needs every core. Less cannot move a rate beyond the 5% within which the answer already
    calls two rates the same (a smaller load, flagged, had read "does not hold" where the run's re-draws agreed).
    Re-drawing windows that all shared the cores with such a load cannot say what the pipeline does on a quiet
    machine: a run beside other work can answer a different count from quiet runs, each at 100% of its re-draws
    (docs/measured.md, "The answer's confidence under outside load"). None when nothing was."""
    hit = [
        r
        for r in curve.to_dict("records")
        if any(c == "foreign load" for c, _ in causes(r))
        and r["foreign_cores_mean"] >= (1 - NEAR_BEST) * (r.get("usable_cores") or 0)
    ]
    if not hit:
        return None
    return {"trials": len(hit), "of": int(len(curve)), "foreign_cores_max": max(r["foreign_cores_mean"] for r in hit)}


def summarize(answer: tuple, drawn: list[tuple]) -> dict:
    """The answer beside its re-draws: the count range holding 95% of them, and each level's agreement."""
    w, side, resource = answer
    if not drawn:
        return {"draws": 0}
    counts = np.array([d[0] for d in drawn])
    lo, hi = (int(x) for x in np.quantile(counts, [0.025, 0.975], method="nearest"))
    same_side = sum(d[1] == side for d in drawn) / len(drawn)
    same = sum(d[1:] == (side, resource) for d in drawn) / len(drawn)
    others = Counter(d[1:] for d in drawn if d[1:] != (side, resource)).most_common(2)
    return {
        "draws": len(drawn),
        "workers_low": lo,
        "workers_high": hi,
        "workers_share": float(((counts >= lo) & (counts <= hi)).mean()),
        "recommended_share": float((counts == w).mean()),
        "side": side,
        "resource": resource,
        "side_share": same_side,
        "answer_share": same,
        "alternatives": [{"side": s, "resource": r, "share": n / len(drawn)} for (s, r), n in others],
        "holds": bool(same >= HOLDS),
    }


# The answer's pair trial: the pick against its nearest rival in alternating windows on one step
# (orchestrate.action_trials.confirm_answers). Re-draws see only the noise inside each trial; trials measured
# seconds apart also differ by how far the machine moved between them, which no re-draw sees. Alternating the
# two counts' windows puts the same drift on both, so their ratio, pair by pair, says whether they differ.
PAIR_KIND = "pair"


def rival_of(rates: dict[int, float], pick: int) -> Optional[int]:
    """The pick's nearest rival among the measured counts: the other count whose median rate (samples/s) is
    closest to the pick's (absolute difference; a tie goes to the smaller count). None with one count."""
    others = [w for w in rates if w != pick and rates[w] is not None and np.isfinite(rates[w])]
    if pick not in rates or not others:
        return None
    return min(others, key=lambda w: (abs(rates[w] - rates[pick]), w))


def pair_decision(pick: int, rival: int, pick_rates: list[float], rival_rates: list[float]) -> dict:
    """The answer from the paired windows of ``pick`` and ``rival`` (samples/s; window i of each from one
    cycle of alternation, so pair i shares the machine's state).

    ``smaller_over_larger``: the smaller count's rate over the larger's per pair, their geometric mean and 95%
    interval (t on the log ratios, pairs - 1 degrees of freedom). Separated where the interval excludes 1.
    Then the answer is the faster count, except that the smaller count is kept where it is within 5% of the
    larger (``NEAR_BEST``: the sweep's rule of the smallest num_workers within 5% of the best). Not separated
    (or under 2 pairs): "within the machine's drift", the smaller count answered as the sweep's tie rule does.
    ``first``/``second``/``first_over_second``: the pair as the confidence line names it (the answer first where
    separated)."""
    small, large = sorted((pick, rival))
    by = {pick: list(pick_rates), rival: list(rival_rates)}
    # on the log of each pair's ratio: a ratio's interval stays above 0 and is the same read either way round
    logs = [math.log(s / big) for s, big in zip(by[small], by[large]) if big > 0 and s > 0]
    mean = math.exp(statistics.fmean(logs)) if logs else None
    lo, hi = (math.exp(x) if x is not None else None for x in mean_ci95(logs))
    separated = lo is not None and (lo > 1 or hi < 1)
    if not separated:
        answer, why = small, "drift"
    elif lo > 1:
        answer, why = small, "faster"
    elif mean >= NEAR_BEST:
        answer, why = small, "within 5%"
    else:
        answer, why = large, "faster"
    other = large if answer == small else small
    flip = answer == large  # the line names the answer first: then the larger's rate over the smaller's

    def named(x: Optional[float]) -> Optional[float]:
        return (1 / x if flip else x) if x else None

    ratio, (r_lo, r_hi) = named(mean), (named(hi), named(lo)) if flip else (named(lo), named(hi))
    return {
        "pick": pick,
        "rival": rival,
        "pairs": len(logs),
        "smaller_over_larger": mean,
        "smaller_over_larger_ci95_low": lo,
        "smaller_over_larger_ci95_high": hi,
        "separated": bool(separated),
        "workers": answer,
        "why": why,
        "first": answer,
        "second": other,
        "first_over_second": ratio,
        "first_over_second_ci95_low": r_lo,
        "first_over_second_ci95_high": r_hi,
    }


def pair_columns(p: dict) -> dict:
    """The pair trial's row's own figures from its decision (:func:`pair_decision`), the pick first as the row
    names its sides: ``pair_ratio``, the pick's rate over the rival's (the geometric mean of its pairs), with its
    95% interval (``pair_ratio_ci95_low/high``: the log ratios', above 0, the decision's own flipped where the pick
    is the larger count); whether it separated the two (``pair_separated``), the count it answered
    (``pair_workers``) and why (``pair_why``: "faster", "within 5%" or "drift")."""
    ratio, lo, hi = (p.get(f"smaller_over_larger{s}") for s in ("", "_ci95_low", "_ci95_high"))
    if p["pick"] > p["rival"]:  # the decision's ratio is the smaller count's over the larger's
        ratio, lo, hi = (1 / x if x else None for x in (ratio, hi, lo))
    return {
        "pair_ratio": ratio,
        "pair_ratio_ci95_low": lo,
        "pair_ratio_ci95_high": hi,
        "pair_separated": p["separated"],
        "pair_workers": p["workers"],
        "pair_why": p["why"],
    }


def pair_words(p: dict) -> str:
    """The pair trial in words: '0 against 2 workers in alternation: 1.31x (1.22-1.41)'."""
    ratio, lo, hi = (p.get(f"first_over_second{s}") for s in ("", "_ci95_low", "_ci95_high"))
    figure = f"{ratio:.2f}x" if ratio is not None else "no ratio"
    spread = f" ({lo:.2f}-{hi:.2f})" if lo is not None else f" (no interval: {p.get('pairs', 0)} pair)"
    return f"{p['first']} against {p['second']} workers in alternation: {figure}{spread}"
