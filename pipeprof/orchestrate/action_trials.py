"""Action trials after the answer: each change pipeprof can make to the pipeline it profiles is tried and
timed against the baseline, when the answer binds on the input side (config ``actions: measure``).

For every group of the stored analysis, ``pipeprof.actions.plan`` says which actions apply (and why the
others do not); each applicable one is tried at the recommended worker count (``trials.variants``: the variant
and the baseline in alternating windows, under the watchdog; the two largest predicted gains of a group in one
rotation, their baseline windows shared, the others one trial each), its row
(kind ``action``) goes into run.json's ``action_trials.rows``, apart from the sweep's trials.parquet (the
analysis and its counts are the sweep's), and the group's actions are stored again with the measurement
beside the prediction (``pipeprof.actions.combine``). The answer is already saved (and
printed, through ``on_answer``) before the first action trial starts.
"""

from __future__ import annotations

import math
import time
from dataclasses import fields, replace
from typing import Callable, Optional

import pandas as pd
import torch

from pipeprof.actions import ACTIONS, STORAGE, Facts, Planned, best_measured, combine, plan
from pipeprof.analysis import GROUP_KEYS
from pipeprof.analysis.bounds import curves, matching
from pipeprof.analysis.confidence import PAIR_KIND, pair_columns, pair_decision, pair_words, rival_of
from pipeprof.analysis.gains import gpu_pipeline_prediction
from pipeprof.answer import Answer
from pipeprof.data.gpu_augment import NoCounterpart, for_preset
from pipeprof.data.prepare import packed_shards
from pipeprof.data.sources import source_class
from pipeprof.measure.confounders import step_threads, torch_threads
from pipeprof.measure.monitors import Monitor, summarize
from pipeprof.measure.windows import summarize_rates
from pipeprof.stats import gain_bounds, workers_text
from pipeprof.trials import TrialContext, TrialSpec
from pipeprof.trials.action_trial import ACTION_KIND, TIMED_REGION, action_trial
from pipeprof.trials.heap import release
from pipeprof.trials.variants import baseline, run_together
from pipeprof.trials.watchdog import Leash, run_bounded

from .sweep import SETUP_MARGIN_S, failure_columns, run_one

# less left of the budget than this: no trial starts (a shorter trial gets one pair of windows, which has no
# interval: docs/measured.md)
MIN_ACTION_S = 40.0
# the two largest predicted gains share the budget (the answer's first lines name the best measured): of one
# group, they run in one rotation (their baseline windows shared) that may take all of it; else the first may
# take half of it, not all, and the second what the first left; the rest get what is left then. One rotation
# pays one trial's start instead of two, so the same budget holds more cycles
SHARED_BY = 2
BESIDE_MAX_S = 30.0  # the GPU pipeline beside the stand-in step, before the action trials: a sweep trial's windows


def run_actions(run, plan_, models: dict, loss_fn, log: Callable[[str], None], started: Optional[float] = None) -> None:
    """Plan, run and store the action trials of ``run`` (a Run with its analysis) made from ``plan_``
    (the runner's Plan), within their budget (:class:`Budget`; ``started``: the run's start, ``time.time()``).
    With ``actions: predict`` only the plans are stored (each action's why)."""
    groups = run.meta.get("analysis", {}).get("groups", [])
    facts = _facts(plan_)
    joined = curves(run.trials)  # the end-to-end rows with their bounds: the baselines, once for every group
    bases = [_baseline_row(joined, g) for g in groups]
    plans = [_plan_group(row, g, facts) for row, g in zip(bases, groups)]
    todo = _by_predicted_gain(
        [(i, spec, p) for i, (spec, planned) in enumerate(plans) for p in planned if p.why_not is None], groups
    )
    record = run.meta["action_trials"] = {"mode": facts.mode, "planned": len(todo), "rows": []}
    if todo:
        run.meta["timed_regions"][ACTION_KIND] = TIMED_REGION
    budget = Budget(plan_.cfg.measure, started)
    rows, interrupted = _run(run, plan_, todo, groups, bases, models, loss_fn, log, budget) if todo else ({}, False)
    plans = _out_of_budget(plans, todo, rows, interrupted, budget.text)
    for i, (g, (_spec, planned)) in enumerate(zip(groups, plans)):
        g.actions = combine(g.actions, planned, {key: r for (j, key), r in rows.items() if j == i})
        g.best_measured_action = best_measured(g.actions)
    record |= {"tried": len(rows), "interrupted": interrupted}
    run.save_meta()


