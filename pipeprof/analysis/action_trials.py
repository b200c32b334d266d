"""Action trials, the pure part: which changes a run can try on its own pipeline, and what the measured
trials say beside the predictions.

:func:`plan` picks, for one group's answer, the actions that apply to the resource that binds (and to
those within their interval of binding): the other decoder, uint8 batches, decoding and augmenting on the
GPU where the workers' CPU binds; the data in RAM or in shards where storage binds; pinning and prefetch
depth where the hand-off binds, persistent workers where the loader restarts its workers. Each action
not tried carries why. :func:`combine` puts the measured gain (``trials.actions`` rows) beside the
prediction (``advice.actions``) and says whether it was verified; :func:`best_measured` names the best.
"""
from __future__ import annotations

from typing import NamedTuple, Optional

import pandas as pd

from .verdict import FROM_BOUNDS, INPUT_SIDE

#: action id -> what the variant is, in the report's words
LABELS = {"decoder": "decode with {decoder} instead of {was} (data.decoder: {decoder})",
          "uint8": "send uint8 batches, normalise on the GPU (preset without Normalize)",
          "gpu_pipeline": "decode (nvJPEG) and augment on the GPU (augment.device: cuda): workers only read",
          "memory": "cache the dataset in RAM (source: memory)",
          "shards": "pack the files into tar shards and read them sequentially (source: shards)",
          "pin_memory": "pin_memory={pin_memory}", "prefetch_factor": "prefetch_factor={prefetch_factor}",
          "persistent_workers": "persistent_workers=True"}
#: the resources each action can relieve (verdict's input-side resources)
RELIEVES = {"decoder": {"workers", "cores", "unattributed"}, "uint8": {"workers", "cores", "unattributed", "handoff"},
            "gpu_pipeline": {"workers", "cores", "unattributed", "handoff"}, "memory": {"storage"},
            "shards": {"storage"}, "pin_memory": {"handoff"}, "prefetch_factor": {"handoff", "startup"},
            "persistent_workers": {"startup"}}
PIPELINE_ACTIONS = ("decoder", "uint8", "gpu_pipeline", "memory", "shards")
#: why a predicted action that pipeprof cannot apply itself stays a prediction
CANNOT = {"stage": "pipeprof cannot drop a transform from the preset: edit it and run again",
          "workers": "a worker count past the ones measured: set it and run again",
          "faster_storage": "needs other storage than this machine has",
          "workers_latency": "a worker count past the ones measured: set it and run again"}


class Facts(NamedTuple):
    """What the run knows of its pipeline, for planning (filled by the orchestration)."""

    device: str  # the run's device: 'cuda' or 'cpu'
    own: str  # 'pipeline' (pipeprof's), 'dataset' (a user's Dataset in pipeprof's loader) or 'loader' (the user's)
    mode: str = "measure"  # config ``actions``
    gpu_refusal: Optional[str] = None  # why the preset cannot run on the GPU (None: it can)
    source_kinds: dict = {}  # source label -> its storage layout (files, memory, shards, url)
    prefetch_factor: Optional[int] = None  # the loader's (config loader.prefetch_factor); None: a user's DataLoader's own
    only: Optional[tuple] = None  # config ``actions`` as a list: only these action ids are tried


class Planned(NamedTuple):
    id: str
    action: str  # in words, with the value it sets
    params: dict  # what the variant changes (trials.actions.VARIANTS reads it)
    why_not: Optional[str] = None  # None: tried


def input_side(group: dict) -> bool:
    """The answer binds on the input side, or may: a balanced answer (neither side binds clearly) leaves room
    for an input-side change up to the step (the two-level verdict's side; a run stored before it: its word)."""
    side = group.get("side_at_recommended")
    return side in ("input", "balanced") if side is not None else group.get("verdict_at_recommended") in INPUT_SIDE


