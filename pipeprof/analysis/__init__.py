"""Pure analysis of a sweep's trials: no I/O, no printing, no plotting.

Input is the trials DataFrame of a run (one row per trial, see ``results``) and a
few machine facts; outputs are DataFrames, plain dicts and, per group, an ``answer.Answer``
that renderers format and run.json stores. One module per question, :func:`analyse` the facade:

- ``bounds``:  :func:`curves` (each end-to-end trial beside the bounds measured alone at the
  same settings), :func:`predict` (the rate those bounds allow), :func:`classify` (their verdict)
- ``verdict``: :func:`verdicts` (each trial's own evidence first: data wait, busy cores, workers'
  CPU; the isolated bounds beside it, and where the two disagree)
- ``advice``:  :func:`recommend_workers`, :func:`cores_needed`, :func:`what_if` (read off the
  measured CPU curve), :func:`stage_overhead`
- ``gains``: :func:`predicted_actions` (each action of ``pipeprof.actions`` predicted from the run's figures:
  CPU work, the hand-off, storage swaps measured in the run), ranked
- ``storage``: :func:`storage_limited` (a curve that ran at the storage's pace), :func:`epoch_estimates`
  (cold first epoch vs warm later ones)
- ``scaling``: :func:`scaling` (N GPUs against one: efficiency, exposed all-reduce, the p2p link)
- ``confidence``: :func:`confidence` (the answer re-computed over re-drawn windows: how often it holds)
- ``compare``: :func:`compare` (several runs' matching trials side by side, ratios, within-noise)
- ``workstation``: ``pipeprof size``: candidate machines' predicted rates for the runs' workloads, with
  intervals (extrapolation widened by the curve's fall-off), price per sample, the cheapest reaching a target
- ``offload``: ``pipeprof size --offload``: the remote cores and nodes that feed G GPUs a training node, from a Ray
  run and a DataLoader run (each remote CPU's rate, the link, the ingest; the binding limit)
- ``guard``: the CI guard of ``compare --fail-if-slower`` (a new run slower than its base beyond a threshold
  and the two runs' noise, the machines' drift taken into the interval)
- ``failures``: :func:`failures` (which trials failed; no answer when every trial of a kind it needs did)

May import: the nouns (``schema``, ``config``, ``answer``) and ``trials.columns``' pure helpers; never ``measure``,
``orchestrate`` or ``report``.
"""

from __future__ import annotations

import math

import pandas as pd

from pipeprof.answer import Answer, Confidence, CoresNeeded, Recommendation

from .advice import (
    cores_needed,
    monitor_overhead,
    rate_at_workers,
    rate_for_cores,
    recommend_workers,
    stage_overhead,
    what_if,
    workers_for_rate,
)
from .bounds import (
    BALANCED,
    BOUND_COLUMN,
    BOUND_KEYS,
    GROUP_KEYS,
    NEAR_BEST,
    classify,
    cores_curve,
    cpu_at,
    cpu_curve,
    curves,
    figures,
    groups,
    handoff_interval,
    handoff_limit,
    load_cost_s,
    ok,
    predict,
    present_group_keys,
    step_verdict,
    worker_capacity,
)
from .confidence import DRAWS, confidence, disturbed, group_id
from .failures import failures
from .gains import predicted_actions
from .scaling import scaling
from .storage import epoch_estimates, storage_limited
from .verdict import at_recommended, evidence, verdicts

__all__ = [
    "BALANCED",
    "BOUND_COLUMN",
    "BOUND_KEYS",
    "GROUP_KEYS",
    "NEAR_BEST",
    "analyse",
    "classify",
    "cores_needed",
    "cpu_at",
    "cpu_curve",
    "curves",
    "data_problems",
    "epoch_estimates",
    "evidence",
    "groups",
    "handoff_interval",
    "handoff_limit",
    "monitor_overhead",
    "load_cost_s",
    "main_cpu_s_per_sample",
    "ok",
    "predict",
    "present_group_keys",
    "rate_at_workers",
    "rate_for_cores",
    "recommend_workers",
    "stage_overhead",
    "predicted_actions",
    "step_verdict",
    "verdicts",
    "what_if",
    "worker_capacity",
    "workers_for_rate",
]

# ---- the whole run -----------------------------------------------------------------


