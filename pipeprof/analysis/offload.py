"""Offloading the input pipeline to remote CPUs: for G GPUs a training node, how many remote cores (and nodes of C
cores) keep the GPUs at a target share of their ceiling (``pipeprof size --offload DATALOADER_RUN RAY_RUN``).

What it reads (:func:`inputs`), all measured: from the Ray run (``data.engine: ray``) its ``cpu_pipeline`` trial
at its smallest CPU limit, the rate one Ray CPU delivers (samples/s over the limit, with its interval) and the
actors' CPU a sample (``ray_actor_cpu_s_per_sample``), the bytes a sample carries (``batch_bytes_per_sample``) and
the ``handoff`` trial at its largest limit (the ingest limit: what one training process takes in through the object
store); from either run the one-GPU step ceiling (``gpu_ceiling``, its N-GPU rows for the scaling); from the
DataLoader run its workers' CPU a sample at its fewest workers, printed beside the actors'.

For G GPUs (:func:`size_row`): the GPUs take G x the ceiling (times the scaling measured for G, else assumed
linear); the target rate is ``target`` of that. Three limits stand between remote CPUs and the GPUs: the cores
(each remote CPU delivers what one did in the run: the smallest limit's rate, scaled by cores, as each node brings
its own), the training node's link (``link_gbps`` over the bytes a sample), and the ingest (G training processes,
each taking in what the hand-off passed). The cores are those that reach the target, or, where the link or the
ingest stops short of it, those that feed what it passes; the binding limit is the one that set them. A figure
past what was measured (more cores than the run's largest CPU limit; more GPUs than a ceiling was measured on) is
extrapolated and says so. Pure: rows in, typed records out; rendering is ``report.offload``'s.
"""

from __future__ import annotations

import math
from typing import NamedTuple, Optional

import pandas as pd

from .bounds import matching, ok
from .workstation import label, step_and_scaling

DEFAULT_NODE_CORES = 32
DEFAULT_LINK_GBPS = 25.0
DEFAULT_GPUS = (1, 2, 4, 8)
#: the pipeline's settings a Ray row and a DataLoader row must share to be the same pipeline
PIPELINE_KEYS = ["preset", "decoder", "batch_size", "image_size", "input_dtype", "source", "cache_state"]


class Rate(NamedTuple):
    """A measured samples/s with its 95% interval."""

    value: float
    low: float
    high: float

    def times(self, k: float) -> "Rate":
        return Rate(self.value * k, self.low * k, self.high * k)


class Inputs(NamedTuple):
    """What the model reads from the two runs (module doc)."""

    workload: str  # the step's and pipeline's settings, as ``pipeprof size`` names a workload
    step: Rate  # the step's ceiling on one GPU
    scaling: dict  # GPUs -> measured scaling efficiency of the step (N-GPU ceilings)
    cpu_limit: int  # the Ray CPU limit the per-CPU rate comes from (the smallest measured)
    per_cpu: Rate  # samples/s one Ray CPU delivered at that limit
    ray_cpu_s: Optional[float]  # the actors' CPU seconds a sample at that limit
    max_cpu_limit: int  # the largest Ray CPU limit measured
    curve: tuple  # ((limit, samples/s), ...) every cpu_pipeline limit measured, for the line's check
    bytes_per_sample: float
    ingest: Optional[Rate]  # the hand-off's samples/s (one training process); None: not measured
    ingest_limit: Optional[int]  # the CPU limit the hand-off was measured at
    carry_cpu_s: Optional[float]  # the hand-off actors' CPU a sample: Ray's cost of carrying one, no pipeline work
    loader_cpu_s: Optional[float]  # the DataLoader workers' CPU seconds a sample
    loader_workers: Optional[int]
    ray_version: Optional[str]
    ray_nodes: Optional[int]
    notes: tuple = ()  # where the two runs' settings differ


