"""The answer of one group of trials, typed: the num_workers to set and what binds there.

``analysis.analyse`` builds one :class:`Answer` per group (``run.meta["analysis"]["groups"]``);
``results`` saves them to run.json in their flat stored form (:meth:`Answer.to_dict`: the group's
settings beside the answer's fields, the names run.json has always used) and reads them back
(:meth:`Answer.from_dict`). Renderers and the watch read the attributes, never the stored names.

Attribute names are the stored ones, except where the stored name repeats what the record already
says (:data:`STORED` maps each renamed attribute to its stored name):

- ``workers``, ``samples_per_s``: ``recommended_workers``, ``recommended_samples_per_s``
- ``verdict``, ``side``, ``resource``, ``also``, ``basis``: ``<name>_at_recommended``
- ``CoresNeeded.cores``, ``CoresNeeded.workers``: ``cores_needed``, ``workers_needed``

A stored key this version does not know is kept in ``extra`` (written back as it was), so a field a
newer pipeprof adds survives a round trip; a group setting goes to ``key``.

May import: the standard library and ``schema`` only (a noun: every layer reads it).
"""

from __future__ import annotations

from dataclasses import dataclass, field, fields
from typing import Optional

from pipeprof.schema import GROUP_KEYS

#: the settings an answer's ``key`` holds: a sweep's group keys, and in a watch the loader the group came from
KEY_NAMES = (*GROUP_KEYS, "loader")


def _split(cls, d: dict, stored: dict[str, str]) -> tuple[dict, dict]:
    """(constructor arguments of ``cls`` read from the stored dict ``d``, the keys left over)."""
    names = {stored.get(f.name, f.name): f.name for f in fields(cls) if f.name not in ("key", "extra")}
    known = {names[k]: v for k, v in d.items() if k in names}
    return known, {k: v for k, v in d.items() if k not in names}


@dataclass
class Recommendation:
    """``analysis.recommend_workers``' pick: the smallest count not shown to be slower than the best, the
    best itself, the counts tied with it and the rule that picked (``criterion``)."""

    workers: int
    samples_per_s: float
    best_workers: int
    best_samples_per_s: float
    tied_with_best: list[int] = field(default_factory=list)
    criterion: str = ""

    STORED = {"workers": "recommended_workers", "samples_per_s": "recommended_samples_per_s"}

    @classmethod
    def from_dict(cls, d: dict) -> "Recommendation":
        known, _ = _split(cls, d, cls.STORED)
        return cls(**known)

    def to_dict(self) -> dict:
        return {self.STORED.get(f.name, f.name): getattr(self, f.name) for f in fields(self)}


@dataclass
class Confidence:
    """How often the re-drawn windows give the same answer (``analysis.confidence.summarize``): the count
    range holding 95% of the re-draws (``workers_low``-``workers_high``), each level's agreement, the
    alternatives, whether it ``holds``; ``disturbed``: other processes' load on the run's CPUs, which
    makes it not hold. ``draws`` 0: nothing was re-drawn (the other fields None)."""

    draws: int = 0
    workers_low: Optional[int] = None
    workers_high: Optional[int] = None
    workers_share: Optional[float] = None
    recommended_share: Optional[float] = None
    side: Optional[str] = None
    resource: Optional[str] = None
    side_share: Optional[float] = None
    answer_share: Optional[float] = None
    alternatives: list[dict] = field(default_factory=list)
    holds: Optional[bool] = None
    disturbed: Optional[dict] = None  # {"trials", "of", "foreign_cores_max"}
    extra: dict = field(default_factory=dict)

    @classmethod
    def from_dict(cls, d: Optional[dict]) -> Optional["Confidence"]:
        if d is None:
            return None
        known, rest = _split(cls, d, {})
        return cls(**known, extra=rest)

    def to_dict(self) -> dict:
        """Every field where windows were re-drawn (``disturbed`` only where set); with none, ``draws`` and
        what was set (``analysis._with_load`` adds ``holds`` and ``disturbed``), as the analysis stores them."""
        drawn = bool(self.draws)
        out = {
            f.name: getattr(self, f.name)
            for f in fields(self)
            if f.name != "extra"
            and (f.name == "draws" or getattr(self, f.name) not in (None, []) or (drawn and f.name != "disturbed"))
        }
        return out | self.extra