def analyse(
    trials: pd.DataFrame,
    cores: float = 1.0,
    device: str = "cuda",
    storage: dict | None = None,
    decode_costs: dict | None = None,
    draws: int = DRAWS,
) -> dict:
    """Everything run.json's ``analysis`` holds: verdicts, accuracy, recommendations per group, the
    curve rows the report prints, and (with the run's ``storage`` facts) the epoch estimates. The one
    entry point of the analysis: renderers print what it returned and never call it again.

    ``cores``: usable cores of the run; ``device``: 'cuda' or 'cpu' (words and sizing differ); ``draws``:
    re-draws of the windows for the answer's confidence (``measure.redraws``; 0: none);
    ``decode_costs``: both CPU decoders timed on the run's files (``measure.decoders``), for the decoder action.
    """
    joined = curves(trials)
    v = verdicts(trials, cores, device, joined) if len(ok(trials, "end_to_end")) else pd.DataFrame()
    sure = confidence(trials, cores, device, draws) if len(v) and draws else {}
    out = []
    for key, curve in groups(joined):
        cpu = cpu_curve(trials, curve.iloc[0])  # a CpuCurve (workers, rates)
        pick = Recommendation.from_dict(recommend_workers(curve))
        advice = _group_advice(trials, curve, cpu, v, cores, device, pick.workers, decode_costs)
        if storage_limited(curve):  # its cpu_pipeline curve measured the storage: no CPU figures from it
            advice |= {
                "cores_needed": None,
                "what_if": None,
                "cpu_figures_skipped": (
                    f"the pipeline ran at the storage's pace (cpu_pipeline within "
                    f"{2 * BALANCED:.0%} of storage_fetch at every worker count): cores "
                    "needed and what-if need a pipeline that is not waiting on storage"
                ),
            }
        out.append(Answer.from_parts(key, pick, confidence=_with_load(sure.get(group_id(key)), curve), **advice))
    errors = v["prediction_error_frac"].dropna().abs() if len(v) else pd.Series(dtype=float)
    failed = trials[trials["status"] != "ok"] if "status" in trials else trials.iloc[0:0]
    epochs = (
        epoch_estimates(trials, storage["dataset_samples"], storage["fits_in_page_cache"]["fits"]) if storage else []
    )
    return {
        "groups": out,
        "verdicts": v.to_dict("records") if len(v) else [],
        "curves": curve_rows(joined, v),
        "epochs": epochs,
        "prediction_error_abs_median": float(errors.median()) if len(errors) else None,
        "stage_timing_overhead": stage_overhead(trials),
        "monitor_overhead": monitor_overhead(trials),
        "scaling": scaling(trials),
        "cores": cores,
        "device": device,
        "trials": int(len(trials)),
        "failed_trials": int(len(failed)),
        "failures": failures(trials),
        **_unstable(trials),
        **data_problems(trials),
    }


def _with_load(sure: dict | None, curve: pd.DataFrame) -> Confidence | None:
    """The group's confidence, not holding where other processes' load was flagged in its trials."""
    load = disturbed(curve)
    return Confidence.from_dict(sure if not sure or load is None else sure | {"holds": False, "disturbed": load})


def data_problems(trials: pd.DataFrame) -> dict:
    """Per trial, the bad samples it skipped and the outsize images it met, as the rows recorded them."""
    out = {}
    for count, cols in (
        ("bad_samples", ["bad_samples_frac", "bad_samples_first"]),
        ("large_images", ["large_images_cost_frac", "large_images_first"]),
    ):
        hit = trials[trials[count].fillna(0) > 0] if count in trials else trials.iloc[0:0]
        rows = hit[[c for c in ["trial_id", "status", count, *cols] if c in hit]]
        out[count] = rows.astype(object).where(rows.notna(), None).to_dict("records")
    return out


CURVE_ROW_COLUMNS = [
    "trial_id",
    "num_workers",
    "samples_per_s",
    "samples_per_s_cv",
    "samples_per_s_ci95_low",
    "samples_per_s_ci95_high",
    "data_wait_frac",
    "gpu_util_pct_mean",
    "cpu_util_pct_mean",
    "pss_mb_steady",
    "cpu_bound_samples_per_s",
    "io_bound_samples_per_s",
    "step_bound_samples_per_s",
    "status",
    "error",
    "unstable",
    "unstable_reason",
    "cache_note",
    "emulated",
    *GROUP_KEYS,
]


def curve_rows(joined: pd.DataFrame, v: pd.DataFrame) -> list[dict]:
    """The end-to-end rows the report's curve tables print: each trial beside its bounds, verdict,
    prediction and disagreement, as stored (the report never joins or analyses again)."""
    if joined.empty:
        return []
    rows = joined[[c for c in CURVE_ROW_COLUMNS if c in joined]]
    if len(v):
        rows = rows.merge(
            v[["trial_id", "verdict", "predicted_samples_per_s", "prediction_error_frac", "disagreement"]],
            on="trial_id",
            how="left",
        )
    return rows.astype(object).where(rows.notna(), None).to_dict("records")