def _by_predicted_gain(todo: list, groups: list) -> list:
    """The planned trials, the largest predicted gain first (the group's ranked actions), then the ones
    with no prediction: the budget spends itself on what is most likely to matter."""

    def rank(item) -> tuple:
        i, _, p = item
        gain = {a.get("id"): a.get("gain_frac") for a in groups[i].actions}.get(p.id)
        return (gain is None, -(gain or 0.0), i)

    return sorted(todo, key=rank)


class Budget:
    """The action trials' seconds left: ``measure.actions_max_s`` from the first one's start, and none past
    ``measure.run_max_s`` into the run (from ``started``, its start by ``time.time()``; None: no such limit)."""

    def __init__(self, measure, started: Optional[float] = None):
        self.t0, self.most = time.perf_counter(), measure.actions_max_s
        self.until = started + measure.run_max_s if started is not None and measure.run_max_s else None
        self.text = f"measure.actions_max_s = {self.most:g} s" + (
            f", none past measure.run_max_s = {measure.run_max_s:g} s into the run" if self.until else ""
        )

    def left(self) -> float:
        left = self.most - (time.perf_counter() - self.t0)
        return left if self.until is None else min(left, self.until - time.time())


def _out_of_budget(plans: list, todo: list, rows: dict, interrupted: bool, budget: str) -> list:
    """The plans with why each planned trial that did not run was left out: the budget (``budget``: its
    settings in words), when it ran out."""
    if interrupted:
        return plans  # combine says "the run was interrupted first"
    left = {(i, p.id) for i, _, p in todo if (i, p.id) not in rows}
    why = (
        f"the action trials' time budget ({budget}) was spent on the actions "
        "predicted to gain more; raise it to try this one"
    )
    return [
        (spec, [p._replace(why_not=why) if (i, p.id) in left else p for p in planned])
        for i, (spec, planned) in enumerate(plans)
    ]


def _facts(plan_) -> Facts:
    cfg = plan_.cfg
    own = "loader" if plan_.user_loader is not None else ("dataset" if plan_.user_dataset is not None else "pipeline")
    kinds = {label: s.kind for label, s in plan_.sources.items()}
    # the GPU pipeline's refusal only where it could be tried: mapping a preset imports torchvision (slow)
    only = tuple(cfg.actions) if isinstance(cfg.actions, list) else None  # a list: try only these
    mode = "measure" if only is not None else cfg.actions
    tried = mode == "measure" and (only is None or "gpu_pipeline" in only)
    refusal = _gpu_refusal(cfg) if own == "pipeline" and cfg.device == "cuda" and tried else None
    pf = cfg.loader.prefetch_factor if own != "loader" else None
    return Facts(cfg.device, own, mode, refusal, kinds, pf, only)


def _gpu_refusal(cfg) -> Optional[str]:
    """Why a preset of the run cannot run on the GPU pipeline (its unmapped transform), else None."""
    for preset in cfg.augment.preset:
        try:
            for_preset(preset, None, "cpu")
        except NoCounterpart as exc:
            return str(exc)
    return None


def _baseline_row(joined: pd.DataFrame, g: Answer) -> Optional[pd.Series]:
    """The group's end-to-end row at its recommended worker count, its bounds joined on (``joined``: the run's
    ``curves``): the baseline its actions are tried against."""
    rows = matching(joined, pd.Series(g.key), GROUP_KEYS)
    rows = rows[rows["num_workers"] == g.workers]
    return None if rows.empty else rows.iloc[0]