def binding(group: dict, row: pd.Series) -> set[str]:
    """The input resources an action may relieve: the answer's, those within their interval of binding (for a
    balanced answer, the input resources its re-draws named, else the workers), and ``startup`` when the loader
    restarted its workers inside the trial (passes that end)."""
    resource = group.get("resource_at_recommended")
    resource = resource if isinstance(resource, str) else None  # a balanced answer names none (None, or NaN read back)
    found = {resource, *(group.get("also_at_recommended") or [])}
    if group.get("side_at_recommended") == "balanced":
        alternatives = (group.get("confidence") or {}).get("alternatives") or []
        found |= {a.get("resource") for a in alternatives if a.get("side") == "input"} or {"workers"}
    elif resource is None:  # a run stored before the two-level verdict
        found |= {(FROM_BOUNDS | {"cores-bound": "cores"}).get(group.get("verdict_at_recommended"), "workers")}
    if (row.get("loader_restarts") or 0) > 0:
        found.add("startup")
    return {f for f in found if isinstance(f, str) and f}


def plan(group: dict, row: pd.Series, facts: Facts) -> list[Planned]:
    """Every action that could apply to this pipeline, each tried (``why_not`` None) or with why it is not."""
    out = []
    for key in LABELS:
        params = _params(key, row, facts)
        if params is None:
            continue
        was = row.get("decoder") if isinstance(row.get("decoder"), str) else "the dataset's own"
        words = LABELS[key].format(was=was, **params)
        out.append(Planned(key, words, params, _why_not(key, group, row, facts)))
    return out


def _params(key: str, row: pd.Series, facts: Facts) -> Optional[dict]:
    """What the variant sets; None where the action does not exist for this pipeline (it is what runs)."""
    decoder, source = row.get("decoder"), row.get("source")
    if key == "decoder":
        return {"decoder": "cv2" if decoder == "pil" else "pil"}
    if key in ("memory", "shards"):  # shards are packed from a folder of files; RAM holds any source
        there = facts.source_kinds.get(source)
        packable = there in (None, "files")  # None: a user's data, refused below with its reason
        return None if there == key or (key == "shards" and not packable) else {"source": f"{key}-action"}
    if key == "pin_memory":
        return None if facts.device != "cuda" else {"pin_memory": not bool(row.get("pin_memory"))}
    if key == "prefetch_factor":
        # twice the loader's own: the config's, or (a user's DataLoader) whatever it was built with
        return {"prefetch_factor": 2 * facts.prefetch_factor if facts.prefetch_factor else "2x"}
    if key == "persistent_workers":
        return {"persistent_workers": True}
    return {}


def _why_not(key: str, group: dict, row: pd.Series, facts: Facts) -> Optional[str]:
    if facts.mode == "predict":
        return "actions: predict (or --no-action-trials): predictions only"
    if facts.only is not None and key not in facts.only:
        return f"not among the config's actions ({', '.join(facts.only)}): a prediction only"
    if not input_side(group):
        return "the answer binds on the step side: an input-side change cannot raise the rate"
    if key in PIPELINE_ACTIONS and facts.own != "pipeline":
        return (f"a user's own {'DataLoader' if facts.own == 'loader' else 'Dataset'}: its decoding, transforms and "
                "storage are its own; only the DataLoader's knobs are tried")
    if row.get("augment_device") not in (None, "cpu") and key in ("decoder", "uint8", "gpu_pipeline"):
        return "the GPU already decodes and augments in this pipeline"
    if key in ("uint8", "gpu_pipeline") and facts.device != "cuda":
        return "no GPU in this run: the step's device is the CPU the workers share"
    if key == "uint8" and not _has_stage(row, "Normalize"):
        return "the preset does not normalise on the CPU: its batches are uint8 already"
    if key == "gpu_pipeline" and facts.gpu_refusal:
        return facts.gpu_refusal
    if int(row.get("num_workers") or 0) == 0 and key in ("prefetch_factor", "persistent_workers"):
        return "0 workers: the loader has no workers to prefetch or keep"
    if key == "persistent_workers" and facts.own == "pipeline":
        return "pipeprof's own loader never ends a pass (an endless sampler): its workers never restart"
    if not (RELIEVES[key] & binding(group, row)):
        return f"it relieves {' or '.join(sorted(RELIEVES[key]))}, and {_resources(group, row)} binds here"
    return None


def _has_stage(row: pd.Series, name: str) -> bool:
    v = row.get(f"stage_share.{name}")
    return v is not None and v == v and v > 0


def _resources(group: dict, row: pd.Series) -> str:
    return " / ".join(sorted(binding(group, row))) or "no single input resource"


# ---- measured beside predicted --------------------------------------------------------------