class Row(NamedTuple):
    """One GPU count's answer (:func:`size_row`)."""

    gpus: int
    gpus_samples_per_s: float  # what the GPUs take (their ceiling)
    target_samples_per_s: float
    network_samples_per_s: float  # what the training node's link carries
    ingest_samples_per_s: float  # what the training processes take in (inf: not measured)
    cores: int  # remote cores that reach the target, or feed what the binding limit passes
    cores_low: int  # at the per-CPU rate's interval ends
    cores_high: int
    nodes: int  # nodes of ``node_cores`` cores
    delivered_samples_per_s: float
    of_ceiling_frac: float
    binding: str  # cpu | network | ingest
    extrapolated: bool
    note: str


def network_rate(link_gbps: float, bytes_per_sample: float) -> float:
    """Samples/s a link of ``link_gbps`` (1e9 bits/s) carries at ``bytes_per_sample``: its raw rate, no protocol
    overhead counted."""
    return link_gbps * 1e9 / 8 / bytes_per_sample


def cores_for(rate: float, per_cpu: float) -> int:
    """The fewest whole cores that deliver ``rate`` at ``per_cpu`` samples/s each (at least 1)."""
    return max(1, math.ceil(rate / per_cpu - 1e-9))


def size_row(x: Inputs, gpus: int, target: float, link_gbps: float, node_cores: int) -> Row:
    """The remote cores and nodes that keep ``gpus`` GPUs of one training node at ``target`` of their ceiling."""
    eff = x.scaling.get(gpus, 1.0)
    ceiling = x.step.value * gpus * eff
    want = target * ceiling
    limits = {
        "network": network_rate(link_gbps, x.bytes_per_sample),
        "ingest": x.ingest.value * gpus if x.ingest else math.inf,
    }
    reach = min(want, *limits.values())
    binding = "cpu" if reach >= want else min(limits, key=limits.get)
    cores = cores_for(reach, x.per_cpu.value)
    delivered = min(cores * x.per_cpu.value, ceiling, *limits.values())
    past = _extrapolated(x, gpus, cores)
    return Row(
        gpus=gpus,
        gpus_samples_per_s=ceiling,
        target_samples_per_s=want,
        network_samples_per_s=limits["network"],
        ingest_samples_per_s=limits["ingest"],
        cores=cores,
        cores_low=cores_for(reach, x.per_cpu.high),
        cores_high=cores_for(reach, x.per_cpu.low),
        nodes=math.ceil(cores / node_cores),
        delivered_samples_per_s=delivered,
        of_ceiling_frac=delivered / ceiling,
        binding=binding,
        extrapolated=bool(past),
        note="; ".join(past + ([] if x.ingest else ["ingest not measured (trials: handoff)"])),
    )


def _extrapolated(x: Inputs, gpus: int, cores: int) -> list[str]:
    """What a row's figure assumes past what the runs measured; empty where nothing."""
    past = [f"{cores} cores past the {x.max_cpu_limit} measured"] if cores > x.max_cpu_limit else []
    if gpus > 1 and gpus not in x.scaling:
        past.append(f"{gpus} GPUs: the step's scaling assumed linear, each training process's ingest the one measured")
    return [f"extrapolated: {'; '.join(past)}"] if past else []


def table(x: Inputs, gpus: list[int], target: float, link_gbps: float, node_cores: int) -> list[Row]:
    return [size_row(x, g, target, link_gbps, node_cores) for g in gpus]


def size(runs: list, gpus: list[int], target: float, link_gbps: float, node_cores: int) -> tuple[Inputs, list[Row]]:
    """``pipeprof size --offload``: the inputs the two runs give and one row per GPU count; ValueError naming the
    option or the run that is wrong."""
    if not link_gbps > 0:
        raise ValueError(f"--link-gbps is the training node's link in Gb/s, above 0, not {link_gbps:g}")
    if node_cores < 1:
        raise ValueError(f"--node-cores is the cores of a remote node, at least 1, not {node_cores}")
    x = inputs(runs)
    return x, table(x, gpus, target, link_gbps, node_cores)


def predict(x: Inputs, cpus: int) -> tuple[float, str]:
    """The model's rate for one training process fed by ``cpus`` remote CPUs (no step): the line at ``cpus``,
    under the ingest; and which of the two binds (the two-node check's prediction)."""
    line = cpus * x.per_cpu.value
    if x.ingest and x.ingest.value < line:
        return x.ingest.value, "ingest"
    return line, "cpu"


