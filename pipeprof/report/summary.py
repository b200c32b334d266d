"""What a run says in words and small tables, read from what the analysis stored: the answer
sentences, the ranked actions and the workstation reviews' images/s table.

The console and the HTML report both print these, so a sentence is built in one place: the answer's
in :func:`answer`. Nothing here analyses again: every number is a stored value (each group's
``answer.Answer`` in ``run.meta["analysis"]["groups"]``, ``run.trials``), and the only arithmetic is a
ratio of two stored rates (FP16 over FP32, N GPUs over one).
"""

from __future__ import annotations

from typing import NamedTuple, Optional

import pandas as pd

from pipeprof.analysis import GROUP_KEYS, ok
from pipeprof.analysis.bounds import matching
from pipeprof.answer import Answer
from pipeprof.schema import DEFAULT_GPU_DECODER, OVERLAP_WORDS, on_gpu_pipeline, overlap_mode
from pipeprof.stats import signed_pct

VERDICT_WORDS = {
    "cpu-bound": "CPU-bound",
    "gpu-bound": "GPU-bound",
    "io-bound": "I/O-bound",
    "step-bound": "Step-bound",
    "cores-bound": "Cores-bound",
    "loader-bound": "Loader-bound",
    "input-bound": "Input-bound",
    "balanced": "Balanced",
    "unknown": "Verdict unknown",
}
ANSWER_WORDS = {
    ("input", "cores"): "Input-bound, cores full",
    ("input", "workers"): "Input-bound, too few workers",
    ("input", "handoff"): "Input-bound at the loader's hand-off",
    ("input", "storage"): "Input-bound, storage",
    ("input", "unattributed"): "Input-bound",
    ("step", "gpu"): "GPU-bound",
    ("step", "gpu-pipeline"): "GPU-bound, its decode/augment share",
    ("step", "step"): "Step-bound",
    ("step", "cores"): "Step-bound, its host side short of cores",
}
RESOURCE_WORDS = {
    "cores": "cores",
    "workers": "workers",
    "handoff": "the hand-off",
    "storage": "storage",
    "gpu": "the GPU",
    "gpu-pipeline": "the GPU's decode/augment",
    "step": "the step",
    "unattributed": "unattributed",
}
REVIEW_KEYS = ["model", "precision", "gpus"]  # the reviews' rows (``gpus`` when the run swept GPU counts)


def rate(x: Optional[float]) -> str:
    """A rate as the sentences print it: whole numbers with separators from 100 up, else 3 figures."""
    if x is None or x != x:
        return "–"
    return f"{x:,.0f}" if abs(x) >= 100 else f"{x:.3g}"


def group_label(g) -> str:
    """model precision · preset · batch · source (cache state) · shape: how a group is named everywhere
    (``g``: the group's settings, an answer's ``key`` or a trial row)."""
    where = " ".join(str(p) for p in (g.get("source"), g.get("cache_state")) if p not in (None, "n/a"))
    parts = [f"{g['model']} {g['precision']}", str(g["preset"]), f"batch {g['batch_size']}", where, shape(g)]
    return " · ".join(p for p in parts if p)


def shape(g: dict) -> str:
    """What sets a trial or group apart beyond its pipeline: inference, N GPUs (batch and workers per GPU),
    the GPUs' peer-to-peer link off, the GPU pipeline; '' for one GPU training of the workers' pipeline."""
    gpus = g.get("gpus")
    parts = [
        gpu_pipeline(g),
        "inference" if g.get("mode") == "inference" else "",
        f"{int(gpus)} GPUs" if gpus is not None and gpus == gpus and gpus > 1 else "",
        "p2p off" if g.get("p2p") is False else "",
    ]
    return ", ".join(p for p in parts if p)


def gpu_pipeline(g) -> str:
    """'GPU pipeline' where the GPU decodes and augments, with 'serial' (overlap off), 'step-first' or 'staged' and its
    decoder where not nvJPEG; '' for the workers' pipeline."""
    if not on_gpu_pipeline(g):
        return ""
    words = ["GPU pipeline", OVERLAP_WORDS.get(overlap_mode(g), "")]
    decoder = g.get("gpu_decoder")
    words.append(decoder if isinstance(decoder, str) and decoder != DEFAULT_GPU_DECODER else "")
    return " ".join(w for w in words if w)


