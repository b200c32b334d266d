"""``pipeprof validate``: run workloads whose answer is known and compare.

A benchmark, not a test: it prints, for each calibrated workload (see
``calibrate``; and a throttled source of set bandwidth), the expected and measured
samples/s, the expected and reported verdict, and the prediction error, so anyone can
check pipeprof's accuracy on their own machine. The cases cover each verdict: CPU-,
step-, cores- and I/O-bound, balanced, 0 workers, and a user model of 10 outputs or
with a tuple output. Cases use one worker (or, for the cores case, more workers than
cores), so a 2-core machine can run them; the expected answers take the machine's
usable cores into account. ``--sizing`` (see ``sizing``) checks the core-count predictions.
"""

from __future__ import annotations

from dataclasses import dataclass

import pandas as pd

from pipeprof.answer import Confidence

from .calibrate import BurnDataset, BurnStepModel, FixedStepModel, expected_rate

MEASURE = {
    "warmup_batches": 3,
    "warmup_s": 0.5,
    "window_s": 0.75,
    "window_batches": 3,
    "windows": 4,
    "max_windows": 8,
    "ci_target": 0.1,
    "cpu_reference_s": 0,
}  # the cases' own known costs are the reference
RATE_TOLERANCE = 0.15  # measured vs known rate: a 2-core shared machine moves this much between windows


@dataclass(frozen=True)
class Case:
    """A BurnDataset (``cost_ms`` of CPU per sample) feeding a FixedStepModel (``step_ms`` per batch).

    ``outputs``: the model's outputs (labels are ``index % 10``); ``tuple_output``: the model returns
    ``(logits, aux)``; ``step_cpu``: the step burns a core instead of sleeping (a CPU step);
    ``workers`` None means "the machine's cores + 2" (more workers than cores).
    """

    name: str
    cost_ms: float
    workers: int | None
    batch: int
    step_ms: float
    outputs: int = 1000
    tuple_output: bool = False
    step_cpu: bool = False
    edge: tuple[str, ...] = ()  # a case on a threshold: either of these verdicts is right, said with both

    def workers_on(self, cores: int) -> int:
        return cores + 2 if self.workers is None else self.workers

    def expected(self, cores: int) -> tuple[float, str]:
        """(samples/s, verdict) on a CPU device with ``cores`` usable cores."""
        w = self.workers_on(cores)
        rate, side = expected_rate(self.cost_ms / 1e3, w, self.batch, self.step_ms / 1e3)
        if side == "cpu" and w >= cores:  # the workers have every core and want more
            return cores / (self.cost_ms / 1e3), "cores-bound"
        if w:
            cpu, step = w / (self.cost_ms / 1e3), self.batch / (self.step_ms / 1e3)
            if abs(cpu - step) / min(cpu, step) <= 0.05:
                return rate, "balanced"
        return rate, "step-bound" if side == "gpu" else "cpu-bound"

    def model(self):
        cls = BurnStepModel if self.step_cpu else FixedStepModel
        return cls(self.step_ms / 1e3, num_classes=self.outputs, tuple_output=self.tuple_output)


CASES = [
    Case("cpu: 10 ms/sample, 1 worker, 5 ms step", 10, 1, 8, 5),
    Case("step: 4 ms/sample, 1 worker, 80 ms step", 4, 1, 8, 80),
    Case("balanced: 200 vs 200 samples/s", 5, 1, 16, 80),
    Case("no workers: load and step add up", 2, 0, 8, 20),
    Case("user model of 10 outputs: 10 ms/sample, 1 worker", 10, 1, 8, 5, outputs=10),
    Case("tuple output (logits, aux): 80 ms step", 4, 1, 8, 80, tuple_output=True),
    # a batch of 16 beside an 80 ms step: the training process's own costs, which the known answer leaves out
    # (the burning step runs over its time, and receiving a batch from the worker costs too), put the rate a few
    # percent under 200; at 8 a batch beside 40 ms they weigh more: half the tolerance, and all of it beside a
    # test suite (docs/measured.md, "pipeprof validate")
    Case("CPU step: 80 ms of one core per batch of 16", 2, 1, 16, 80, step_cpu=True),
    Case("cores: more workers than cores", 10, None, 8, 5),
    # on a threshold: the loader alone 5% below the step (190 vs 200 samples/s), so the wait sits between
    # the step's 5% and the input's 20% and the isolated bounds are within their noise of each other
    Case("edge: loader 5% below the step", 5.25, 1, 16, 80, edge=("balanced", "cpu-bound")),
]


def _machine_cores() -> int:
    from pipeprof.env import usable_cores

    return int(usable_cores()["usable"])