def line_check(x: Inputs) -> list[tuple[int, float, float]]:
    """(limit, measured samples/s, the line's) at every CPU limit the Ray run measured above the one the line
    comes from: how far the measured curve runs from it on the measuring machine."""
    return [(n, rate, n * x.per_cpu.value) for n, rate in x.curve if n > x.cpu_limit]


def busy_frac(rate: float, cpu_s: Optional[float], cpus: int) -> Optional[float]:
    """The share of their CPUs the actors used: their CPU a sample times the rate, over the CPUs."""
    return rate * cpu_s / cpus if cpu_s and cpus else None


# --- reading the two runs ----------------------------------------------------------------------------------------


def is_ray(run) -> bool:
    t = run.trials
    return "engine" in t and bool((t["engine"] == "ray").any())


def inputs(runs: list, names: Optional[list[str]] = None) -> Inputs:
    """The model's inputs from a DataLoader run and a Ray run, in either order (told apart by their rows'
    ``engine``); ValueError naming what is missing. ``names``: how the runs are named in messages (their folders)."""
    names = names or [str(getattr(r, "path", i)) for i, r in enumerate(runs)]
    ray = [(r, n) for r, n in zip(runs, names) if is_ray(r)]
    loader = [(r, n) for r, n in zip(runs, names) if not is_ray(r) and len(_loader_rows(r.trials))]
    if len(ray) != 1 or len(loader) != 1:
        raise ValueError(_which_missing(ray, loader, names))
    (ray_run, ray_name), (loader_run, loader_name) = ray[0], loader[0]
    pipe = ok(ray_run.trials, "cpu_pipeline")
    pipe = pipe[pipe["engine"] == "ray"]
    if pipe.empty:
        raise ValueError(
            f"the Ray run {ray_name} has no cpu_pipeline trial that succeeded: the rate a Ray CPU "
            "delivers is what size --offload reads (trials: cpu_pipeline)"
        )
    first = pipe.iloc[0]
    same = matching(pipe, first, PIPELINE_KEYS)
    notes = [f"the Ray run measured more than one pipeline: sized at the first ({_pipe_text(first)})"]
    notes = notes if len(same) < len(pipe) else []
    step, scaling, step_row = _step([ray_run, loader_run], first, [ray_name, loader_name])
    loader_s, workers, note = _loader_cost(loader_run.trials, first)
    return Inputs(
        workload=label(_key(step_row, first)),
        step=step,
        scaling=scaling,
        **_ray_curve(same),
        **_ingest(ray_run.trials, first),
        loader_cpu_s=loader_s,
        loader_workers=workers,
        ray_version=_plain(first.get("ray_version")),
        ray_nodes=None if pd.isna(first.get("ray_nodes")) else int(first["ray_nodes"]),
        notes=tuple(notes + ([note] if note else [])),
    )


def _which_missing(ray: list, loader: list, names: list[str]) -> str:
    given = ", ".join(names)
    if not ray:
        return (
            f"size --offload needs a Ray run (data.engine: ray, with a cpu_pipeline trial) and a DataLoader run: "
            f"no Ray run among {given}"
        )
    if not loader:
        return (
            f"size --offload needs a DataLoader run (cpu_pipeline with 1 or more workers) beside the Ray run: "
            f"no DataLoader run among {given}"
        )
    many = ray if len(ray) > 1 else loader
    kind = "Ray" if len(ray) > 1 else "DataLoader"
    return (
        f"size --offload reads one Ray run and one DataLoader run, not {len(many)} {kind} runs "
        f"({', '.join(n for _, n in many)})"
    )


def _loader_rows(t: pd.DataFrame) -> pd.DataFrame:
    c = ok(t, "cpu_pipeline")
    if "engine" in c:
        c = c[c["engine"].isna() | (c["engine"] == "dataloader")]
    return c[c["num_workers"] >= 1] if "num_workers" in c else c.iloc[0:0]