def group_answers(run) -> list[Answer]:
    """The answers the analysis stored, one per group, in its order ([] for a run without one)."""
    return run.meta.get("analysis", {}).get("groups", [])


def _curve_row(run, a: Answer, workers: int) -> dict:
    """The stored curve row of answer ``a``'s group at ``workers`` ({} when it is not there)."""
    curves = pd.DataFrame(run.meta.get("analysis", {}).get("curves", []))
    if curves.empty or "num_workers" not in curves:
        return {}
    rows = matching(curves[curves["num_workers"] == workers], a.key, GROUP_KEYS)
    return rows.iloc[0].to_dict() if len(rows) else {}


def _interval(row: dict) -> str:
    """'± h' with h half the trial's 95% interval, or '' when it was not measured."""
    lo, hi = row.get("samples_per_s_ci95_low"), row.get("samples_per_s_ci95_high")
    if lo is None or hi is None or lo != lo or hi != hi:
        return ""
    half, mid = (hi - lo) / 2, row.get("samples_per_s")
    if mid and mid == mid and half > 0.1 * mid:  # wide: the multiplicative interval (stats.rate_bounds) as its ends
        return f" ({max(lo, 0.0):,.3g}–{hi:,.3g})"
    return f" ± {half:,.0f}" if half >= 100 else f" ± {half:.2g}"  # two figures: it is an interval


def gpu_count(g) -> int:
    """The GPUs of a group (``g``: its settings), 1 for one GPU or where it was not recorded."""
    n = g.get("gpus")
    return int(n) if n is not None and n == n and n > 1 else 1


def _cores_clause(a: Answer, device: str) -> str:
    need = a.cores_needed
    if device != "cuda" or need is None:
        return ""
    precision, n = str(a.key["precision"]).upper(), gpu_count(a.key)
    them = "this GPU" if n == 1 else f"these {n} GPUs"
    if need.cores is None:
        loaders = "one loader hands" if n == 1 else f"{n} loaders (one per GPU) hand"
        return (
            f"; no core count keeps {them} busy in {precision}: {loaders} off at most (measured) "
            f"{rate(need.handoff_limit)} samples/s (about {need.cores_to_handoff_limit} cores "
            "reach 95% of that)"
        )
    past = ", extrapolated past the workers measured" if need.extrapolated else ""
    short = (
        f", if the hand-off (measured up to {rate(need.handoff_limit)} samples/s) does not stop it short"
        if need.handoff_straddles
        else ""
    )
    return f"; about {need.cores} cores keep {them} busy in {precision}{past}{short}"


def verdict_words(a: Answer) -> str:
    """The side and the resource at the recommended count, with how often the re-draws agree, and the
    other resources within their interval of binding: 'Input-bound, cores full (88% of re-draws; also: the
    hand-off)'. Runs stored before the two-level verdict have only its one word."""
    words = ANSWER_WORDS.get((a.side, a.resource)) or (
        "Balanced" if a.side == "balanced" else VERDICT_WORDS.get(a.verdict or "unknown", a.verdict)
    )
    sure, notes = a.confidence, []
    if sure is not None and sure.draws:
        notes.append(f"{sure.answer_share:.0%} of {sure.draws} re-draws")
    also = [RESOURCE_WORDS.get(r, r) for r in a.also or []]
    if also:
        notes.append(f"also within its interval of binding: {', '.join(also)}")
    return f"{words} ({'; '.join(notes)})" if notes else words


