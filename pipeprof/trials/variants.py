"""How each action's variant is built for an action trial, and the trial that runs one or two of them.

The builder an action uses is named by its entry in ``pipeprof.actions.ACTIONS`` (``variant``): a function of
this module ``fn(ctx, spec, params) -> Variant``, where ``spec`` is the baseline's settings and ``params`` what the
action's entry says the variant sets. :func:`run_together` builds the baseline and the variants and measures them
(``trials.action_trial``: alternating windows on one step).

- ``pipeline_as``: the same pipeline with other settings of its TrialSpec (``decoder``, ``augment_device``);
- ``uint8``: the preset without Normalize, normalised on the device by the step;
- ``other_source``: the same pipeline reading another source (the dataset in RAM, or packed into shards: the
  orchestration builds that source into the context first);
- ``knobs``: the same loader with other DataLoader settings; any DataLoader keyword works, for pipeprof's own
  loader and for a user's DataLoader alike (rebuilt from its parts), so a new knob needs no builder.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any, Callable

from torch.utils.data import DataLoader, IterableDataset

from pipeprof.actions import ACTIONS
from pipeprof.data.augment import A, load_preset
from pipeprof.data.dataset import PipelineDataset

from .action_trial import Variant, action_trials
from .device_side import feed
from .skeleton import collate_for, pipeline_dataset
from .spec import TrialContext, TrialSpec

# the DataLoader settings a Variant carries as fields of its own; any other knob goes into ``Variant.knobs``
OWN_FIELDS = ("pin_memory", "prefetch_factor")


def baseline(ctx: TrialContext, spec: TrialSpec) -> Variant:
    """The pipeline as the sweep measured it at ``spec``."""
    dataset = pipeline_dataset(ctx, spec)
    return Variant(
        dataset,
        collate_for(dataset) if dataset is not None else None,
        bool(spec.pin_memory),
        ctx.prefetch_factor,
        feed(ctx, spec),
        ctx.user_loader,
    )


def pipeline_as(ctx: TrialContext, spec: TrialSpec, params: dict) -> Variant:
    return baseline(ctx, replace(spec, **params))


def other_source(ctx: TrialContext, spec: TrialSpec, params: dict) -> Variant:
    if params["source"] not in ctx.sources:
        raise ValueError(f"the source {params['source']!r} of this action was not built before its trial")
    return baseline(ctx, replace(spec, source=params["source"]))


def uint8(ctx: TrialContext, spec: TrialSpec, params: dict) -> Variant:
    """The preset without Normalize: ToTensorV2 then hands over uint8, and the step normalises on the
    device (``measure.step.Step.prepare``), as the ``light`` preset does."""
    spec_ = A.to_dict(load_preset(spec.preset, spec.image_size))
    spec_["transform"]["transforms"] = [
        t for t in spec_["transform"]["transforms"] if t["__class_fullname__"].rsplit(".", 1)[-1] != "Normalize"
    ]
    timing = ctx.stage_timing if spec.stage_timing is None else spec.stage_timing
    dataset = PipelineDataset(ctx.source_for(spec), spec.decoder, A.from_dict(spec_), timing, ctx.sample_policy)
    return baseline(ctx, spec)._replace(dataset=dataset, collate=collate_for(dataset), feed=None)


def knobs(ctx: TrialContext, spec: TrialSpec, params: dict) -> Variant:
    """The same pipeline with other DataLoader settings (``params``: DataLoader keywords; prefetch_factor
    ``"2x"``: twice the user's own); a user's DataLoader is rebuilt from its own parts with them."""
    base = baseline(ctx, spec)
    if base.loader is not None:
        return base._replace(loader=with_knobs(base.loader, **params))
    other = {k: v for k, v in params.items() if k not in OWN_FIELDS}
    return base._replace(
        pin_memory=params.get("pin_memory", base.pin_memory),
        prefetch_factor=params.get("prefetch_factor", base.prefetch_factor),
        knobs=other,
    )


def with_knobs(factory: Callable[[int], Any], **changes) -> Callable[[int], DataLoader]:
    """``factory`` whose DataLoader is rebuilt with ``changes`` (DataLoader keywords) applied, its dataset,
    sampler, collate and worker init kept; ValueError for a loader that is not a torch DataLoader (its knobs are
    out of reach)."""

    def make(num_workers: int) -> DataLoader:
        dl = factory(num_workers)
        if not isinstance(dl, DataLoader):
            raise ValueError(
                f"the factory returned a {type(dl).__name__}, not a torch DataLoader: its "
                f"{', '.join(changes)} cannot be changed from outside"
            )
        batching = (
            {"batch_size": dl.batch_size, "drop_last": dl.drop_last}
            if isinstance(dl.dataset, IterableDataset) or dl.batch_sampler is None
            else {"batch_sampler": dl.batch_sampler}
        )
        workers = (
            {
                "prefetch_factor": dl.prefetch_factor,
                "persistent_workers": dl.persistent_workers,
                "timeout": dl.timeout,
                "in_order": getattr(dl, "in_order", True),
            }
            if dl.num_workers
            else {}
        )
        kw = {
            "num_workers": dl.num_workers,
            "collate_fn": dl.collate_fn,
            "pin_memory": dl.pin_memory,
            "worker_init_fn": dl.worker_init_fn,
            "generator": dl.generator,
            **workers,
        }
        doubled = {"prefetch_factor": 2 * (dl.prefetch_factor or 2)} if changes.get("prefetch_factor") == "2x" else {}
        # a worker's setting means nothing at 0 workers (DataLoader refuses some of them there)
        changed = {k: v for k, v in (changes | doubled).items() if dl.num_workers or k in kw}
        return DataLoader(dl.dataset, **batching, **{**kw, **changed})

    return make


def build(ctx: TrialContext, spec: TrialSpec, action: str, params: dict) -> Variant:
    """Action ``action``'s variant of the baseline ``spec``, by the builder its entry names."""
    return globals()[ACTIONS[action].variant](ctx, spec, params)


def run_together(ctx: TrialContext, spec: TrialSpec, actions: list[tuple[str, dict]]) -> list[dict]:
    """One or two actions, each ``(id, params)``, against ``spec``'s baseline in one rotation (``action_trials``)."""
    base_spec = replace(spec, kind="end_to_end", action=None)
    return action_trials(
        ctx, spec, baseline(ctx, base_spec), [build(ctx, base_spec, action, params) for action, params in actions]
    )
