"""The unstable flag names its likely cause with the figure the monitor measured."""

from pipeprof.measure.noise import attribute, causes


def test_foreign_load_and_steal_are_named_with_their_figures():
    row = {
        "unstable": True,
        "unstable_reason": "95% interval ±7.3% of the median > ±5% after 15 windows",
        "foreign_cores_mean": 0.38,
        "cpu_steal_pct_mean": 9.2,
        "run_cores_mean": 1.0,
        "usable_cores": 2,
    }
    out = attribute(row)
    assert out["noise_cause"] == "foreign load"
    assert out["unstable_reason"].startswith("95% interval ±7.3%")
    assert "foreign load 38% of a core" in out["unstable_reason"] and "CPU steal 9%" in out["unstable_reason"]


def test_no_outside_cause_says_so_and_stable_rows_are_left_alone():
    quiet = {
        "unstable": True,
        "unstable_reason": "x",
        "foreign_cores_mean": 0.02,
        "cpu_steal_pct_mean": 0.0,
        "run_cores_mean": 0.5,
        "usable_cores": 2,
        "gpu_throttled_frac": None,
    }
    assert attribute(quiet)["noise_cause"] == "unseen"
    # 0.15 cores of kernel threads on a busy 32-core box is not a noisy neighbour
    assert attribute(quiet | {"foreign_cores_mean": 0.15, "usable_cores": 32})["noise_cause"] == "unseen"
    assert attribute(quiet | {"unstable": False}) == {}


def test_full_cores_and_gpu_throttling_count_as_causes():
    row = {"run_cores_mean": 15.8, "usable_cores": 16, "gpu_throttled_frac": 0.3}
    assert [c for c, _ in causes(row)] == ["cores full", "gpu throttled"]