def confidence_line(a: Answer) -> str:
    """Whether the answer holds when the windows are re-drawn; '' for a run stored without it."""
    sure = a.confidence
    if sure is None or not sure.draws:
        return ""
    lo, hi = sure.workers_low, sure.workers_high
    counts = f"num_workers {lo}" if lo == hi else f"num_workers {lo}-{hi}"
    side = f"{sure.side} side" if sure.side else "no side"
    res = f", {RESOURCE_WORDS.get(sure.resource, sure.resource)}" if sure.resource and sure.side != "balanced" else ""
    line = f"{counts} in {sure.workers_share:.0%} of re-draws of the windows; {side}{res} in {sure.answer_share:.0%}"
    pair = a.pair  # the pick against its nearest rival in alternating windows: it, not the re-draws, says the count
    if pair and pair.get("words"):
        if not pair["separated"]:
            return (
                f"num_workers {pair['first']} or {pair['second']}: within the machine's drift ({pair['words']}); "
                f"{side}{res} in {sure.answer_share:.0%} of re-draws."
            )
        close = ", within 5%: the smaller count" if pair["why"] == "within 5%" else ""
        line = f"{pair['words']}{close}; {side}{res} in {sure.answer_share:.0%} of re-draws"
    if sure.holds:
        return f"{line}: the answer holds."
    load = sure.disturbed
    if load:
        return (
            f"{line}, but the answer does not hold: other processes used up to {load['foreign_cores_max']:.2f} "
            f"cores of the run's CPUs in {load['trials']} of its {load['of']} end-to-end trials; run it again "
            "with the machine quiet."
        )
    alt = "; ".join(
        f"{a['side']} side, {RESOURCE_WORDS.get(a['resource'], a['resource'])} {a['share']:.0%}"
        for a in sure.alternatives
        if a.get("side")
    )
    alt = f" (else {alt})" if alt else ""
    return f"{line}: the answer does not hold{alt}; longer windows or a repeat would settle it."


def pair_trials(run, a: Answer) -> list[dict]:
    """The pair trials of answer ``a``'s group as run.json stored them (``pair_trials.rows``), in their order."""
    stored = (run.meta.get("pair_trials") or {}).get("rows") or []
    rows = pd.DataFrame(stored)
    if rows.empty:
        return []
    return [stored[i] for i in matching(rows, pd.Series(a.key), GROUP_KEYS).index]


def pair_trial_line(row: dict) -> str:
    """A pair trial's evidence as its row stored it: the pick and its rival, the pairs and windows, each side's
    rate, the pick's rate over the rival's with its 95% interval, and what it decided ("within the machine's
    drift" where the interval holds 1); a failed trial with its error (the sweep's answer stands)."""
    pick, rival = row.get("num_workers"), row.get("rival_workers")
    head = f"Pair trial: num_workers={pick} (the pick) against {rival} (its nearest rival)"
    if row.get("status") != "ok":
        return f"{head} ended {row.get('status')}: {str(row.get('error'))[:160]}; the sweep's answer stands."
    pairs = row.get("pairs")
    what = (
        f"{head}, {pairs} pair{'' if pairs == 1 else 's'} of alternating windows on one step ({row.get('windows')} "
        f"windows): {rate(row.get('samples_per_s'))} against {rate(row.get('baseline_samples_per_s'))} samples/s"
    )
    if "pair_ratio" not in row:  # a row stored before the pair kept its own ratio: the confidence line has it
        return f"{what}."
    ratio, lo, hi = (row.get(f"pair_ratio{s}") for s in ("", "_ci95_low", "_ci95_high"))
    if ratio is None:
        return f"{head}: no whole pair of windows fitted ({row.get('unstable_reason')}); the sweep's answer stands."
    spread = f"95% interval {lo:.2f}-{hi:.2f}" if lo is not None and hi is not None else "one pair: no interval"
    if row.get("pair_separated"):
        close = ", the smaller count within 5% of the larger" if row.get("pair_why") == "within 5%" else ""
        said = f"separated: num_workers={row.get('pair_workers')} answered{close}"
    else:
        said = f"within the machine's drift: num_workers={row.get('pair_workers')}, the smaller count, answered"
    return f"{what}, the pick's rate over the rival's {ratio:.2f}x ({spread}); {said}."


def above_bound(low: Optional[float], bound: Optional[float]) -> bool:
    """True where a rate's whole 95% interval (its ``low`` end, samples/s) lies above ``bound``: the rate
    contradicts the bound it is said to sit on."""
    return low is not None and bound is not None and low == low and bound == bound and low > bound


