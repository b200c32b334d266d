"""Tests for pipeprof.measure.monitors (fast: a few seconds in total)."""

import json
import multiprocessing as mp
import os
import subprocess
import sys
import threading
import time

import pandas as pd
import pytest
import torch

from pipeprof.measure.monitors import THROTTLE_MASK, Monitor, summarize


def _burn(seconds: float) -> None:
    end = time.perf_counter() + seconds
    x = 0
    while time.perf_counter() < end:
        x += 1


_BURNER = "import time\nt = time.time()\nwhile time.time() - t < {s}: pass"


def _burner(seconds: float) -> subprocess.Popen:
    """A real separate process that keeps one core busy for ``seconds``."""
    return subprocess.Popen([sys.executable, "-c", _BURNER.format(s=seconds)])


def _monitor_threads():
    return [t for t in threading.enumerate() if t.name == "pipeprof-monitor"]


@pytest.mark.one_core  # a monitor over a sleep
def test_rate_trial_switch_and_clean_stop():
    mon = Monitor(hz=50, gpu=False)
    mon.set_trial("a", "warmup")
    t0 = time.perf_counter()
    with mon:
        assert all(t.daemon for t in _monitor_threads()) and len(_monitor_threads()) == 1
        time.sleep(0.25)
        t_switch = time.perf_counter()
        mon.set_trial("b", "measure")
        t_switched = time.perf_counter()
        time.sleep(0.25)
    elapsed = time.perf_counter() - t0
    df = mon.timeline()
    expected = elapsed * 50
    assert 0.7 * expected <= len(df) <= 1.3 * expected
    assert df["t_s"].is_monotonic_increasing
    before, after = df[df["t_s"] < t_switch], df[df["t_s"] > t_switched]
    assert set(before["trial_id"]) == {"a"} and set(before["phase"]) == {"warmup"}
    assert set(after["trial_id"]) == {"b"} and set(after["phase"]) == {"measure"}
    assert len(before) > 5 and len(after) > 5
    assert not _monitor_threads()
    mon.stop()  # idempotent
    assert not _monitor_threads()


@pytest.mark.one_core  # a monitor over a sleep
def test_columns_and_sample_cost():
    with Monitor(hz=50, gpu=False) as mon:
        time.sleep(0.4)
    df = mon.timeline()
    import psutil

    for c in [
        "t_s",
        "cpu_util_pct",
        "main_cpu_pct",
        "main_rss_mb",
        "workers_cpu_pct",
        "workers_rss_mb",
        "n_workers_alive",
        "disk_read_mb_s",
        "sample_cost_ms",
    ]:
        assert c in df.columns
    for i in range(psutil.cpu_count()):
        assert f"cpu{i}_util_pct" in df.columns
    assert (df["main_rss_mb"] > 10).all()
    assert df["sample_cost_ms"].median() < 20


@pytest.mark.alone
@pytest.mark.filterwarnings("ignore:This process .* is multi-threaded:DeprecationWarning")
def test_tracked_worker_cpu_and_drop():
    ctx = mp.get_context("fork")
    child = ctx.Process(target=_burn, args=(1.0,), daemon=True)
    child.start()  # before the monitor thread exists: forking a threaded process is unsafe
    with Monitor(hz=50, gpu=False) as mon:
        mon.track_workers([child.pid])
        time.sleep(0.15)  # let psutil's per-process CPU delta settle
        t_run0 = time.perf_counter()
        time.sleep(0.6)
        t_run1 = time.perf_counter()
        child.join(timeout=5)
        time.sleep(0.15)
        t_dead = time.perf_counter()
        time.sleep(0.1)
    df = mon.timeline()
    running = df[(df["t_s"] >= t_run0) & (df["t_s"] <= t_run1)]
    assert len(running) > 10
    assert (running["n_workers_alive"] == 1).all()
    assert running["workers_cpu_pct"].mean() > 50
    assert (running["workers_rss_mb"] > 0).all()
    dead = df[df["t_s"] >= t_dead]
    assert len(dead) > 0 and (dead["n_workers_alive"] == 0).all()
    assert (dead["workers_cpu_pct"] == 0).all()


