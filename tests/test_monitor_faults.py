"""Monitors never take the run down: NVML failing mid-run, and a sample that raises, while the monitor samples."""

import logging
import time
from types import SimpleNamespace

import pynvml
import pytest

from pipeprof.measure import monitors
from pipeprof.measure.monitors import Monitor

pytestmark = pytest.mark.one_core  # samples counted over a timed sleep (conftest)


@pytest.fixture
def one_gpu_that_is_lost(monkeypatch):
    """pynvml answering for one GPU whose utilisation query fails for good after ``ok_calls`` calls;
    its power is never reported (NotSupported on some boards: a field left empty, not a failure)."""
    calls = {"util": 0, "ok_calls": 5}

    def utilisation(handle):
        calls["util"] += 1
        if calls["util"] > calls["ok_calls"]:
            raise pynvml.NVMLError(pynvml.NVML_ERROR_GPU_IS_LOST)
        return SimpleNamespace(gpu=50, memory=10)

    def not_supported(*args):
        raise pynvml.NVMLError(pynvml.NVML_ERROR_NOT_SUPPORTED)

    for name, fn in {
        "nvmlInit": lambda: None,
        "nvmlShutdown": lambda: None,
        "nvmlDeviceGetCount": lambda: 1,
        "nvmlDeviceGetHandleByIndex": lambda i: f"gpu{i}",
        "nvmlDeviceGetUtilizationRates": utilisation,
        "nvmlDeviceGetMemoryInfo": lambda h: SimpleNamespace(used=2**30),
        "nvmlDeviceGetPowerUsage": not_supported,
        "nvmlDeviceGetTemperature": lambda h, kind: 41,
        "nvmlDeviceGetClockInfo": lambda h, kind: 1410,
        "nvmlDeviceGetCurrentClocksEventReasons": lambda h: 0,
    }.items():
        monkeypatch.setattr(pynvml, name, fn)
    return calls


def test_nvml_failing_mid_run_is_logged_once_and_empties_the_gpu_columns(one_gpu_that_is_lost, caplog):
    caplog.set_level(logging.WARNING, logger="pipeprof.measure.monitors")
    with Monitor(hz=50, gpu=True) as monitor:
        monitor.set_trial("t", "measure")
        time.sleep(0.8)
        assert monitor._thread.is_alive()  # still sampling after the failure
    tl = monitor.timeline()
    assert monitor.gpu_count == 1 and len(tl) >= 20
    before, after = tl.iloc[:5], tl.iloc[5:]
    assert (before["gpu0_util_pct"] == 50).all() and (before["gpu0_mem_used_mb"] == 1024).all()
    assert before["gpu0_power_w"].isna().all()  # a field the board does not report: empty, sampling goes on
    assert after["gpu0_util_pct"].isna().all() and after["gpu0_temp_c"].isna().all()
    assert after["cpu_util_pct"].notna().all() and after["trial_id"].eq("t").all()  # the rest is still measured
    assert "NVML failed mid-run" in monitor.gpu_error and "GPU is lost" in monitor.gpu_error
    assert "GPU columns are empty from then on" in monitor.gpu_error
    said = [r for r in caplog.records if "NVML failed mid-run" in r.getMessage()]
    assert len(said) == 1
    assert one_gpu_that_is_lost["util"] == 6  # no NVML call after the one that failed


def test_a_sample_that_raises_is_skipped_and_said_once(monkeypatch, caplog):
    caplog.set_level(logging.WARNING, logger="pipeprof.measure.monitors")
    real, failures = monitors.Monitor._disk_rate, {"left": 3}

    def flaky(self):
        if failures["left"] > 0:
            failures["left"] -= 1
            raise OSError("diskstats vanished")
        return real(self)

    monkeypatch.setattr(monitors.Monitor, "_disk_rate", flaky)
    with Monitor(hz=50, gpu=False) as monitor:
        time.sleep(0.5)
        assert monitor._thread.is_alive()
    assert failures["left"] == 0 and len(monitor.timeline()) >= 10
    said = [r for r in caplog.records if "a sample failed and was skipped" in r.getMessage()]
    assert len(said) == 1 and "diskstats vanished" in said[0].getMessage()