def _ray_curve(pipe: pd.DataFrame) -> dict:
    pipe = pipe.assign(limit=pipe["ray_cpu_limit"].fillna(pipe["num_workers"]).astype(int)).sort_values("limit")
    one = pipe.iloc[0]
    n = int(one["limit"])
    curve = tuple((int(r["limit"]), float(r["samples_per_s"])) for _, r in pipe.iterrows())
    cost = one.get("ray_actor_cpu_s_per_sample")
    return {
        "cpu_limit": n,
        "per_cpu": _rate(one).times(1 / n),
        "ray_cpu_s": float(cost) if pd.notna(cost) else None,
        "max_cpu_limit": int(pipe["limit"].max()),
        "curve": curve,
        "bytes_per_sample": float(one["batch_bytes_per_sample"]),
    }


def _rate(r: pd.Series) -> Rate:
    """A row's samples/s and its interval (the median where an end is missing)."""
    mid = float(r["samples_per_s"])
    ends = [r.get(k) for k in ("samples_per_s_ci95_low", "samples_per_s_ci95_high")]
    return Rate(mid, *(float(e) if pd.notna(e) else mid for e in ends))


def _ingest(t: pd.DataFrame, like: pd.Series) -> dict:
    h = ok(t, "handoff")
    h = matching(h[h["engine"] == "ray"], like, PIPELINE_KEYS) if "engine" in h else h.iloc[0:0]
    if h.empty:
        return {"ingest": None, "ingest_limit": None, "carry_cpu_s": None}
    top = h.loc[h["ray_cpu_limit"].fillna(h["num_workers"]).idxmax()]
    carry = top.get("ray_actor_cpu_s_per_sample")
    return {
        "ingest": _rate(top),
        "ingest_limit": int(top["ray_cpu_limit"] if pd.notna(top.get("ray_cpu_limit")) else top["num_workers"]),
        "carry_cpu_s": float(carry) if pd.notna(carry) else None,
    }


def _step(runs: list, like: pd.Series, names: list[str]) -> tuple[Rate, dict, pd.Series]:
    """The one-GPU ceiling (and N-GPU scaling) of the step at the pipeline's batch, from the runs' gpu_ceiling rows
    (the Ray run's first): one model's, the first found."""
    for run in runs:
        g = matching(ok(run.trials, "gpu_ceiling"), like, ["batch_size", "image_size"])
        if g.empty:
            continue
        first = g.iloc[0]
        g = matching(g, first, ["model", "precision", "mode", "batch_size", "image_size"])
        one, scaling = step_and_scaling(g)
        if one is not None:
            return Rate(*one), scaling, first
    raise ValueError(
        f"no gpu_ceiling trial at batch {_plain(like.get('batch_size'))} in {' or '.join(names)}: "
        "the step's ceiling is what size --offload sizes against (trials: gpu_ceiling)"
    )


def _loader_cost(t: pd.DataFrame, like: pd.Series) -> tuple[Optional[float], Optional[int], Optional[str]]:
    """The DataLoader workers' process CPU a sample (their mean CPU over the rate) at the fewest workers of the same
    pipeline as the Ray row (else of any, named in the note)."""
    rows = _loader_rows(t)
    same = matching(rows, like, PIPELINE_KEYS)
    note = None
    if same.empty:
        note = f"the DataLoader run's pipeline ({_pipe_text(rows.iloc[0])}) is not the Ray run's ({_pipe_text(like)})"
        same = rows
    same = same[same["workers_cpu_pct_mean"].notna()] if "workers_cpu_pct_mean" in same else same.iloc[0:0]
    if same.empty:
        return None, None, note
    r = same.sort_values("num_workers").iloc[0]
    return float(r["workers_cpu_pct_mean"]) / 100 / float(r["samples_per_s"]), int(r["num_workers"]), note


def _key(step_row: pd.Series, pipe_row: pd.Series) -> dict:
    return {k: _plain(step_row.get(k)) for k in ("model", "precision", "mode")} | {
        k: _plain(pipe_row.get(k)) for k in ("preset", "batch_size")
    }


def _pipe_text(r: pd.Series) -> str:
    return ", ".join(f"{k} {_plain(r.get(k))}" for k in ("preset", "decoder", "batch_size") if pd.notna(r.get(k)))


def _plain(v):
    if v is None or (isinstance(v, float) and v != v):
        return None
    return v.item() if hasattr(v, "item") else v
