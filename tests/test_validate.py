"""The issue's known answers through the whole tool: isolation trials, analysis and verdict.

10 ms of CPU per sample, 2 workers, batch 8: the CPU can prepare 200 samples/s.
A 5 ms step could take 1,600/s, so the run is cpu-bound at about 200/s; an 80 ms
step takes only 100/s, so the same loader is then gpu-bound at about 100/s.
"""
import pytest

from pipeprof.validate import Case, run_case


@pytest.mark.parametrize("step_ms, verdict, rate", [(5, "cpu-bound", 200.0), (80, "gpu-bound", 100.0)])
def test_verdict_and_rate_for_a_known_workload(tmp_path, step_ms, verdict, rate):
    case = Case(f"{verdict}", cost_ms=10, workers=2, batch=8, step_ms=step_ms)
    assert case.expected() == (pytest.approx(rate), verdict)
    row = run_case(case, str(tmp_path))
    assert row["reported_verdict"] == verdict
    assert row["measured_samples_per_s"] == pytest.approx(rate, rel=0.15)
    assert abs(row["prediction_error_frac"]) < 0.1