def _plan_group(row: Optional[pd.Series], g: Answer, facts: Facts) -> tuple[Optional[TrialSpec], list[Planned]]:
    """(the baseline's spec, the planned actions) of one group, from its baseline row (None: no trial at its
    recommended count)."""
    if row is None:
        return None, []
    planned = plan(g, row, facts)
    if int(g.key.get("gpus") or 1) > 1:  # an action trial alternates its loaders in one process: one GPU's
        planned = [
            p._replace(why_not=p.why_not or "action trials run on one GPU; this group runs on several") for p in planned
        ]
    return spec_of(row), planned


def spec_of(row: pd.Series) -> TrialSpec:
    """The TrialSpec a stored row was measured with (NaN as None, counts as ints)."""
    values = {f.name: _plain(row.get(f.name)) for f in fields(TrialSpec) if f.name in row}
    for k in ("num_workers", "batch_size", "image_size", "gpus"):
        if values.get(k) is not None:
            values[k] = int(values[k])
    return TrialSpec(**values)


def _context(plan_, monitor, models: dict, loss_fn) -> TrialContext:
    """The trials' context for the plan's settings under ``monitor`` (the action trials' and the pair's)."""
    cfg = plan_.cfg
    return TrialContext.from_config(
        cfg,
        torch.device(cfg.device),
        monitor,
        dict(plan_.sources),
        int(plan_.machine["cores"]["usable"]),
        user_dataset=plan_.user_dataset,
        user_loader=plan_.user_loader,
        loss_fn=loss_fn,
        models=models,
    )


def _run(
    run, plan_, todo: list, groups: list, bases: list, models: dict, loss_fn, log, budget: Budget
) -> tuple[dict, bool]:
    """Each planned action trial under the monitor, its row saved as it lands; ((group, id) -> row, interrupted).
    The GPU pipeline's action is first predicted from its pipeline measured beside a stand-in for the step (when
    the budget leaves a trial's worth after it), and the order set again."""
    cfg, out = plan_.cfg, {}
    with Monitor(hz=cfg.monitor_hz, gpu=cfg.device == "cuda") as monitor:
        ctx = _context(plan_, monitor, models, loss_fn)
        try:
            if budget.left() >= MIN_ACTION_S:
                todo = _predict_gpu_pipeline(run, ctx, todo, groups, bases, monitor, log, budget)
            trials = rotations(todo)
            for n, together in enumerate(trials, 1):
                left_s = budget.left()
                if left_s < MIN_ACTION_S:
                    log(
                        f"action trials: the budget ({budget.text}) is spent; "
                        f"{sum(len(t) for t in trials[n - 1 :])} not tried"
                    )
                    break
                spec = together[0][1]
                log(
                    f"action trial {n}/{len(trials)}: {' and '.join(p.action for *_, p in together)}, against the "
                    f"baseline at {workers_text(spec.num_workers)}"
                )
                share = left_s if len(together) == SHARED_BY else share_of(left_s, n, len(trials))
                capped = replace(
                    ctx, measure=ctx.measure.model_copy(update={"max_trial_s": min(ctx.measure.max_trial_s, share)})
                )
                rows = _one(
                    capped,
                    plan_,
                    spec,
                    [p for *_, p in together],
                    lambda tid, t0, t1: summarize(monitor.timeline(), tid, t0, t1),
                    log,
                )
                for (i, _, p), row in zip(together, rows):
                    out[(i, p.id)] = row
                    run.meta["action_trials"]["rows"].append(row)
                    log(_said(p, row))
                run.save_meta()  # each trial's rows as they land: an interrupted run keeps what was measured
        except KeyboardInterrupt:
            return out, True
    return out, False


