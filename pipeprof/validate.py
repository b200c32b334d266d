"""``pipeprof validate``: run workloads whose answer is known and compare.

A benchmark, not a test: it prints, for each calibrated workload (see
``calibrate``; and a throttled source of set bandwidth), the expected and measured samples/s, the expected and reported
verdict, and the prediction error, so anyone can check pipeprof's accuracy on
their own machine. Cases use at most 2 workers so a 2-core machine can run them.
"""
from __future__ import annotations

from dataclasses import dataclass

import pandas as pd

from .calibrate import BurnDataset, FixedStepModel, expected_rate, single_threaded

MEASURE = {"warmup_batches": 3, "warmup_s": 0.5, "window_s": 0.75, "window_batches": 3, "windows": 4,
           "cv_unstable": 0.1, "cpu_reference_s": 0}  # the cases' own known costs are the reference


@dataclass(frozen=True)
class Case:
    """A BurnDataset (``cost_ms`` of CPU per sample) feeding a FixedStepModel (``step_ms`` per batch)."""

    name: str
    cost_ms: float
    workers: int
    batch: int
    step_ms: float

    def expected(self) -> tuple[float, str]:
        rate, side = expected_rate(self.cost_ms / 1e3, self.workers, self.batch, self.step_ms / 1e3)
        if self.workers:
            cpu, gpu = self.workers / (self.cost_ms / 1e3), self.batch / (self.step_ms / 1e3)
            if abs(cpu - gpu) / min(cpu, gpu) <= 0.05:
                return rate, "balanced"
        return rate, f"{side}-bound"


CASES = [
    Case("cpu: 10 ms/sample, 2 workers, 5 ms step", 10, 2, 8, 5),
    Case("gpu: same, 80 ms step", 10, 2, 8, 80),
    Case("cpu: 1 worker", 10, 1, 8, 5),
    Case("balanced: 400 vs 400 samples/s", 5, 2, 16, 40),
    Case("no workers: load and step add up", 2, 0, 8, 20),
]


def run_case(case: Case, out_dir: str) -> dict:
    """Profile one case (all trial kinds a user dataset allows) and compare with its known answer."""
    import pipeprof

    with single_threaded():
        run = pipeprof.profile(BurnDataset(512, case.cost_ms / 1e3), model=FixedStepModel(case.step_ms / 1e3),
                               batch_size=case.batch, num_workers=[case.workers], measure=MEASURE,
                               out_dir=out_dir, name="validate", device="cpu", log=lambda *a: None)
    verdict = (run.meta["analysis"]["verdicts"] or [{}])[0]
    rate, side = case.expected()
    measured = verdict.get("samples_per_s", float("nan"))
    return {"case": case.name, "expected_samples_per_s": rate, "measured_samples_per_s": measured,
            "rate_error_frac": measured / rate - 1, "expected_verdict": side,
            "reported_verdict": verdict.get("verdict"), "predicted_samples_per_s": verdict.get("predicted_samples_per_s"),
            "prediction_error_frac": verdict.get("prediction_error_frac"), "run": str(run.path)}


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
    import pipeprof
    from .config import build
    from .data.sources.files import FileSource
    from .data.synthetic import cached_dataset

    folder, _ = cached_dataset(f"{out_dir}/datasets", case.images, classes=4, seed=0)
    files = FileSource(folder)
    rate = case.mb_s * 1e6 / (files.total_bytes() / len(files))
    cfg = build({"name": "validate-io", "out_dir": out_dir, "device": "cpu",
                 "data": {"kind": "folder", "path": str(folder),
                          "source": [{"kind": "throttled", "inner": "files", "mb_s": case.mb_s}]},
                 "augment": {"preset": "light"}, "model": {"name": "pipeprof.calibrate:fixed_step_model_5ms"},
                 "loader": {"num_workers": [case.workers], "batch_size": case.batch}, "measure": MEASURE})
    with single_threaded():
        run = pipeprof.run(cfg, log=lambda *a: None)
    verdict = (run.meta["analysis"]["verdicts"] or [{}])[0]
    measured = verdict.get("samples_per_s", float("nan"))
    return {"case": case.name, "expected_samples_per_s": rate, "measured_samples_per_s": measured,
            "rate_error_frac": measured / rate - 1, "expected_verdict": "io-bound",
            "reported_verdict": verdict.get("verdict"), "predicted_samples_per_s": verdict.get("predicted_samples_per_s"),
            "prediction_error_frac": verdict.get("prediction_error_frac"), "run": str(run.path)}


def run_validation(out_dir: str = "out", cases=CASES, storage_cases=STORAGE_CASES,
                   progress=lambda case: None) -> pd.DataFrame:
    rows = []
    for case in cases:
        progress(case)
        rows.append(run_case(case, out_dir))
    for case in storage_cases:
        progress(case)
        rows.append(run_storage_case(case, out_dir))
    return pd.DataFrame(rows)
