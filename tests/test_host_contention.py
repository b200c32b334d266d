"""The suite's judgement of a timed test that failed while the hypervisor took the machine's CPUs (conftest): the
steal read from the kernel's own counters, and what an attempt's outcome and steal lead to."""

import time

import pytest

from conftest import RETRIES, HostClock, contended, next_step
from pipeprof.measure.noise import STEAL_MIN_PCT


def test_the_steal_is_a_share_of_the_cpu_time_since_the_clock_started():
    clock = HostClock()
    end = time.process_time() + 0.05
    while time.process_time() < end:  # some CPU time passes, so the share has a denominator
        pass
    steal = clock.steal_pct()
    assert steal is not None and 0.0 <= steal <= 100.0


def test_no_time_passed_is_no_share():
    clock = HostClock()
    clock.start = type(clock.start)(*(getattr(clock.start, f) + 1e9 for f in clock.start._fields))  # "ahead" of now
    assert clock.steal_pct() is None


@pytest.mark.parametrize(
    ("failed", "steal", "attempts", "budget", "expected"),
    [
        (False, 40.0, 1, 300.0, "done"),  # passed on a contended host: it stands
        (True, 0.2, 1, 300.0, "done"),  # failed on a quiet host: the failure stands, no rerun
        (True, None, 1, 300.0, "done"),  # no steal read (off Linux): nothing to blame it on
        (True, STEAL_MIN_PCT, 1, 300.0, "retry"),  # at the threshold: the host's
        (True, 10.6, RETRIES, 300.0, "retry"),
        (True, 10.6, RETRIES + 1, 300.0, "skip"),  # the reruns spent
        (True, 10.6, 1, 0.0, "skip"),  # this worker's rerun budget spent
    ],
)
def test_an_attempt_leads_to(failed, steal, attempts, budget, expected):
    assert next_step(failed, steal, attempts, budget) == expected


def test_the_threshold_is_the_one_pipeprof_names_steal_a_cause_at():
    """The run's own rule (``noise.causes``), not a second number of the suite's."""
    assert contended(STEAL_MIN_PCT) and contended(10.6)
    assert not contended(STEAL_MIN_PCT * 0.99) and not contended(0.0) and not contended(None)