def _predict_gpu_pipeline(
    run, ctx: TrialContext, todo: list, groups: list, bases: list, monitor, log, budget: Budget
) -> list:
    """Before the action trials: the GPU pipeline beside a stand-in for the step (its cpu_pipeline trial:
    workers reading bytes, the GPU decoding and augmenting, and busy the step's own time before each batch:
    ``trials.device_side.StandIn``) for each group that will try it, so that its action gets a predicted gain
    like the others (``advice.gpu_pipeline_prediction``) and its place in the order by it. Its rows are kept
    in run.json's ``action_trials.gpu_pipeline_alone`` (the name of the runs before the stand-in); the todo
    list comes back in the new order."""
    for i, spec, p in todo:
        base = bases[i] if p.id == "gpu_pipeline" else None
        step = base.get("step_bound_samples_per_s") if base is not None else None
        if step is None or step != step:  # no step ceiling measured: nothing to set the pipeline beside
            continue
        # the settings its action trial runs with, but serial: the stand-in (a spin kernel) holds none of the SMs a
        # step holds, so beside it an overlapped pipeline would read as free; in turn with it, it reads the two
        # costs added, a lower bound for the overlapped action, which its trial then measures with the real step
        gpu = ACTIONS["gpu_pipeline"].params(base, None) | {"augment_overlap": False, "staged": None}
        beside = replace(spec, kind="cpu_pipeline", model=None, precision=None, mode=None, **gpu)
        stand_in_s = spec.batch_size / step  # the step's own time a batch, from its ceiling
        log(
            f"the GPU pipeline at {workers_text(beside.num_workers)} (they read bytes), beside a stand-in for the step "
            f"({stand_in_s * 1e3:.1f} ms a batch), to predict its action"
        )
        capped = replace(
            ctx,
            stand_in_step_s=stand_in_s,
            measure=ctx.measure.model_copy(
                update={
                    "max_trial_s": min(ctx.measure.max_trial_s, BESIDE_MAX_S, max(budget.left() - MIN_ACTION_S, 5.0))
                }
            ),
        )
        row = {
            k: _plain(v)
            for k, v in run_one(capped, beside, lambda tid, t0, t1: summarize(monitor.timeline(), tid, t0, t1)).items()
        }
        run.meta["action_trials"].setdefault("gpu_pipeline_alone", []).append(row)
        if row.get("status") != "ok" or not row.get("samples_per_s"):
            log(f"  the GPU pipeline beside the stand-in: {row.get('status')}: {str(row.get('error'))[:200]}")
            continue
        actions = groups[i].actions
        entry = next((a for a in actions if a.get("id") == "gpu_pipeline"), None)
        if entry is None:  # the sweep's advice named no GPU pipeline (no decode share): it is planned all the same
            entry = {"id": "gpu_pipeline", "action": p.action}
            actions.append(entry)
        entry.update(gpu_pipeline_prediction(base, row))
        log(
            f"  the GPU pipeline beside the stand-in: {row['samples_per_s']:,.0f} samples/s, its predicted rate end "
            f"to end ({entry['gain_frac']:+.0%})"
        )
    return _by_predicted_gain(todo, groups)


def share_of(left_s: float, n: int, count: int) -> float:
    """The time trial ``n`` (from 1) of ``count`` may take of the ``left_s`` seconds left: the first of the
    top two half, the second (and each after it) all that is left then."""
    return left_s / (SHARED_BY - n + 1) if n < SHARED_BY and count > n else left_s


def rotations(todo: list) -> list[list]:
    """The planned trials as they run: the two largest predicted gains together in one rotation
    (``trials.action_trial.action_trials``: their baseline windows shared) where they are of one group (one baseline),
    each other action in a trial of its own."""
    if len(todo) >= SHARED_BY and len({i for i, *_ in todo[:SHARED_BY]}) == 1:
        return [todo[:SHARED_BY]] + [[t] for t in todo[SHARED_BY:]]
    return [[t] for t in todo]