@pytest.mark.one_core  # a monitor over a sleep
def test_track_workers_ignores_bad_pids_and_clears():
    import os

    with Monitor(hz=50, gpu=False) as mon:
        mon.track_workers([os.getpid(), 2**22 + 12345])  # second pid does not exist
        time.sleep(0.1)
        t_before = time.perf_counter()
        mon.track_workers([])
        t_clear = time.perf_counter()
        time.sleep(0.1)
    df = mon.timeline()
    assert (df[df["t_s"] < t_before]["n_workers_alive"] == 1).all()
    assert (df[df["t_s"] > t_clear]["n_workers_alive"] == 0).all()


def test_no_gpu_columns_and_error_without_driver():
    if torch.cuda.is_available():
        pytest.skip("a GPU is present")
    with Monitor(hz=50, gpu=True) as mon:
        time.sleep(0.1)
        assert mon.gpu_error is not None
        assert mon.gpu_count == 0
    df = mon.timeline()
    assert len(df) > 0
    assert not [c for c in df.columns if c.startswith("gpu")]
    s = summarize(df, None)
    assert s["gpu_util_pct_mean"] is None and s["gpu_throttled_frac"] is None


def test_gpu_columns_on_gpu_machine():
    if not torch.cuda.is_available():
        pytest.skip("no GPU")
    with Monitor(hz=50) as mon:
        mon.set_trial("g")
        time.sleep(0.3)
    df = mon.timeline()
    assert mon.gpu_error is None and mon.gpu_count >= 1
    for f in ["util_pct", "mem_used_mb", "temp_c", "power_w", "sm_clock_mhz", "throttle_reasons"]:
        assert f"gpu0_{f}" in df.columns
    s = summarize(df, "g")
    assert s["gpu_power_w_mean"] > 0 and s["gpu_sm_clock_mhz_mean"] > 0


def _burn_window(tracked: bool) -> tuple[float, dict]:
    """Summary of a window while a separate process burns one core, and the highest
    foreign load of the idle windows just before and after it (other jobs on the machine)."""
    with Monitor(hz=20, gpu=False) as mon:
        mon.set_trial("before")
        time.sleep(0.4)
        mon.set_trial("burn")
        child = _burner(1.5)
        try:
            if tracked:
                mon.track_workers([child.pid])
            time.sleep(0.3)  # interpreter start-up, and psutil's CPU deltas settle
            t0 = time.perf_counter()
            time.sleep(0.8)
            t1 = time.perf_counter()
        finally:
            child.wait(timeout=10)
        mon.set_trial("after")
        time.sleep(0.3)
    df = mon.timeline()
    idle = [
        summarize(df, "before", df["t_s"].min() + 0.1)["foreign_cores_mean"],
        summarize(df, "after")["foreign_cores_mean"],
    ]
    return max(x or 0.0 for x in idle), summarize(df, "burn", t0, t1)


@pytest.mark.one_core  # a burner of one core on the run's own CPU
def test_untracked_process_is_foreign_load():
    _, s = _burn_window(tracked=False)
    assert s["monitor_samples"] > 8
    assert s["foreign_cores_mean"] > 0.5  # the burner used ~1 core
    assert s["run_cores_mean"] < 0.5  # the test process sleeps
    assert s["usable_busy_cores_mean"] >= s["foreign_cores_mean"]
    assert s["usable_cores"] == len(os.sched_getaffinity(0))


@pytest.mark.one_core  # a burner of one core on the run's own CPU
def test_tracked_worker_is_run_load_not_foreign():
    idle_foreign, s = _burn_window(tracked=True)
    assert s["run_cores_mean"] > 0.5
    # Other jobs on this small shared machine are foreign load too: allow what the idle
    # windows around the burner showed (0 on a quiet machine).
    assert s["foreign_cores_mean"] < 0.4 + idle_foreign