def _unstable(trials: pd.DataFrame) -> dict:
    """How many trials were flagged unstable, and their reasons counted by attributed cause."""
    if "unstable" not in trials:
        return {"unstable_trials": 0, "unstable_causes": {}}
    flagged = trials[trials["unstable"].astype("boolean").fillna(False)]
    causes = flagged.get("noise_cause", pd.Series(dtype=object)).fillna("unattributed").value_counts()
    return {"unstable_trials": int(len(flagged)), "unstable_causes": {str(k): int(n) for k, n in causes.items()}}


def main_cpu_s_per_sample(curve: pd.DataFrame) -> float:
    """CPU seconds the training process spends per sample in the real loop (median over the
    end-to-end trials); else its CPU in the step ceiling at the ceiling's rate; else one core at it.
    Per sample, because it receives, copies and launches per batch: fed more slowly, it uses less."""
    if "main_cpu_pct_mean" in curve:  # 0 workers: the main process loads too, not a training-only figure
        fed = curve[curve["num_workers"] > 0]
        per = (figures(fed["main_cpu_pct_mean"]) / 100 / fed["samples_per_s"]).dropna()
        if len(per):
            return float(per.median())
    step = curve["step_bound_samples_per_s"].dropna()
    main = curve["main_cores_step"].dropna() if "main_cores_step" in curve else pd.Series(dtype=float)
    if len(step):
        return (float(main.iloc[0]) if len(main) else 1.0) / float(step.iloc[0])
    return 0.0


def _group_advice(
    trials: pd.DataFrame,
    curve: pd.DataFrame,
    cpu: tuple,
    v: pd.DataFrame,
    cores: float,
    device: str,
    workers: int,
    decode_costs: dict | None = None,
) -> dict:
    """The :class:`Answer`'s fields beyond the recommendation (``workers``: the recommended count), by name."""
    ws, rates = cpu
    step = curve["step_bound_samples_per_s"].dropna()
    main_s = main_cpu_s_per_sample(curve)
    best = curve.loc[curve["samples_per_s"].idxmax()]
    mine = v[v["trial_id"].isin(curve["trial_id"])] if len(v) else v
    advice = {
        "actions": predicted_actions(best, ws, rates, cores, device, decode_costs, trials),
        "main_cpu_s_per_sample": main_s,
    }
    on_gpu = "augment_device" in curve and (curve["augment_device"] == "cuda").any()
    if device != "cuda":
        advice["cpu_figures_skipped"] = (
            "no GPU: the step runs on the same cores as the workers, so cores per GPU "
            "and the what-if for GPU machines do not apply; run on the GPU machine"
        )
    elif on_gpu:  # the loader's curve measured the GPU's decode and augment, not what cores deliver
        advice["cpu_figures_skipped"] = (
            "the pipeline decodes and augments on the GPU (augment.device: cuda): its "
            "workers only read bytes, so its curve does not say how many cores feed it"
        )
    if device == "cuda" and not on_gpu and len(ws) and (ws > 0).any() and len(step):
        # N ranks: num_workers is per rank and each rank's main process hands off its own batches,
        # so the workers and the hand-off limit of the whole job are N times a rank's
        ranks = int(curve.iloc[0].get("gpus") or 1) if "gpus" in curve else 1
        low, cap = (x * ranks for x in handoff_interval(trials, curve.iloc[0]))
        # the cores its workers had for each count (bounds.worker_cores): the questions of cores read cores
        ws = ws * ranks if ranks > 1 else cores_curve(trials, curve.iloc[0], cores).workers
        advice["cores_needed"] = CoresNeeded.from_dict(
            cores_needed(float(step.iloc[0]), ws, rates, main_s, cores, cap, low if low < math.inf else None)
        )
        advice["what_if"] = what_if(
            float(step.iloc[0]), ws, rates, main_s, cores, _io_mb_s(curve), _sample_mb(curve), cap=cap
        )
    rec = at_recommended(mine, workers)
    if rec is not None:
        advice |= {
            "verdict": rec["verdict"],
            "side": rec["side"],
            "resource": rec["resource"],
            "also": rec["also"],
            "basis": rec["verdict_basis"],
        }
    return advice


def _io_mb_s(curve: pd.DataFrame) -> float | None:
    col = curve.get("io_bound_samples_per_s")
    size = _sample_mb(curve)
    if col is None or size is None or col.dropna().empty:
        return None
    return float(col.dropna().max()) * size


def _sample_mb(curve: pd.DataFrame) -> float | None:
    if "mean_sample_kb" in curve and curve["mean_sample_kb"].notna().any():
        return float(curve["mean_sample_kb"].dropna().iloc[0]) / 1e3
    return None