def measured(row: dict) -> dict:
    """An action trial row's figures for the report: rates, gain with its 95% interval, verified (the whole
    interval above zero), and the trial's status and error when it failed."""
    if row.get("status") != "ok":
        return {"measured": False, "status": row.get("status"), "error": row.get("error")}
    if row.get("action_gain_frac") is None:  # ok, but no whole pair of windows fitted its time
        return {"measured": False, "status": "no pair", "error": row.get("unstable_reason")}
    lo, hi = row.get("action_gain_ci95_low"), row.get("action_gain_ci95_high")
    known = lo is not None and hi is not None and lo == lo and hi == hi
    return {"measured": True, "measured_samples_per_s": row.get("samples_per_s"),
            "baseline_samples_per_s": row.get("baseline_samples_per_s"),
            "measured_gain_frac": row.get("action_gain_frac"), "measured_gain_ci95_low": lo if known else None,
            "measured_gain_ci95_high": hi if known else None, "verified": bool(known and lo > 0),
            "pairs": row.get("pairs"), "action_trial_id": row.get("trial_id"),
            "worker_us_per_sample": row.get("worker_us_per_sample"),
            "baseline_worker_us_per_sample": row.get("baseline_worker_us_per_sample"),
            "unstable": bool(row.get("unstable")), "unstable_reason": row.get("unstable_reason"),
            "num_workers": row.get("num_workers")}


def combine(predicted: list[dict], planned: list[Planned], rows: dict) -> list[dict]:
    """The group's actions: each tried one with its measurement beside its prediction (``agrees``: the
    predicted gain inside the measured interval), each other one labelled a prediction with why it was not
    tried. The predictions keep the analysis' rank (what was measured is named by :func:`best_measured`);
    the actions with no prediction follow, those tried first."""
    by_id = {p.id: p for p in planned}
    out = [_entry(a, by_id.get(a.get("id")), rows.get(a.get("id"))) for a in predicted]
    have = {a.get("id") for a in predicted}
    extra = [_entry({"id": p.id, "action": p.action, "predicted_samples_per_s": None, "gain_frac": None,
                     "basis": ""}, p, rows.get(p.id)) for p in planned if p.id not in have]
    return out + sorted(extra, key=lambda a: not a.get("tried"))


def _entry(a: dict, p: Optional[Planned], row: Optional[dict]) -> dict:
    if row is not None:
        m = measured(row)
        gain, lo, hi = at_trial_baseline(a, m), m.get("measured_gain_ci95_low"), m.get("measured_gain_ci95_high")
        agrees = None if gain is None or lo is None else bool(lo <= gain <= hi)
        return a | {"action": p.action if p else a["action"], "tried": True, "agrees": agrees,
                    "predicted_gain_at_trial_frac": gain} | m
    if p is not None:
        why = p.why_not or "its action trial did not run (the run was interrupted first)"
    else:
        why = CANNOT.get(a.get("id"), "pipeprof cannot make this change itself")
    if a.get("id") == "at_step_ceiling":
        why = None  # a finding, not a change
    return a | {"tried": False, "why_not_tried": why, "label": "prediction"}


def at_trial_baseline(a: dict, m: dict) -> Optional[float]:
    """The predicted gain as the action trial can check it: against the baseline measured beside the variant.
    A prediction of a share of the pipeline's cost saved is a ratio, the same at any baseline (so is a cap at the
    measured hand-off: CPU work that moves with the machine); an absolute one (``absolute``: the GPU pipeline's
    rate beside a stand-in for the step) does not follow the CPU's speed, so its gain is its rate over the
    trial's baseline. On the H200 the heavy preset's GPU pipeline was predicted (then from its rate alone) at
    2,747 samples/s, +38% on the sweep's 1,996; the trial measured 2,986 against a baseline of 1,855 (the cores
    7% slower than in the sweep): +48% there, inside the measured +45% to +76%."""
    gain, base = a.get("gain_frac"), m.get("baseline_samples_per_s")
    if gain is None or not a.get("absolute") or not a.get("predicted_samples_per_s") or not base:
        return gain
    return a["predicted_samples_per_s"] / base - 1


def best_measured(actions: list[dict]) -> Optional[dict]:
    """The verified action with the largest measured gain, else the measured one with the largest gain."""
    tried = [a for a in actions if a.get("measured")]
    if not tried:
        return None
    return max(tried, key=lambda a: (bool(a.get("verified")), a.get("measured_gain_frac") or 0.0))