def _one(ctx: TrialContext, plan_, spec: TrialSpec, planned: list[Planned], summarize_monitor, log) -> list[dict]:
    """One action trial's rows, one per action in ``planned`` (one or two, in one rotation): settings, status and
    error, the paired figures and the monitor's summary."""
    t0 = time.perf_counter()
    specs = [replace(spec, kind=ACTION_KIND, action=p.id) for p in planned]
    threads = step_threads("end_to_end", ctx.device.type, ctx.cores, spec.num_workers, ctx.step_threads)
    rows = [
        s.columns() | {"status": "ok", "error": None, "action_label": p.action, "step_threads": threads}
        for s, p in zip(specs, planned)
    ]
    try:
        ctx_ = ctx
        for p in planned:
            ctx_ = _with_source(ctx_, plan_, specs[0], p, log)
        leash = Leash(ctx_.monitor, ctx_.clock)
        watched = replace(ctx_, monitor=leash, clock=leash.clock)

        def body() -> list[dict]:
            with torch_threads(threads):
                return run_together(watched, specs[0], [(p.id, p.params) for p in planned])

        measured = run_bounded(
            body, leash, 2 * ctx.measure.max_trial_s + SETUP_MARGIN_S, f"action trial {specs[0].trial_id}"
        )
        for row, got, p in zip(rows, measured, planned):
            # the monitor tagged the rotation's samples with its first action's trial id
            row |= got | {
                "timeline_trial_id": specs[0].trial_id,
                "rotated_with": ", ".join(q.id for q in planned if q is not p) or None,
            }
            seen = summarize_monitor(specs[0].trial_id, row.get("t_measure_start_s"), row.get("t_measure_end_s"))
            row |= {k: v for k, v in seen.items() if row.get(k) is None}
    except KeyboardInterrupt:
        raise
    except Exception as exc:  # a variant that cannot run is a row with its error, never a crashed run
        rows = [row | failure_columns(exc, ctx.device) for row in rows]
    finally:
        ctx.monitor.set_trial(None)
        release(ctx.device)
    trial_s = time.perf_counter() - t0
    return [{k: _plain(v) for k, v in (row | {"trial_s": trial_s}).items()} for row in rows]


def _plain(v):
    """A value run.json stores as itself: numpy scalars as Python numbers and bools, NaN as null."""
    v = v.item() if hasattr(v, "item") and not isinstance(v, (list, dict)) else v
    return None if isinstance(v, float) and math.isnan(v) else v


def _with_source(ctx: TrialContext, plan_, spec: TrialSpec, p: Planned, log) -> TrialContext:
    """The context with the storage a storage action reads (the dataset in RAM, or packed into shards)."""
    if ACTIONS[p.id].scope != STORAGE:
        return ctx
    files = ctx.source_for(spec)
    if p.id == "memory":
        made = source_class("memory")(files)
    else:
        root = getattr(files, "root", None)
        if root is None:
            raise ValueError(f"packing into shards needs a folder of files; the source is {files.kind}")
        made = source_class("shards")(packed_shards(root, plan_.cfg.data.cache_dir, None, plan_.cfg.data.seed, log))
    return replace(ctx, sources={**ctx.sources, p.params["source"]: made})


def _said(p: Planned, row: dict) -> str:
    if row.get("status") != "ok":
        return f"  {p.action}: {row.get('status')}: {str(row.get('error'))[:200]}"
    if row.get("action_gain_frac") is None:
        return f"  {p.action}: no whole pair of windows fitted ({row.get('unstable_reason')})"
    # the trial stores its pairs' mean gain and symmetric interval: said by the rule of ratios, never below -100%
    lo, hi = gain_bounds(row["action_gain_frac"], row.get("action_gain_ci95_low"), row.get("action_gain_ci95_high"))
    ci = f" (95% interval {lo:+.1%} to {hi:+.1%})" if lo is not None else ""
    unstable = f"; unstable: {row['unstable_reason']}" if row.get("unstable") else ""
    return (
        f"  {p.action}: {row['samples_per_s']:,.1f} vs {row['baseline_samples_per_s']:,.1f} samples/s, "
        f"{row['action_gain_frac']:+.1%}{ci}{unstable}"
    )