def answer(run, a: Answer) -> str:
    """One group's answer: its side and resource at the recommended count (with their confidence), the
    rate there with its interval, the step's ceiling, the count to set and (on a GPU) the cores it needs.
    The one place the answer is worded: the console's recommendations and the HTML report print this."""
    device = run.meta.get("config", {}).get("device", "cuda")
    w = a.workers
    row = _curve_row(run, a, w)
    verdict = verdict_words(a)
    ceiling = row.get("step_bound_samples_per_s")
    n = gpu_count(a.key)  # N GPUs: num_workers is each rank's, the rates and the ceiling the whole job's
    what = (
        ("the GPU alone takes" if n == 1 else f"the {n} GPUs alone take")
        if device == "cuda"
        else "the step on the CPU alone takes"
    )
    alone = f"; {what} {rate(ceiling)} samples/s" if ceiling is not None and ceiling == ceiling else ""
    if alone and above_bound(row.get("samples_per_s_ci95_low"), ceiling):
        # the loop beat the bound it is said to sit on, beyond its own interval: that bound did not hold in this
        # run (the step alone was measured on a busier or slower machine), and the line says so, not both figures
        alone = f"; {what} {rate(ceiling)} samples/s, below the loop's whole interval: that bound did not hold here"
    per, each = ("", "") if n == 1 else (" per GPU", " in each rank's DataLoader")
    doing = "inference" if a.key.get("mode") == "inference" else "training"
    return (
        f"{verdict}: with {w} worker{'' if w == 1 else 's'}{per} {doing} runs at "
        f"{rate(a.samples_per_s)}{_interval(row)} samples/s{alone}; set num_workers={w}"
        f"{each}{_cores_clause(a, device)}."
    )


def answers(run) -> list[tuple[str, str]]:
    """(group label, answer sentence) for every group the analysis stored, in its order."""
    return [(group_label(a.key), answer(run, a)) for a in group_answers(run)]


def answer_lines(run) -> list[str]:
    """The answers as plain lines, labelled by group when there is more than one, each followed by its
    confidence and its basis."""
    pairs = answers(run)
    failed = run.meta.get("analysis", {}).get("failures") or {}  # analysis.failures: no answer, or what it rests on
    lines = [failed["no_answer"]] if failed.get("no_answer") else []
    for (label, text), a in zip(pairs, group_answers(run)):
        lines.append(f"{label}: {text}" if len(pairs) > 1 else text)
        lines += [f"  {x}" for x in (best_action_line(a), confidence_line(a), why(a)) if x]
    return lines + ([failed["rests_on"]] if failed.get("rests_on") else [])


def why(a: Answer) -> str:
    """The evidence behind the verdict at the recommended count, as the analysis stored it."""
    return f"Why: {a.basis}." if a.basis else ""


class Action(NamedTuple):
    """A ranked action of one group as stored: its predicted rate and gain (None for a finding), and what
    its action trial measured (``measured``), or why it was not tried (``why_not_tried``)."""

    group: str
    action: str
    predicted_samples_per_s: Optional[float]
    gain_frac: Optional[float]
    within_noise: bool
    basis: str
    tried: Optional[bool] = None  # None: a run stored before action trials
    measured: bool = False
    measured_samples_per_s: Optional[float] = None
    baseline_samples_per_s: Optional[float] = None
    measured_gain_frac: Optional[float] = None
    measured_gain_ci95: tuple = (None, None)
    verified: Optional[bool] = None
    why_not_tried: Optional[str] = None
    error: Optional[str] = None
    unstable: Optional[str] = None  # why the measured gain's interval is wider than the target, else None
    gain_at_trial: Optional[float] = None  # the predicted gain read at the action trial's own baseline
    ci_level: float = 0.95  # the interval's level: all the group's trials' together (``stats.simultaneous``)


def at_trial_words(gain: Optional[float], at: Optional[float]) -> str:
    """', +48% at the trial's baseline' where an absolute prediction reads otherwise there (else '')."""
    if gain is None or at is None or round(at, 2) == round(gain, 2):
        return ""
    return f", {signed_pct(at)} at the trial's baseline"


def actions(run) -> list[Action]:
    """Every group's stored actions, in the analysis's rank order (findings first, then what was measured)."""
    return [
        Action(
            group_label(g.key),
            a["action"],
            a.get("predicted_samples_per_s"),
            a.get("gain_frac"),
            bool(a.get("within_noise")),
            a.get("basis", ""),
            a.get("tried"),
            bool(a.get("measured")),
            a.get("measured_samples_per_s"),
            a.get("baseline_samples_per_s"),
            a.get("measured_gain_frac"),
            (a.get("measured_gain_ci95_low"), a.get("measured_gain_ci95_high")),
            a.get("verified"),
            a.get("why_not_tried"),
            a.get("error") and f"{a.get('status')}: {a.get('error')}",
            a.get("unstable_reason") if a.get("unstable") else None,
            a.get("predicted_gain_at_trial_frac"),
            a.get("ci_level") or 0.95,
        )
        for g in group_answers(run)
        for a in g.actions
    ]