@dataclass
class CoresNeeded:
    """Cores to feed the step at its ceiling (``analysis.cores_needed``): ``cores`` None where no core count
    reaches it (the loader's hand-off passes at most ``handoff_limit``; ``cores_to_handoff_limit`` reach 95%
    of that); ``handoff_straddles``: the count is given, but the hand-off may stop it short."""

    cores: Optional[int] = None
    workers: Optional[float] = None
    extrapolated: bool = False
    handoff_limit: Optional[float] = None
    basis: str = ""
    handoff_straddles: Optional[bool] = None  # set where a count was found
    cores_to_handoff_limit: Optional[int] = None  # set where none was
    extra: dict = field(default_factory=dict)

    STORED = {"cores": "cores_needed", "workers": "workers_needed"}
    OPTIONAL = ("handoff_straddles", "cores_to_handoff_limit")  # stored only where set

    @classmethod
    def from_dict(cls, d: Optional[dict]) -> Optional["CoresNeeded"]:
        if d is None:
            return None
        known, rest = _split(cls, d, cls.STORED)
        return cls(**known, extra=rest)

    def to_dict(self) -> dict:
        out = {
            self.STORED.get(f.name, f.name): getattr(self, f.name)
            for f in fields(self)
            if f.name != "extra" and not (f.name in self.OPTIONAL and getattr(self, f.name) is None)
        }
        return out | self.extra


@dataclass
class Answer:
    """One group's answer, as run.json stores it (see the module docstring for the stored names).

    ``key``: the group's settings (``answer.key["model"]``); ``actions``: the ranked actions, each a dict
    (``analysis.gains.predicted_actions``, then ``actions.combine``); ``what_if``: predictions for other
    machines, each a dict; ``cpu_figures_skipped``: why there are no cores-needed and what-if figures;
    ``verdict`` ... ``basis``: the verdict at the recommended count (None for a run without one);
    ``best_measured_action``: the action trials' best (None before action trials)."""

    key: dict
    workers: int
    samples_per_s: float
    best_workers: int
    best_samples_per_s: float
    tied_with_best: list[int] = field(default_factory=list)
    criterion: str = ""
    confidence: Optional[Confidence] = None
    actions: list[dict] = field(default_factory=list)
    main_cpu_s_per_sample: Optional[float] = None
    cores_needed: Optional[CoresNeeded] = None
    what_if: Optional[list[dict]] = None
    cpu_figures_skipped: Optional[str] = None
    verdict: Optional[str] = None
    side: Optional[str] = None
    resource: Optional[str] = None
    also: Optional[list[str]] = None
    basis: Optional[str] = None
    best_measured_action: Optional[dict] = None
    # the pick against its nearest rival in alternating windows (analysis.confidence.pair_decision); None: one count
    pair: Optional[dict] = None
    extra: dict = field(default_factory=dict)

    STORED = {
        "workers": "recommended_workers",
        "samples_per_s": "recommended_samples_per_s",
        **{k: f"{k}_at_recommended" for k in ("verdict", "side", "resource", "also", "basis")},
    }
    ALWAYS = (
        "workers",
        "samples_per_s",
        "best_workers",
        "best_samples_per_s",
        "tied_with_best",
        "criterion",
        "confidence",
        "actions",
        "main_cpu_s_per_sample",
    )  # stored even when None; the rest only where set

    @classmethod
    def from_parts(cls, key: dict, pick: Recommendation, **rest) -> "Answer":
        """The answer of group ``key`` from its recommendation and the other fields by name."""
        return cls(
            key=dict(key),
            workers=pick.workers,
            samples_per_s=pick.samples_per_s,
            best_workers=pick.best_workers,
            best_samples_per_s=pick.best_samples_per_s,
            tied_with_best=list(pick.tied_with_best),
            criterion=pick.criterion,
            **rest,
        )

    @classmethod
    def from_dict(cls, d: dict) -> "Answer":
        """From the stored flat form: group settings into ``key``, unknown keys into ``extra``."""
        key = {k: v for k, v in d.items() if k in KEY_NAMES}
        known, rest = _split(cls, {k: v for k, v in d.items() if k not in KEY_NAMES}, cls.STORED)
        known["confidence"] = Confidence.from_dict(known.get("confidence"))
        known["cores_needed"] = CoresNeeded.from_dict(known.get("cores_needed"))
        return cls(key=key, **known, extra=rest)

    def to_dict(self) -> dict:
        """The flat stored form: the settings, then each field by its stored name (lists shared, not copied)."""
        out = dict(self.key)
        for f in fields(self):
            value = getattr(self, f.name)
            if f.name in ("key", "extra") or (value is None and f.name not in self.ALWAYS):
                continue
            out[self.STORED.get(f.name, f.name)] = value.to_dict() if hasattr(value, "to_dict") else value
        return out | self.extra

    @property
    def workers_range(self) -> tuple[int, int]:
        """The num_workers the re-drawn windows allow (``confidence``), else the pick alone."""
        sure = self.confidence
        if sure is None or sure.workers_low is None or sure.workers_high is None:
            return self.workers, self.workers
        return sure.workers_low, sure.workers_high