def _compare(name: str, expected: tuple[float, str], run, edge: tuple[str, ...] = ()) -> dict:
    """The case's row: expected vs measured rate and verdict (either reading of a case on a threshold),
    the isolated-bound prediction, and how often the re-drawn windows agree with the answer.

    The known rate holds on cores no one else uses. Where the monitor saw other processes on the run's CPUs
    during the trial the verdict reads (``foreign_cores``), the rate may fall short by that much more: f
    cores taken from the side that binds, which uses at least one core, slow it by at most a share f (a
    burning CPU step beside a fraction of a foreign core fell beyond ±15%: docs/measured.md). Above, the
    tolerance stays ±15%."""
    verdict = (run.meta["analysis"]["verdicts"] or [{}])[0]
    sure = next((a.confidence for a in run.meta["analysis"]["groups"]), None) or Confidence()  # the first group's
    rate, side = expected
    side = " or ".join(edge) if edge else side
    measured = verdict.get("samples_per_s", float("nan"))
    err = measured / rate - 1
    foreign = verdict.get("foreign_cores")  # the monitor's mean over that trial, as the verdict read it
    foreign = 0.0 if foreign is None or foreign != foreign else float(foreign)
    low = (1 - RATE_TOLERANCE) * (1 - min(foreign, 1.0)) - 1
    right = verdict.get("verdict") in (edge or (expected[1],))
    return {
        "case": name,
        "expected_samples_per_s": rate,
        "measured_samples_per_s": measured,
        "rate_error_frac": err,
        "foreign_cores": foreign,
        "rate_low_frac": low,
        "expected_verdict": side,
        "reported_verdict": verdict.get("verdict"),
        "verdict_right": right,
        "answer_share": sure.answer_share,
        "also": ", ".join(verdict.get("also") or []),
        "verdict_basis": verdict.get("verdict_basis"),
        "predicted_samples_per_s": verdict.get("predicted_samples_per_s"),
        "prediction_error_frac": verdict.get("prediction_error_frac"),
        "passed": bool(right and low <= err <= RATE_TOLERANCE),
        "run": str(run.path),
    }


def run_case(case: Case, out_dir: str, measure: dict = MEASURE) -> dict:
    """Profile one case (all trial kinds a user dataset allows) and compare with its known answer.

    The calibrated steps are single-threaded by construction, so the step runs on one thread
    (``model.threads``): torch's idle pool would add milliseconds to each sleep's wake-up.
    ``measure``: the steady-state policy (``MeasureConfig`` fields); tests pass shorter windows.
    """
    from pipeprof.config import build
    from pipeprof.orchestrate.runner import execute

    cores = _machine_cores()
    cfg = build(
        {
            "name": "validate",
            "out_dir": out_dir,
            "device": "cpu",
            "measure": measure,
            "model": {"name": "user:calibrated", "num_classes": case.outputs, "threads": 1},
            "loader": {"num_workers": [case.workers_on(cores)], "batch_size": [case.batch]},
        }
    )
    run = execute(
        cfg,
        user_dataset=BurnDataset(512, case.cost_ms / 1e3),
        models={"user:calibrated": case.model},
        log=lambda *a: None,
    )
    return _compare(case.name, case.expected(cores), run, case.edge)


@dataclass(frozen=True)
class StorageCase:
    """ImageNet-like JPEGs behind a throttle of ``mb_s`` feeding a 5 ms step: io-bound at mb_s / file size."""

    name: str
    mb_s: float
    images: int = 64
    workers: int = 2
    batch: int = 8


STORAGE_CASES = [StorageCase("io: JPEGs behind a 20 MB/s throttle", 20.0)]


def run_storage_case(case: StorageCase, out_dir: str) -> dict:
    """Run the throttled source through the whole sweep; expected rate from the files' real mean size."""
    from pipeprof.config import build
    from pipeprof.data.sources.files import FileSource
    from pipeprof.data.synthetic import cached_dataset
    from pipeprof.orchestrate.runner import execute

    folder, _ = cached_dataset(f"{out_dir}/datasets", case.images, classes=4, seed=0)
    files = FileSource(folder)
    rate = case.mb_s * 1e6 / (files.total_bytes() / len(files))
    cfg = build(
        {
            "name": "validate-io",
            "out_dir": out_dir,
            "device": "cpu",
            "data": {
                "kind": "folder",
                "path": str(folder),
                "source": [{"kind": "throttled", "inner": "files", "mb_s": case.mb_s}],
            },
            "augment": {"preset": "light"},
            "model": {"name": "pipeprof.checks.calibrate:fixed_step_model_5ms", "threads": 1},
            "loader": {"num_workers": [case.workers], "batch_size": case.batch},
            "measure": MEASURE,
        }
    )
    run = execute(cfg, log=lambda *a: None)
    return _compare(case.name, (rate, "io-bound"), run)


def run_validation(
    out_dir: str = "out", cases=CASES, storage_cases=STORAGE_CASES, progress=lambda case: None
) -> pd.DataFrame:
    rows = []
    for case in cases:
        progress(case)
        rows.append(run_case(case, out_dir))
    for case in storage_cases:
        progress(case)
        rows.append(run_storage_case(case, out_dir))
    return pd.DataFrame(rows)