def gain_interval(low: Optional[float], high: Optional[float], level: float = 0.95) -> str:
    """'95% interval +3% to +9%' ('98.3% interval' where it holds for three trials together), or '' when it was
    not measured (one pair of windows)."""
    return "" if low is None or high is None else f"{100 * level:.3g}% interval {signed_pct(low)} to {signed_pct(high)}"


def best_action_line(a: Answer) -> str:
    """The best action the run measured, its gain and interval beside the baseline's rate: 'Best measured
    change: ...'; or that none was shown to help; '' when no action trial ran."""
    best = a.best_measured_action
    if not best:
        return ""
    ci = gain_interval(
        best.get("measured_gain_ci95_low"), best.get("measured_gain_ci95_high"), best.get("ci_level") or 0.95
    )
    figures = (
        f"{signed_pct(best['measured_gain_frac'])}{f' ({ci})' if ci else ''}: {rate(best['measured_samples_per_s'])}"
        f" against {rate(best['baseline_samples_per_s'])} samples/s, alternating windows at "
        f"{best.get('num_workers')} worker{'' if best.get('num_workers') == 1 else 's'}"
    )
    predicted = f"; predicted {signed_pct(best['gain_frac'])}" if best.get("gain_frac") is not None else ""
    if best.get("verified"):
        return f"Best measured change: {best['action']}, {figures}{predicted}."
    return f"No action tried was shown to help; the best measured, {best['action']}, {figures}{predicted}."


def review_table(run) -> pd.DataFrame:
    """The reviews' table: images/s per model × precision (× GPU count), the step alone in train and
    inference as measured (gpu_ceiling), the best end-to-end rate, FP16 (or BF16) over FP32 for the
    same model, mode and GPU count, and N GPUs over one. Empty without step ceilings."""
    ceil = ok(run.trials, "gpu_ceiling")
    if ceil.empty:
        return pd.DataFrame()
    keys = [k for k in REVIEW_KEYS if k in ceil]
    mode = ceil["mode"].fillna("train") if "mode" in ceil else pd.Series("train", index=ceil.index)
    table = ceil.assign(mode=mode).pivot_table(index=keys, columns="mode", values="samples_per_s", aggfunc="max")
    table = table.rename(columns=lambda m: f"{m}_samples_per_s").reset_index()
    return _ratios(_best_end_to_end(run, table, keys), keys)


def _best_end_to_end(run, table: pd.DataFrame, keys: list[str]) -> pd.DataFrame:
    """``table`` with the best end-to-end rate of the training groups of the same model, precision (and
    GPU count where both have it) beside each row: the review's end-to-end figure is a training one."""
    e2e = pd.DataFrame([a.key | {"best_samples_per_s": a.best_samples_per_s} for a in group_answers(run)])
    if e2e.empty or not {"model", "precision", "best_samples_per_s"} <= set(e2e):
        return table
    if "mode" in e2e:
        e2e = e2e[e2e["mode"].fillna("train") == "train"]
    on = [k for k in keys if k in e2e]
    best = e2e.groupby(on)["best_samples_per_s"].max().rename("end_to_end_samples_per_s").reset_index()
    return table.merge(best, on=on, how="left")


def _ratios(table: pd.DataFrame, keys: list[str]) -> pd.DataFrame:
    """Each step rate over the same model's FP32 row (``*_over_fp32``) and over N times its one-GPU row
    (``*_scaling``, 1.0 = linear)."""
    rates = [c for c in table if c.endswith("_samples_per_s") and c != "end_to_end_samples_per_s"]
    others = [k for k in keys if k != "precision"]
    fp32 = table.loc[table["precision"] == "fp32", others + rates]
    base = table.merge(fp32, on=others, how="left", suffixes=("", "_base"))
    for col in rates:
        table[col.replace("_samples_per_s", "_over_fp32")] = base[col] / base[f"{col}_base"]
    if "gpus" in keys and table["gpus"].nunique() > 1:  # one GPU count: no scaling to show
        one = table.loc[table["gpus"] == 1, ["model", "precision"] + rates]
        base = table.merge(one, on=["model", "precision"], how="left", suffixes=("", "_base"))
        for col in rates:
            table[col.replace("_samples_per_s", "_scaling")] = base[col] / (base["gpus"] * base[f"{col}_base"])
    return table
