"""A stored run written where teams already look: TensorBoard, MLflow, Weights & Biases (offline).

``pipeprof report RUN --to tensorboard DIR | mlflow [URI] | wandb DIR`` calls :func:`export`. Like the other
renderers it reads the stored run and never measures or analyses; each writer needs its optional extra
(``pip install pipeprof[tensorboard]``, ``[mlflow]``, ``[wandb]``) and a missing one is a clear error naming it.
A sweep and a watch export alike (a watch's rows are its end_to_end rows, with their data wait).

What each gets, from :func:`scalars` (one list, so the three agree):

- per ok trial, ``{kind}/{figure}`` at step ``num_workers`` (a sweep's curve is then a line over worker counts in
  TensorBoard's and MLflow's charts): samples/s and its 95% interval's ends, and for end_to_end rows the data
  wait share, the GPU's and the workers' CPU use;
- per group's answer, ``answer/recommended_workers`` and ``answer/samples_per_s`` (step 0);
- TensorBoard also the monitor's timeline (``timeline/{column}``, its samples' wall times); MLflow the resolved
  config as params, report.html and run.json as artifacts; W&B the config and the same scalars.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import NamedTuple, Optional

from pipeprof.analysis.compare import flatten

#: per-trial figures exported, where a row has them
FIGURES = (
    "samples_per_s",
    "samples_per_s_ci95_low",
    "samples_per_s_ci95_high",
    "data_wait_frac",
    "gpu_util_pct_mean",
    "workers_cpu_pct_mean",
)
#: the monitor's timeline columns exported (those a run has): the machine's CPU, the run's own cores, the GPU, disk
TIMELINE = ("cpu_util_pct", "run_cores", "foreign_cores", "gpu_util_pct", "disk_read_mb_s")


class Scalar(NamedTuple):
    tag: str
    value: float
    step: int


def _number(v) -> Optional[float]:
    try:
        f = float(v)
    except (TypeError, ValueError):
        return None
    return f if math.isfinite(f) else None


def scalars(run) -> list[Scalar]:
    """Every figure a tracker gets (see the module), in the run's trial order."""
    out = []
    t = run.trials
    for _, row in t[t["status"] == "ok"].iterrows() if len(t) and "status" in t else ():
        step = int(_number(row.get("num_workers")) or 0)
        for name in FIGURES:
            value = _number(row.get(name))
            if value is not None:
                out.append(Scalar(f"{row['kind']}/{name}", value, step))
    for k, group in enumerate((run.meta.get("analysis") or {}).get("groups") or []):
        for name, value in (("recommended_workers", group.workers), ("samples_per_s", group.samples_per_s)):
            if _number(value) is not None:
                out.append(Scalar(f"answer/{name}", float(value), k))
    return out


def _need(extra: str):
    """The tracker's module (each is named as its pipeprof extra), or why it is missing and how to install it."""
    import importlib

    try:
        return importlib.import_module(extra)
    except ImportError as exc:
        raise ValueError(f"--to {extra} needs the {extra} extra: pip install 'pipeprof[{extra}]' ({exc})") from None


def to_tensorboard(run, log_dir: str) -> str:
    """Event files under ``log_dir/<run folder's name>`` (point TensorBoard at ``log_dir``)."""
    _need("tensorboard")
    from torch.utils.tensorboard import SummaryWriter

    where = Path(log_dir) / run.path.name
    with SummaryWriter(str(where)) as w:
        for s in scalars(run):
            w.add_scalar(s.tag, s.value, s.step)
        started = _number(run.meta.get("started")) or 0.0  # t_s counts from the run's start (wall clock: its time)
        for i, (_, row) in enumerate(run.timeline.iterrows() if len(run.timeline) else ()):
            for name in TIMELINE:
                value = _number(row.get(name))
                if value is not None:
                    w.add_scalar(f"timeline/{name}", value, i, walltime=started + (_number(row.get("t_s")) or 0.0))
        w.add_text("run", f"pipeprof {run.meta.get('kind', 'sweep')} run {run.path.name}: {run.meta.get('status')}")
    return str(where)


def to_mlflow(run, uri: Optional[str] = None) -> str:
    """One MLflow run named for the run folder, in the experiment ``pipeprof``, at ``uri`` (else the tracking URI
    the user has set, MLFLOW_TRACKING_URI, else a SQLite store beside the run folder: ``mlflow.db``)."""
    import os

    mlflow = _need("mlflow")
    uri = uri or os.environ.get("MLFLOW_TRACKING_URI") or f"sqlite:///{run.path.parent.resolve() / 'mlflow.db'}"
    mlflow.set_tracking_uri(uri)
    if uri.startswith("sqlite:///") and mlflow.get_experiment_by_name("pipeprof") is None:
        # a local store keeps its artifacts beside its database, not in ./mlruns wherever the command ran
        where = Path(uri.removeprefix("sqlite:///")).parent / "mlartifacts"
        mlflow.create_experiment("pipeprof", artifact_location=where.resolve().as_uri())
    mlflow.set_experiment("pipeprof")
    params = {k: str(v)[:500] for k, v in flatten(run.meta.get("config") or {}).items()}
    with mlflow.start_run(run_name=run.path.name) as active:
        mlflow.log_params(params)
        for s in scalars(run):
            mlflow.log_metric(s.tag, s.value, step=s.step)
        for name in ("report.html", "run.json"):
            if (run.path / name).exists():
                mlflow.log_artifact(str(run.path / name))
        return f"{uri} (run {active.info.run_id})"


def to_wandb(run, directory: str) -> str:
    """An offline W&B run under ``directory`` (``wandb sync`` uploads it later)."""
    wandb = _need("wandb")
    active = wandb.init(
        mode="offline", dir=directory, name=run.path.name, project="pipeprof", config=run.meta.get("config") or {}
    )
    for s in scalars(run):
        active.log({s.tag: s.value, "num_workers": s.step})
    active.finish()
    return str(Path(directory))


WRITERS = {"tensorboard": to_tensorboard, "mlflow": to_mlflow, "wandb": to_wandb}


def export(run, to: str, where: Optional[str] = None) -> str:
    """Write ``run`` to tracker ``to``; what was written, in words. ValueError names the trackers there are."""
    if to not in WRITERS:
        raise ValueError(f"unknown tracker {to!r}; available: {', '.join(WRITERS)}")
    if to != "mlflow" and not where:
        raise ValueError(f"--to {to} needs a directory to write to: --to {to} DIR")
    return WRITERS[to](run, where)