# The answer's pair trial (analysis.confidence.pair_decision): the pick and its nearest rival alternate windows
# on one step, so the machine's drift between the sweep's trials (seconds apart; a 0-worker step uses every core
# and moves most) falls on both. Windows of 0.75 s (the sweep's own): its end-to-end windows on the 2-core machine
# spread by ~5% (CV), a pair's ratio by ~7%, so 4 pairs separate about 11% (t(3) x 7% / √4), and up to 6 (while
# the ratio's interval is wider than ± measure.ci_target) about 7%; a closer pair is "within the machine's drift".
# PAIR_MAX_S keeps the default run inside a minute on the 2-core machine: at 25 s its pair took 22.7 s of a 75 s run
# (docs/measuring.md)
PAIR_WINDOW_S = 0.75
PAIR_PAIRS, PAIR_MAX_PAIRS = 4, 6
PAIR_MAX_S = 12.0  # the whole trial, both loaders' starts included
PAIR_TIMED_REGION = (
    "the answer's num_workers (side A) and its nearest rival (side B: the other measured count whose end-to-end "
    "median rate is closest to the pick's) as two running loaders on one step, in ABBA windows (as the action "
    "trials: the side not timed has its workers stopped, each side first runs untimed, one worker round drained "
    "after each switch; each side's step has the intra-op threads the sweep gave it at its count); windows of at "
    "least 1 s, 4 pairs planned and more up to 8 while the ratio's 95% CI is wider than ± measure.ci_target, none "
    "past 25 s from the trial's start; ratio = smaller count's rate / larger count's, per pair of windows, mean "
    "and 95% CI; window_rates are the pick's windows, baseline_window_rates the rival's; pair_ratio = the pick's "
    "rate over the rival's (the same pairs' geometric mean and 95% CI); no action gain"
)


def confirm_answers(run, plan_, models: dict, loss_fn, log: Callable[[str], None]) -> None:
    """Each one-GPU group's pick against its nearest rival in one pair trial (:data:`PAIR_TIMED_REGION`); the
    group's answer set from the pair (``analysis.confidence.pair_decision``) and stored with it (``pair``); the
    trial's row in run.json's ``pair_trials``. Nothing where the group measured one count."""
    groups = run.meta.get("analysis", {}).get("groups", [])
    joined = curves(run.trials)
    todo = []
    for g in groups:
        rows = matching(joined, pd.Series(g.key), GROUP_KEYS) if len(joined) else joined
        rates = {int(r["num_workers"]): r["samples_per_s"] for _, r in rows.iterrows() if r.get("status") == "ok"}
        rival = rival_of(rates, g.workers)
        if rival is not None and int(g.key.get("gpus") or 1) == 1:
            todo.append((g, rows, rival))
    if not todo:
        return
    record = run.meta["pair_trials"] = {"rows": []}
    run.meta["timed_regions"][PAIR_KIND] = PAIR_TIMED_REGION
    cfg = plan_.cfg
    with Monitor(hz=cfg.monitor_hz, gpu=cfg.device == "cuda") as monitor:
        ctx = _context(plan_, monitor, models, loss_fn)
        ctx = replace(
            ctx,
            measure=ctx.measure.model_copy(
                update={
                    "action_window_s": PAIR_WINDOW_S,
                    "action_pairs": PAIR_PAIRS,
                    "action_max_pairs": PAIR_MAX_PAIRS,
                    "max_trial_s": min(ctx.measure.max_trial_s, PAIR_MAX_S),
                }
            ),
        )
        for g, rows, rival in todo:
            log(f"pair trial: {g.workers} against {rival} workers in alternating windows")
            row = _pair_trial(ctx, spec_of(rows[rows["num_workers"] == g.workers].iloc[0]), rival, monitor)
            if row["status"] != "ok":
                record["rows"].append(row)
                continue
            p = pair_decision(g.workers, rival, row["window_rates"], row["baseline_window_rates"])
            record["rows"].append(row | pair_columns(p))  # the row says its ratio, as the decision read it
            p |= {"trial_id": row["trial_id"], "words": pair_words(p)}
            if p["workers"] != g.workers:  # the pair overrules the sweep's pick: the answer's rate is the new count's
                at = rows[rows["num_workers"] == p["workers"]].iloc[0]
                g.workers, g.samples_per_s = p["workers"], float(at["samples_per_s"])
                g.criterion = f"{g.criterion}; set by the pair trial ({p['words']})"
            g.pair = p
            run.save_meta()