def test_steal_cpus_and_busy_cores_columns(tmp_path):
    with Monitor(hz=50, gpu=False) as mon:
        mon.set_trial("t")
        time.sleep(0.3)
    assert mon.cpus == sorted(os.sched_getaffinity(0))
    df = mon.timeline()
    for c in ["cpu_steal_pct", "usable_cpus", "usable_busy_cores", "run_cores", "foreign_cores"]:
        assert c in df.columns
    steal = df["cpu_steal_pct"]
    assert steal.isna().all() or steal.between(0, 100).all()  # None on a kernel without steal
    assert (df["usable_cpus"] == len(mon.cpus)).all()
    busy = sum(df[f"cpu{i}_util_pct"] for i in mon.cpus) / 100
    assert (df["usable_busy_cores"] - busy).abs().max() < 1e-9
    assert df["usable_busy_cores"].between(0, len(mon.cpus)).all()
    assert (df["foreign_cores"] >= 0).all()
    run = (df["main_cpu_pct"] + df["workers_cpu_pct"]) / 100
    assert (df["run_cores"] - run).abs().max() < 1e-9
    path = tmp_path / "timeline.parquet"  # a saved run's timeline summarises the same
    df.to_parquet(path)
    s = summarize(pd.read_parquet(path), "t")
    assert s["usable_cores"] == len(mon.cpus) and isinstance(s["usable_cores"], int)
    assert s["cpu_steal_pct_mean"] is None or 0 <= s["cpu_steal_pct_mean"] <= 100
    assert s["usable_busy_cores_mean"] is not None and s["run_cores_mean"] is not None
    json.dumps(s, allow_nan=False)


def _hand_built() -> pd.DataFrame:
    return pd.DataFrame(
        {
            "t_s": [0.0, 1.0, 2.0, 3.0, 4.0, 5.0],
            "trial_id": ["x", "x", "x", "x", "y", "y"],
            "phase": ["warmup", "measure", "measure", "measure", "measure", "measure"],
            "cpu_util_pct": [10.0, 20.0, 30.0, 40.0, 99.0, 99.0],
            "main_cpu_pct": [100.0, 50.0, 60.0, 70.0, 0.0, 0.0],
            "workers_cpu_pct": [0.0, 200.0, 300.0, None, 1.0, 1.0],
            "main_rss_mb": [100.0, 110.0, 120.0, 105.0, 999.0, 999.0],
            "workers_rss_mb": [0.0, 500.0, 700.0, 600.0, 1.0, 1.0],
            "disk_read_mb_s": [None, 10.0, 20.0, 30.0, 5.0, 5.0],
            "sample_cost_ms": [1.0, 2.0, 3.0, 4.0, 5.0, 6.0],
            "gpu0_util_pct": [0.0, 90.0, 80.0, 70.0, 1.0, 1.0],
            "gpu1_util_pct": [0.0, 60.0, None, 50.0, 1.0, 1.0],
            "gpu0_mem_used_mb": [1.0, 1000.0, 2000.0, 1500.0, 9e9, 9e9],
            "gpu1_mem_used_mb": [1.0, 3000.0, 100.0, 100.0, 9e9, 9e9],
            "gpu0_power_w": [50.0, 400.0, 500.0, 600.0, 1.0, 1.0],
            "gpu1_power_w": [50.0, 300.0, 300.0, 300.0, 1.0, 1.0],
            "gpu0_sm_clock_mhz": [300.0, 1980.0, 1900.0, 1800.0, 1.0, 1.0],
            "gpu1_sm_clock_mhz": [300.0, 1980.0, 1980.0, 1980.0, 1.0, 1.0],
            # row1: idle+app-clocks only (not throttled); row2: SW power cap on gpu1;
            # row3: HW thermal on gpu0; row0: idle.
            "gpu0_throttle_reasons": [0x1, 0x1 | 0x2, 0x0, 0x40, 0x4, 0x4],
            "gpu1_throttle_reasons": [0x1, 0x100, 0x4, 0x0, 0x4, 0x4],
            "cpu_steal_pct": [0.0, 2.0, None, 4.0, 50.0, 50.0],
            "usable_cpus": [8, 8, 8, 8, 2, 2],
            "usable_busy_cores": [1.0, 4.0, 5.0, 6.0, 2.0, 2.0],
            "run_cores": [1.0, 2.5, 3.6, None, 0.0, 0.0],
            "foreign_cores": [0.0, 1.5, 1.4, None, 2.0, 2.0],
        }
    )


