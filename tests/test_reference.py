"""The machine's fixed-work CPU reference: real decodes in real processes, and its arithmetic."""

import pytest

from pipeprof.measure import reference
from pipeprof.report.console import reference_line


@pytest.mark.alone
def test_decode_rate_counts_real_decodes_in_each_process():
    one = reference.decode_rate(1, 0.3)
    two = reference.decode_rate(2, 0.3)
    assert one["processes"] == 1 and 20 < one["decodes_per_s"] < 5000  # ~100 KB JPEG: 0.2-50 ms each
    assert two["per_process_min"] <= two["per_process_mean"] <= two["per_process_max"]
    assert two["decodes_per_s"] == pytest.approx(2 * two["per_process_mean"])


def test_measure_takes_the_median_round_of_each_point():
    m = reference.measure(cores=2, seconds=0.6, rounds=3)
    assert [p["processes"] for p in m["points"]] == [1, 2]
    for p in m["points"]:
        assert p["rounds"] == 3 and p["decodes_per_s_min"] <= p["decodes_per_s"] <= p["decodes_per_s_max"]
    assert [p["processes"] for p in reference.measure(cores=1, seconds=0.2, rounds=1)["points"]] == [1]


def test_drift_is_the_largest_relative_change():
    start = {"points": [{"processes": 1, "decodes_per_s": 400.0}, {"processes": 16, "decodes_per_s": 5000.0}]}
    end = {"points": [{"processes": 1, "decodes_per_s": 300.0}, {"processes": 16, "decodes_per_s": 5500.0}]}
    d = reference.drift(start, end)
    assert d["by_processes"] == {1: pytest.approx(-0.25), 16: pytest.approx(0.10)}
    assert d["largest_frac"] == pytest.approx(-0.25)


def test_summary_line_names_start_end_and_drift():
    point = {"processes": 1, "decodes_per_s": 400.0}
    ref = {"start": {"points": [point]}, "end": {"points": [point | {"decodes_per_s": 300.0}]}}
    ref["drift"] = reference.drift(ref["start"], ref["end"])
    line = reference_line(ref)
    assert "start 1 proc 400/s" in line and "end 1 proc 300/s" in line and "drift -25.0%" in line
    assert reference_line({}) is None


@pytest.mark.parametrize("processes, seconds", [(0, 1.0), (1, 0.0)])
def test_bad_probe_settings_are_refused(processes, seconds):
    with pytest.raises(ValueError, match="processes must be >= 1 and seconds > 0"):
        reference.decode_rate(processes, seconds)
