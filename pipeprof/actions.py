"""The actions: every single change pipeprof predicts, tries or names, one :class:`Action` each in :data:`ACTIONS`.

An action is a change to the pipeline (another decoder, uint8 batches, decoding and augmenting on the GPU), to
its storage (the data in RAM, in shards) or to the DataLoader's own knobs (pinning, prefetch depth, persistent
workers, out-of-order batches); or a change pipeprof can only predict (drop a costly transform, more workers,
faster storage). Its entry says everything the rest of the package asks of it:

- what it is in words (``label``, formatted with what its variant sets) and what it relieves (the verdict's
  input-side resources: ``workers``, ``cores``, ``handoff``, ``storage``, ``startup``, ``unattributed``);
- how it is predicted: ``predict`` names a function of ``analysis.gains`` (None: no prediction, the action
  trial says what it does);
- how its variant is built for an action trial: ``variant`` names a builder of ``trials.variants`` (None:
  pipeprof cannot make the change itself, and ``cannot`` says why), and ``params`` what that variant sets;
  ``on_user``: it has a builder of its id in ``data.user_actions`` for a user's own dataset (``watch --tune``: the
  change made to the dataset a watched DataLoader was built with, tried in the pause);
- when it applies and why not: ``scope`` (what pipeline it needs), ``needs_cuda``, ``needs_workers``,
  ``cpu_side`` and ``rule`` (its own reason, if any), read by :func:`plan` in one order for every action.

To add an action: one entry in :data:`ACTIONS` and its test. A DataLoader knob needs nothing else: its variant is
``knobs`` (``trials.variants.knobs`` rebuilds pipeprof's loader or the user's DataLoader with ``params``) and it
has no prediction. A change to the pipeline also names a builder in ``trials.variants`` and, when the sweep's
figures can predict it, a predictor in ``analysis.gains``.

Pure (no torch, no pandas): a row is anything with ``.get`` (a pandas Series or a dict); an answer is
``answer.Answer``. Every layer may import this module. The action trials' measured figures are put beside the
predictions here too (:func:`combine`, :func:`best_measured`), so the report reads one record per action.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, NamedTuple, Optional

from pipeprof.schema import DEFAULT_GPU_DECODER, on_gpu_pipeline
from pipeprof.stats import gain_bounds, mean_ci95, simultaneous

# what an action needs of the pipeline: pipeprof's own pipeline (PIPELINE), pipeprof's own storage (STORAGE),
# only a DataLoader (KNOB: the user's own too), nothing pipeprof can make (ADVICE: a prediction only)
PIPELINE, STORAGE, KNOB, ADVICE = "pipeline", "storage", "knob", "advice"
# the input-side resources a CPU-side change can relieve (the verdict's names)
CPU_SIDE = frozenset({"workers", "cores", "unattributed"})
# the verdicts of runs stored before the two-level verdict: their input side, and the resource each names
OLD_INPUT_VERDICTS = {"cpu-bound", "io-bound", "loader-bound", "input-bound", "cores-bound"}
OLD_RESOURCE = {"cpu-bound": "workers", "io-bound": "storage", "loader-bound": "handoff", "cores-bound": "cores"}


class Facts(NamedTuple):
    """What the run knows of its pipeline, for planning (filled by the orchestration)."""

    device: str  # the run's device: 'cuda' or 'cpu'
    own: str  # 'pipeline' (pipeprof's), 'dataset' (a user's Dataset in pipeprof's loader) or 'loader' (the user's)
    mode: str = "measure"  # config ``actions``
    gpu_refusal: Optional[str] = None  # why the preset cannot run on the GPU (None: it can)
    source_kinds: dict = {}  # source label -> its storage layout (files, memory, shards, url)
    prefetch_factor: Optional[int] = (
        None  # the loader's (config loader.prefetch_factor); None: a user's DataLoader's own
    )
    only: Optional[tuple] = None  # config ``actions`` as a list: only these action ids are tried
    # a user's dataset as ``data.user_actions.inspect`` read it (watch --tune): builder -> {"why_not": ...}
    user: Optional[dict] = None


#: a decoder's id -> its name in the words a user reads (data.decode's ids, and torchvision.io seen in a user's dataset)
DECODER_NAMES = {"pil": "Pillow", "cv2": "OpenCV", "torchvision": "torchvision.io"}

Rule = Callable[[Any, Facts], Optional[str]]  # fn(row, facts) -> why the action does not apply here, or None
Params = Callable[[Any, Facts], Optional[dict]]  # fn(row, facts) -> what the variant sets; None: not a change here


@dataclass(frozen=True)
class Action:
    """One change: its words, what it relieves, how it is predicted, how its variant is built, when it applies."""

    id: str
    label: str  # in the report's words, formatted with ``params`` (and ``was``: the decoder that runs)
    relieves: frozenset = frozenset()
    scope: str = PIPELINE
    predict: Optional[str] = None  # its predictor in analysis.gains
    variant: Optional[str] = None  # its builder in trials.variants; None: a prediction only (``cannot``)
    params: Params = lambda row, facts: {}
    rule: Optional[Rule] = None  # its own reason not to apply, after the shared ones
    needs_cuda: bool = False
    needs_workers: bool = False  # a knob of the workers: nothing to change at 0 workers
    cpu_side: bool = False  # moves work off the CPU's decode/augment: not where the GPU already does them
    new_handoff: bool = (
        False  # what the loader hands over changes (bytes, uint8): the float32 hand-off's limit is not its
    )
    cannot: Optional[str] = None  # why a predicted action stays a prediction
    on_user: bool = False  # it has a form on a user's own dataset: data.user_actions' builder of its id
    user_label: Optional[str] = None  # its words for a user's dataset (the label's are pipeprof's pipeline's)


def _other_decoder(row, facts: Facts) -> dict:
    if facts.user is not None:  # a user's dataset: the other of what the pause saw it decode with
        return {"decoder": (facts.user.get("decoder") or {}).get("to") or "cv2"}
    return {"decoder": "cv2" if row.get("decoder") == "pil" else "pil"}


def _source_params(kind: str) -> Params:
    """The source a storage action reads (``<kind>-action``, built by the variant); None where it is what runs,
    or (shards) where the data is not a folder of files to pack."""

    def params(row, facts: Facts) -> Optional[dict]:
        there = facts.source_kinds.get(row.get("source"))
        packable = there in (None, "files")  # None: a user's data, refused by the scope with its reason
        return None if there == kind or (kind == "shards" and not packable) else {"source": f"{kind}-action"}

    return params


def _no_normalize(row, facts: Facts) -> Optional[str]:
    if facts.user is not None:  # a user's dataset: data.user_pipeline read its transform's end
        return None
    share = row.get("stage_share.Normalize")
    if share is None or share != share or share <= 0:
        return "the preset does not normalise on the CPU: its batches are uint8 already"
    return None


def _endless(row, facts: Facts) -> Optional[str]:
    if facts.own == "pipeline":
        return "pipeprof's own loader never ends a pass (an endless sampler): its workers never restart"
    return None


#: action id -> its entry. The order is the report's for actions with no prediction.
ACTIONS: dict[str, Action] = {
    a.id: a
    for a in [
        Action(
            "decoder",
            "decode with {decoder} instead of {was} (data.decoder: {decoder})",
            CPU_SIDE,
            predict="other_decoder",
            variant="pipeline_as",
            params=_other_decoder,
            cpu_side=True,
            on_user=True,
            user_label="decode with {decoder} instead of {was} (the dataset's own decode swapped)",
        ),
        Action(
            "uint8",
            "send uint8 batches, normalise on the GPU (preset without Normalize)",
            CPU_SIDE | {"handoff"},
            predict="uint8_to_gpu",
            variant="uint8",
            rule=_no_normalize,
            needs_cuda=True,
            cpu_side=True,
            new_handoff=True,
            on_user=True,
            user_label="hand over uint8 images, convert and normalise in the training process on its device",
        ),
        Action(
            "gpu_pipeline",
            "decode (nvJPEG) and augment on the GPU beside the step (augment.device: cuda, augment.overlap: staged): "
            "workers only read",
            CPU_SIDE | {"handoff"},
            predict="gpu_pipeline",
            variant="pipeline_as",
            # staged: decode and augment in threads of their own beside the step, the faster overlap with nvJPEG in
            # the runs that measured both side by side (docs/measured.md, "The overlap modes side by side")
            params=lambda row, facts: {
                "augment_device": "cuda",
                "augment_overlap": True,
                "staged": True,
                "gpu_decoder": DEFAULT_GPU_DECODER,
            },
            rule=lambda row, facts: facts.gpu_refusal,
            needs_cuda=True,
            cpu_side=True,
            new_handoff=True,
            on_user=True,
            user_label="workers read bytes; decode (nvJPEG) and augment on the GPU",
        ),
        Action(
            "memory",
            "cache the dataset in RAM (source: memory)",
            frozenset({"storage"}),
            STORAGE,
            predict="in_memory",
            variant="other_source",
            params=_source_params("memory"),
        ),
        Action(
            "shards",
            "pack the files into tar shards and read them sequentially (source: shards)",
            frozenset({"storage"}),
            STORAGE,
            predict="in_shards",
            variant="other_source",
            params=_source_params("shards"),
        ),
        Action(
            "pin_memory",
            "pin_memory={pin_memory}",
            frozenset({"handoff"}),
            KNOB,
            variant="knobs",
            params=lambda row, facts: (
                {"pin_memory": not bool(row.get("pin_memory"))} if facts.device == "cuda" else None
            ),
        ),
        # twice the loader's own: the config's, or (a user's DataLoader) whatever it was built with
        Action(
            "prefetch_factor",
            "prefetch_factor={prefetch_factor}",
            frozenset({"handoff", "startup"}),
            KNOB,
            variant="knobs",
            needs_workers=True,
            params=lambda row, facts: {"prefetch_factor": 2 * facts.prefetch_factor if facts.prefetch_factor else "2x"},
        ),
        Action(
            "persistent_workers",
            "persistent_workers=True",
            frozenset({"startup"}),
            KNOB,
            variant="knobs",
            # None: already persistent (a user's loader's own setting), nothing to change
            params=lambda row, facts: None if row.get("persistent_workers") is True else {"persistent_workers": True},
            rule=_endless,
            needs_workers=True,
        ),
        # a worker whose batch comes late (a costly sample) holds back the batches after it: out of order, the others
        # are handed over as they are made (DataLoader in_order, torch >= 2.6)
        Action(
            "in_order",
            "in_order=False (batches handed over as workers finish them)",
            frozenset({"workers"}),
            KNOB,
            variant="knobs",
            params=lambda row, facts: None if row.get("in_order") is False else {"in_order": False},
            needs_workers=True,
            rule=lambda row, facts: (
                "one worker makes its batches in order" if int(row.get("num_workers") or 0) < 2 else None
            ),
        ),
        # predictions only: pipeprof cannot make these changes itself
        Action(
            "stage",
            "drop or cheapen a costly transform",
            CPU_SIDE,
            ADVICE,
            predict="cheapen_costliest_stage",
            cannot="pipeprof cannot drop a transform from the preset: edit it and run again",
        ),
        Action(
            "workers",
            "more workers",
            CPU_SIDE,
            ADVICE,
            predict="all_cores_as_workers",
            cannot="a worker count past the ones measured: set it and run again",
        ),
        Action(
            "faster_storage",
            "faster storage",
            frozenset({"storage"}),
            ADVICE,
            predict="faster_storage",
            cannot="needs other storage than this machine has",
        ),
        Action(
            "workers_latency",
            "more workers to hide storage latency",
            frozenset({"storage"}),
            ADVICE,
            predict="workers_for_latency",
            cannot="a worker count past the ones measured: set it and run again",
        ),
    ]
}

#: the actions an action trial can try (config ``actions`` takes these ids)
TRIED: tuple[str, ...] = tuple(k for k, a in ACTIONS.items() if a.variant)
FINDING = "at_step_ceiling"  # not a change: the step is the limit (listed first among the actions)


class Planned(NamedTuple):
    id: str
    action: str  # in words, with the value it sets
    params: dict  # what the variant changes (read by its builder in trials.variants)
    why_not: Optional[str] = None  # None: tried


def input_side(answer) -> bool:
    """The answer binds on the input side, or may: a balanced answer (neither side binds clearly) leaves room
    for an input-side change up to the step (the two-level verdict's side; a run stored before it: its word)."""
    return answer.side in ("input", "balanced") if answer.side is not None else answer.verdict in OLD_INPUT_VERDICTS


def binding(answer, row) -> set[str]:
    """The input resources an action may relieve: the answer's, those within their interval of binding (for a
    balanced answer, the input resources its re-draws named, else the workers), and ``startup`` when the loader
    restarted its workers inside the trial (passes that end)."""
    resource = answer.resource if isinstance(answer.resource, str) else None  # a balanced answer names none (None,
    found = {resource, *(answer.also or [])}  # or NaN read back)
    if answer.side == "balanced":
        alternatives = answer.confidence.alternatives if answer.confidence else []
        found |= {a.get("resource") for a in alternatives if a.get("side") == "input"} or {"workers"}
    elif resource is None:  # a run stored before the two-level verdict
        found.add(OLD_RESOURCE.get(answer.verdict, "workers"))
    if (row.get("loader_restarts") or 0) > 0:
        found.add("startup")
    return {f for f in found if isinstance(f, str) and f}


def plan(answer, row, facts: Facts) -> list[Planned]:
    """Every action an action trial could try on this pipeline, each tried (``why_not`` None) or with why it is
    not; those that are not a change here (``params`` None: it is what runs) are left out."""
    out = []
    for a in ACTIONS.values():
        params = a.params(row, facts) if a.variant else None
        if params is None:
            continue
        was = row.get("decoder") if isinstance(row.get("decoder"), str) else "its own decoder"
        label = a.label
        if facts.user is not None and a.user_label:  # a user's dataset, in its decoders' names
            label = a.user_label
            was = DECODER_NAMES.get((facts.user.get(a.id) or {}).get("was"), was)
            params_words = {k: DECODER_NAMES.get(v, v) if k == "decoder" else v for k, v in params.items()}
        else:
            params_words = params
        out.append(Planned(a.id, label.format(was=was, **params_words), params, why_not(a, answer, row, facts)))
    return out


def why_not(a: Action, answer, row, facts: Facts) -> Optional[str]:
    """Why action ``a`` is not tried at this answer's baseline ``row``, or None: the shared reasons in one order,
    the action's own ``rule`` after them, and last whether it relieves what binds."""
    if facts.mode == "predict":
        return "actions: predict (or --no-action-trials): predictions only"
    if facts.only is not None and a.id not in facts.only:
        return f"not among the config's actions ({', '.join(facts.only)}): a prediction only"
    if not input_side(answer):
        return "the answer binds on the step side: an input-side change cannot raise the rate"
    if a.scope == PIPELINE and facts.own != "pipeline" and a.on_user and facts.user is not None:
        found = facts.user.get(a.id) or {"why_not": "the pause could not read the user's dataset"}
        if found.get("why_not"):
            return found["why_not"]
    elif a.scope in (PIPELINE, STORAGE) and facts.own != "pipeline" and facts.user is not None:
        return "a user's own dataset: its storage and decoding are its own (this change is pipeprof's pipeline's)"
    elif a.scope in (PIPELINE, STORAGE) and facts.own != "pipeline":
        return (
            f"a user's own {'DataLoader' if facts.own == 'loader' else 'Dataset'}: its decoding, transforms and "
            "storage are its own; only the DataLoader's knobs are tried"
        )
    if a.cpu_side and on_gpu_pipeline(row):
        return "the GPU already decodes and augments in this pipeline"
    # a user's dataset's variant does its work where the job's batches go, clocked by the pause (on a CPU, the
    # training process's time, added to the step's): only pipeprof's own pipeline needs the GPU for it
    if a.needs_cuda and facts.device != "cuda" and facts.user is None:
        return "no GPU in this run: the step's device is the CPU the workers share"
    if a.needs_workers and int(row.get("num_workers") or 0) == 0:
        return "0 workers: the loader has no workers to change"
    own = a.rule(row, facts) if a.rule else None
    if own:
        return own
    if not (a.relieves & binding(answer, row)):
        resources = " / ".join(sorted(binding(answer, row))) or "no single input resource"
        return f"it relieves {' or '.join(sorted(a.relieves))}, and {resources} binds here"
    return None


# ---- measured beside predicted --------------------------------------------------------------


def measured(row: dict, comparisons: int = 1) -> dict:
    """An action trial row's figures for the report: rates, gain with its interval, verified (the whole interval
    above zero), and the trial's status and error when it failed. ``comparisons``: the action trials of its group,
    whose best is named: each interval is at the level that holds for all of them together
    (:func:`pipeprof.stats.simultaneous`), re-drawn from the trial's pairs of windows."""
    if row.get("status") != "ok":
        return {"measured": False, "status": row.get("status"), "error": row.get("error")}
    if row.get("action_gain_frac") is None:  # ok, but no whole pair of windows fitted its time
        return {"measured": False, "status": "no pair", "error": row.get("unstable_reason")}
    lo, hi = row.get("action_gain_ci95_low"), row.get("action_gain_ci95_high")
    level, mine, theirs = simultaneous(comparisons), row.get("window_rates"), row.get("baseline_window_rates")
    if level != 0.95 and mine is not None and theirs is not None and len(mine) == len(theirs) >= 2:
        lo, hi = mean_ci95([a / b - 1 for a, b in zip(mine, theirs)], level)  # the trial's pairs, as it read them
    lo, hi = gain_bounds(row.get("action_gain_frac"), lo, hi)  # the rule of ratios: never below -100%
    known = lo is not None and hi is not None
    return {
        "measured": True,
        "measured_samples_per_s": row.get("samples_per_s"),
        "baseline_samples_per_s": row.get("baseline_samples_per_s"),
        "measured_gain_frac": row.get("action_gain_frac"),
        "measured_gain_ci95_low": lo if known else None,
        "measured_gain_ci95_high": hi if known else None,
        "verified": bool(known and lo > 0),
        "ci_level": level,
        "pairs": row.get("pairs"),
        "action_trial_id": row.get("trial_id"),
        "worker_us_per_sample": row.get("worker_us_per_sample"),
        "baseline_worker_us_per_sample": row.get("baseline_worker_us_per_sample"),
        "unstable": bool(row.get("unstable")),
        "unstable_reason": row.get("unstable_reason"),
        "num_workers": row.get("num_workers"),
    }


def combine(predicted: list[dict], planned: list[Planned], rows: dict) -> list[dict]:
    """The group's actions: each tried one with its measurement beside its prediction (``agrees``: the
    predicted gain inside the measured interval), each other one labelled a prediction with why it was not
    tried. The predictions keep the analysis' rank (what was measured is named by :func:`best_measured`);
    the actions with no prediction follow, those tried first."""
    by_id, k = {p.id: p for p in planned}, sum(r.get("status") == "ok" for r in rows.values())
    out = [_entry(a, by_id.get(a.get("id")), rows.get(a.get("id")), k) for a in predicted]
    have = {a.get("id") for a in predicted}
    extra = [
        _entry(
            {"id": p.id, "action": p.action, "predicted_samples_per_s": None, "gain_frac": None, "basis": ""},
            p,
            rows.get(p.id),
            k,
        )
        for p in planned
        if p.id not in have
    ]
    return out + sorted(extra, key=lambda a: not a.get("tried"))


def _entry(a: dict, p: Optional[Planned], row: Optional[dict], comparisons: int = 1) -> dict:
    if row is not None:
        m = measured(row, comparisons)
        gain, lo, hi = at_trial_baseline(a, m), m.get("measured_gain_ci95_low"), m.get("measured_gain_ci95_high")
        agrees = None if gain is None or lo is None else bool(lo <= gain <= hi)
        return (
            a
            | {
                "action": p.action if p else a["action"],
                "tried": True,
                "agrees": agrees,
                "predicted_gain_at_trial_frac": gain,
            }
            | m
        )
    if p is not None:
        why = p.why_not or "its action trial did not run (the run was interrupted first)"
    else:
        known = ACTIONS.get(a.get("id"))
        why = (known.cannot if known else None) or "pipeprof cannot make this change itself"
    if a.get("id") == FINDING:
        why = None  # a finding, not a change
    return a | {"tried": False, "why_not_tried": why, "label": "prediction"}


def at_trial_baseline(a: dict, m: dict) -> Optional[float]:
    """The predicted gain as the action trial can check it: against the baseline measured beside the variant.
    A prediction of a share of the pipeline's cost saved is a ratio, the same at any baseline (so is a cap at the
    measured hand-off: CPU work that moves with the machine); an absolute one (``absolute``: the GPU pipeline's
    rate beside a stand-in for the step) does not follow the CPU's speed, so its gain is its rate over the
    trial's baseline (docs/measured.md has the case that showed it)."""
    gain, base = a.get("gain_frac"), m.get("baseline_samples_per_s")
    if gain is None or not a.get("absolute") or not a.get("predicted_samples_per_s") or not base:
        return gain
    return a["predicted_samples_per_s"] / base - 1


def best_measured(actions: list[dict], gain: str = "measured_gain_frac", verified_only: bool = False) -> Optional[dict]:
    """The verified action with the largest ``gain``, else (unless ``verified_only``) the measured one with the
    largest. ``gain``: the figure they are ranked by (the watch ranks by the end-to-end gain it predicts)."""
    tried = [a for a in actions if a.get("measured") and (a.get("verified") or not verified_only)]
    if not tried:
        return None
    return max(tried, key=lambda a: (bool(a.get("verified")), a.get(gain) or 0.0))