def test_summarize_hand_built_window():
    s = summarize(_hand_built(), "x", t_start=1.0, t_end=3.0)  # rows 1..3 of trial x
    assert s["monitor_samples"] == 3
    assert s["cpu_util_pct_mean"] == pytest.approx(30.0)
    assert s["main_cpu_pct_mean"] == pytest.approx(60.0)
    assert s["workers_cpu_pct_mean"] == pytest.approx(250.0)  # None skipped
    assert s["main_rss_mb_max"] == 120.0
    assert s["workers_rss_mb_max"] == 700.0
    assert s["disk_read_mb_s_mean"] == pytest.approx(20.0)
    assert s["sample_cost_ms_mean"] == pytest.approx(3.0)
    assert s["gpu_util_pct_mean"] == pytest.approx((90 + 80 + 70 + 60 + 50) / 5)
    assert s["gpu_mem_used_mb_max"] == 3000.0
    assert s["gpu_power_w_mean"] == pytest.approx((400 + 500 + 600 + 300 * 3) / 6)
    assert s["gpu_sm_clock_mhz_mean"] == pytest.approx((1980 + 1900 + 1800 + 1980 * 3) / 6)
    assert s["gpu_throttled_frac"] == pytest.approx(2 / 3)
    assert s["cpu_steal_pct_mean"] == pytest.approx(3.0)  # None skipped
    assert s["usable_busy_cores_mean"] == pytest.approx(5.0)
    assert s["run_cores_mean"] == pytest.approx(3.05)
    assert s["foreign_cores_mean"] == pytest.approx(1.45)
    assert s["usable_cores"] == 8
    json.dumps(s, allow_nan=False)


def test_summarize_whole_trial_and_missing():
    df = _hand_built()
    s = summarize(df, "x")
    assert s["monitor_samples"] == 4
    assert s["cpu_util_pct_mean"] == pytest.approx(25.0)
    assert s["disk_read_mb_s_mean"] == pytest.approx(20.0)
    assert s["gpu_throttled_frac"] == pytest.approx(2 / 4)
    none = summarize(df, "nope")
    assert none["monitor_samples"] == 0
    assert all(v is None for k, v in none.items() if k != "monitor_samples")
    no_gpu = summarize(df[[c for c in df.columns if not c.startswith("gpu")]], "y")
    assert no_gpu["gpu_util_pct_mean"] is None and no_gpu["gpu_throttled_frac"] is None
    assert no_gpu["cpu_util_pct_mean"] == pytest.approx(99.0)
    empty = summarize(Monitor(hz=10).timeline(), "x")
    assert empty["monitor_samples"] == 0
    for k in ["cpu_steal_pct_mean", "foreign_cores_mean", "run_cores_mean", "usable_busy_cores_mean", "usable_cores"]:
        assert empty[k] is None
    json.dumps(none, allow_nan=False)


def test_throttle_mask_bits():
    assert THROTTLE_MASK & 0x1 == 0 and THROTTLE_MASK & 0x2 == 0 and THROTTLE_MASK & 0x100 == 0
    assert THROTTLE_MASK & 0x4 and THROTTLE_MASK & 0x40


def test_invalid_hz():
    with pytest.raises(ValueError):
        Monitor(hz=0)


def test_windows_cpu_means_only_the_rows_inside_one_sides_windows():
    import pandas as pd

    from pipeprof.measure.monitors import windows_cpu

    # a pair's rows at 10 Hz: side A's windows at [0, 1] and [3, 4] ran 400% / 50%, side B's [1.5, 2.5] 800% / 90%
    t = [i / 10 for i in range(41)]
    a = [(0.0, 1.0), (3.0, 4.0)]
    side_a = [any(x <= s <= y for x, y in a) for s in t]
    tl = pd.DataFrame(
        {
            "t_s": t,
            "trial_id": ["pair"] * len(t),
            "workers_cpu_pct": [400.0 if s else 800.0 for s in side_a],
            "main_cpu_pct": [50.0 if s else 90.0 for s in side_a],
        }
    )
    tl.loc[5, ["trial_id", "workers_cpu_pct"]] = ["other", 1e6]  # another trial's row inside a window: not the pair's
    assert windows_cpu(tl, "pair", a) == {"workers_cpu_pct": 400.0, "main_cpu_pct": 50.0}
    assert windows_cpu(tl, "pair", [(1.5, 2.5)]) == {"workers_cpu_pct": 800.0, "main_cpu_pct": 90.0}
    assert windows_cpu(tl, "pair", [(10.0, 11.0)]) == {"workers_cpu_pct": None, "main_cpu_pct": None}
