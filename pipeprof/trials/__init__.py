"""Trials: one steady-state measurement each, returning a row.

``spec`` (settings, shared context) → ``skeleton`` (dataset, step, loader lifecycle, cache
state) → ``columns`` (pure row builders) → ``kinds`` (each kind, registered once in ``KINDS``);
``watchdog`` bounds a trial's time and turns a hang into a failed row; ``device_side`` decodes and
augments a batch of bytes on the step's device (``augment.device: cuda``), timed there; ``action_trial``
runs an action trial (variants against their baseline in alternating windows, one row of kind ``action`` each)
and ``variants`` builds each action's variant by the builder its entry in ``pipeprof.actions`` names;
``heap`` frees what a trial left before the next one (the sweep's and a kept job's ranks' alike);
``ray_trials`` runs the loader kinds on Ray Data (``data.engine: ray``).

May import: the nouns, ``data`` and ``measure``.
"""

from .kinds import KINDS, Kind, one_pass_plan, run_trial, timed_regions
from .spec import TrialContext, TrialSpec, spec_key

__all__ = ["KINDS", "Kind", "TrialContext", "TrialSpec", "one_pass_plan", "run_trial", "spec_key", "timed_regions"]