def _pair_trial(ctx: TrialContext, spec: TrialSpec, rival: int, monitor) -> dict:
    """The pair trial's row: the pick's settings (kind ``pair``, ``action`` the rival), status, the paired
    figures, the pick's first (:func:`pair_row`), and the monitor's summary."""
    pair = replace(spec, kind=PAIR_KIND, action=f"num_workers={rival}")
    row = pair.columns() | {"status": "ok", "error": None, "rival_workers": rival}
    t0 = time.perf_counter()

    def threads(w: int) -> Optional[int]:
        return step_threads("end_to_end", ctx.device.type, ctx.cores, w, ctx.step_threads)

    try:
        leash = Leash(ctx.monitor, ctx.clock)
        watched = replace(ctx, monitor=leash, clock=leash.clock)
        sides = [
            baseline(watched, replace(spec, num_workers=w))._replace(num_workers=w, threads=threads(w))
            for w in (spec.num_workers, rival)
        ]

        def body() -> dict:
            with torch_threads(threads(spec.num_workers)):  # restored after: the sides set theirs at each turn
                return action_trial(watched, pair, sides[0], sides[1])

        got = run_bounded(body, leash, 2 * ctx.measure.max_trial_s + SETUP_MARGIN_S, f"pair trial {pair.trial_id}")
        row |= pair_row(got) | {"timeline_trial_id": pair.trial_id}
        seen = summarize(monitor.timeline(), pair.trial_id, row.get("t_measure_start_s"), row.get("t_measure_end_s"))
        row |= {k: v for k, v in seen.items() if row.get(k) is None}
    except KeyboardInterrupt:
        raise
    except Exception as exc:  # a pair that cannot run leaves the sweep's answer as it was, its row says why
        row |= failure_columns(exc, ctx.device)
    finally:
        ctx.monitor.set_trial(None)
        release(ctx.device)
    return {k: _plain(v) for k, v in (row | {"trial_s": time.perf_counter() - t0}).items()}


# action_trial's columns that mean an action's gain (its variant's rate over its baseline's, less one): the pair's
# variant is the rival, so they would read as the rival's "gain" over the pick; the pair's ratio is its own
_ACTION_GAIN = ("action_gain_frac", "action_gain_ci95_low", "action_gain_ci95_high")
_CLOCKS = ("stage_us_per_sample.", "worker_us_per_sample")


def pair_row(got: dict) -> dict:
    """The pair trial's figures from ``trials.action_trial.action_trial``'s columns, which name the rival (its
    variant) A and the pick (its baseline) B: stored as the row names them, the pick's rate, interval, windows and
    stage clocks unprefixed, the rival's as ``baseline_*``; none of the action-gain columns (the pair's ratio is
    ``analysis.confidence.pair_columns``'s, from the decision); the unstable reason of its ratio, not a gain."""
    pick, rival = list(got["baseline_window_rates"]), list(got["window_rates"])
    clocks = {k: v for k, v in got.items() if k.startswith(_CLOCKS)}
    pick_clocks = {k: v for k, v in got.items() if k.startswith(tuple(f"baseline_{c}" for c in _CLOCKS))}
    mine, theirs = summarize_rates(pick), summarize_rates(rival)
    out = {k: v for k, v in got.items() if k not in (*_ACTION_GAIN, *clocks, *pick_clocks)}
    reason = out.get("unstable_reason")
    reason = reason.replace("the gain's 95% interval", "the ratio's 95% interval") if reason else reason
    return (
        out
        | mine
        | {k.removeprefix("baseline_"): v for k, v in pick_clocks.items()}
        | {f"baseline_{k}": v for k, v in clocks.items()}
        | {
            "window_rates": pick,
            "baseline_window_rates": rival,
            "baseline_samples_per_s": theirs["samples_per_s"],
            "baseline_ci95_low": theirs["samples_per_s_ci95_low"],
            "baseline_ci95_high": theirs["samples_per_s_ci95_high"],
            "unstable_reason": reason,
        }
    )
