"""Shared fixtures, and how tests share this machine's cores. Every test must leave no monitor thread or
worker process behind.

The suite runs on two xdist workers (README: ``pytest -q -n 2 --maxschedchunk 1``). Many tests measure real
DataLoader workers and real CPU work, and a test running beside them would load the cores they time (the
monitor even counts its processes as foreign load). So the workers share the machine through a lock per CPU
(``CoreLock``), taken in one of three modes:

- shared: an ordinary test holds every CPU's lock shared, beside any other ordinary test;
- exclusive: a test marked ``alone`` holds every CPU's lock exclusively, with no other test running anywhere;
- lane: a test marked ``one_core`` holds its xdist worker's own CPU exclusively and runs pinned to it (its
  threads, and every process it starts, inherit the mask), beside another ``one_core`` test pinned to the other
  CPU. The monitor counts load on the run's own CPUs only (``Monitor.cpus``), so the neighbour is not foreign
  load, and the run sees one usable core, as a user's run inside ``taskset -c N`` does.

The lock cannot keep the hypervisor off the cores: a timed test that fails while the host takes CPU time (steal) is
rerun, then reported skipped with the steal measured ("the host's contention", below).

Waiting writers go first (a turnstile), so an ``alone`` test never starves. Without xdist (``-n 0``,
``-p no:xdist``, one file run by hand) the lock does nothing and ``one_core`` tests run unpinned; on a machine of
one CPU a lane is the whole machine (exclusive).

Which tests are ``alone`` (the rule; when unsure, ``alone``):

- ``alone``: the test, or a fixture it sets up, measures something whose value an assertion checks against
  time: a rate, a share or ratio of time (data wait, cost, overhead, foreign cores), a verdict or bound, a
  sizing or core count, a search decision taken on measured rates, a sampling interval or count per second,
  or a wall-clock bound tight enough that a second test on the other core could break it (within about 10x
  of what the work takes); and a test that asserts the monitor saw no foreign load.
- ``one_core`` instead of ``alone``: such a test whose work fits one core and whose expected values hold on a
  machine of one core, by construction: the time is known sleeps (a step, a read, a time-out) with at most a
  small known CPU cost beside them, the expected answer is computed from the usable cores (``validate``'s
  cases), or two sides are measured alike in turn on the same core and only their ratio is checked (the
  hand-off trial against a hand-written loop). Not a test that needs two processes to burn CPU at once at a
  known rate (on one core they take turns: two workers of 6 ms sleeps beside a 2 ms step read 275 of 333
  samples/s there), nor one whose answer depends on there being two cores (a worker search doubles only up
  to the usable cores; a CPU step beside a worker).
- shared: logic on tables of known content, errors and their messages, files and folders, signals, kills and
  resumes, report rendering, config validation, distributed plumbing; runs whose measured figures no assertion
  reads beyond "> 0" or a bound that holds at any speed (a share within 0-1); and tests that only read what a
  measurement saved under a lock of its own (``measured_once``). A wall-clock bound of 10x and more over the
  work is a hang guard, not a timing check: shared.

A module that times throughout is marked with ``pytestmark = pytest.mark.alone``, single tests with
``@pytest.mark.alone`` (or ``one_core``). A fixture that measures a run several tests read makes it with
``measured_once``: under the exclusive lock (or in a lane), and once for the test run, not once per worker.

Order: under xdist every worker sorts the tests alike (``phase``): the ``alone`` ones first; then, in lanes,
the first reader of each run measured in a lane (``MEASURED``: ``cpu_run_dir``, one worker measures it while
the other runs ``one_core`` tests), the other ``one_core`` tests, and the other readers of those runs; then the
shared ones, the other readers of those runs first (by then the lanes have measured them; one of them runs the
watched job again plainly, 6-9 s mostly asleep: last, it was the suite's tail with the other core idle).
Within a phase the tests marked ``slow`` (8 s or more) come first, as a scheduler of unequal jobs on two machines
starts the long ones first: a phase ends when its last test does, and a long one started last kept the other worker
idle at the phase's end or the suite's (8.5 s once, where the lanes turned into the shared phase). ``--maxschedchunk
1`` hands them out in that order a test or two at a time, so both workers take the ``alone`` tests in turn, then the
lanes side by side, then the shared ones in parallel (``pytest -n 2`` alone hands each worker a long run of
consecutive tests: correct, only slower). A worker done with its alone tests waits for the other's before it starts
a lane or a shared test (``_after_the_alone_tests``), and the first reader of a run measured in a lane holds that
lane from its start.
"""

from __future__ import annotations

import compileall
import contextlib
import fcntl
import functools
import gc
import hashlib
import http.server
import io
import os
import pickle
import socket
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

os.environ.setdefault("NO_ALBUMENTATIONS_UPDATE", "1")
# the suite keeps its compiled modules where PYTHONDONTWRITEBYTECODE is set (as on this workplace's machines): else
# each xdist worker compiles pytest's rewritten test modules at every run (a collection took 8.8 s here, 5.9 s on a
# run after one that kept them), and each of the suite's 40-odd interpreters its share of pipeprof (0.35 s of CPU in
# a `pipeprof run`'s imports); pipeprof's are compiled in pytest_configure, before any worker or subprocess starts
sys.dont_write_bytecode = False

import psutil  # noqa: E402
import pytest  # noqa: E402
from _pytest.runner import runtestprotocol  # noqa: E402 - as pytest-rerunfailures reruns a test

from pipeprof.config import MeasureConfig  # noqa: E402
from pipeprof.measure.noise import causes  # noqa: E402


def _pin(cpus: set[int]) -> None:
    """Every thread of this process on ``cpus`` (``sched_setaffinity(0)`` moves only the calling thread; an
    intra-op pool started by an earlier test would stay on the other CPU)."""
    for tid in os.listdir("/proc/self/task"):
        try:
            os.sched_setaffinity(int(tid), cpus)
        except (ProcessLookupError, PermissionError):  # a thread that ended meanwhile
            pass


class CoreLock:
    """A machine-wide lock per CPU (``fcntl.flock`` on files in a folder the xdist workers of one run share),
    taken shared, exclusive or as a lane (see the module). Every taker first holds the turnstile, and keeps it
    while it waits, so no new taker gets in meanwhile (an ``alone`` test cannot starve); the CPUs' locks are
    taken in one order, so two takers cannot each hold what the other waits for. ``hold`` nests: another mode
    inside a hold drops the outer one first (an upgrade in place could deadlock against the other worker's) and
    takes it back after."""

    def __init__(self, folder: Path, worker: int):
        folder.mkdir(parents=True, exist_ok=True)
        self.cpus = sorted(os.sched_getaffinity(0))
        self.locks = [open(folder / f"cpu{c}.lock", "a+") for c in self.cpus]  # noqa: SIM115 - held for life
        self.turnstile = open(folder / "turnstile.lock", "a+")  # noqa: SIM115
        self.lane = worker % len(self.cpus) if len(self.cpus) > 1 else None  # this worker's CPU, by index
        self.mode: str | None = None

    def _take(self, mode: str) -> None:
        if mode == "lane" and self.lane is None:
            mode = "exclusive"  # one CPU: a lane is the whole machine
        fcntl.flock(self.turnstile, fcntl.LOCK_EX)
        try:
            if mode == "lane":
                fcntl.flock(self.locks[self.lane], fcntl.LOCK_EX)
            else:
                for lock in self.locks:
                    fcntl.flock(lock, fcntl.LOCK_EX if mode == "exclusive" else fcntl.LOCK_SH)
        finally:
            fcntl.flock(self.turnstile, fcntl.LOCK_UN)
        if mode == "lane":
            _pin({self.cpus[self.lane]})
        self.mode = mode

    def _drop(self) -> None:
        if self.mode == "lane":
            _pin(set(self.cpus))
        for lock in self.locks:
            fcntl.flock(lock, fcntl.LOCK_UN)
        self.mode = None

    @contextlib.contextmanager
    def hold(self, mode: str | None):
        """``mode`` for the block (None: nothing held, e.g. while waiting for another worker's measurement)."""
        before = self.mode
        if before == mode or (before == "exclusive" and mode is not None):
            yield
            return
        if before is not None:
            self._drop()
        if mode is not None:
            self._take(mode)
        try:
            yield
        finally:
            if self.mode is not None:
                self._drop()
            if before is not None:
                self._take(before)


class _NoLock:
    """Not under xdist: one test at a time anyway."""

    @contextlib.contextmanager
    def hold(self, mode: str | None):
        yield


CORES: CoreLock | _NoLock = _NoLock()
SHARED: Path | None = None  # the folder this run's xdist workers share (None without xdist)


def pytest_configure(config):
    global CORES, SHARED
    config.pluginmanager.register(MeasuredRuns(), "pipeprof-measured-runs")
    if not hasattr(config, "workerinput"):
        # compiled once here, read by every interpreter the tests start (they keep the environment's setting)
        compileall.compile_dir(Path(__file__).parent.parent / "pipeprof", quiet=1)
        # the timed tests run first: not beside the kernel writing back what was just installed or built (CI runs
        # the tests straight after `pip install`; the hand-off test, early, once read 2,850 against 1,988/s)
        os.sync()
    else:
        # xdist gives each local worker <the controller's basetemp>/popen-gwN: the parent is the run's own folder
        SHARED = (
            Path(config.option.basetemp).parent
            if config.option.basetemp
            else Path(tempfile.gettempdir()) / f"pipeprof-tests-{config.workerinput['testrunuid']}"
        ) / "shared"
        CORES = CoreLock(SHARED, int(config.workerinput["workerid"].removeprefix("gw")))
        # one intra-op thread for the torch work a test does in this process (a Step, a model's forward): beside
        # the other worker's test, a second OpenMP thread finds its core taken and spins (a googlenet step of a
        # test that checks its output took 5.2 s of CPU there, 0.2 s on one thread); and a lane pins every thread
        # to one CPU. pipeprof's trials set their step's threads themselves (measure.confounders.step_threads)
        # and put this setting back after; the processes the tests start keep torch's own default
        import torch

        torch.set_num_threads(1)


@pytest.hookimpl(trylast=True)
def pytest_unconfigure(config):
    """The interpreter's exit need not walk every object the tests made (torch and its compiler, pandas, the run
    tables): frozen, they are still freed by reference count, only not collected, as ``python -m pipeprof`` ends
    (``pipeprof/__main__.py``). Each xdist worker took 2-4 s from its last test to its exit, the suite's tail."""
    gc.freeze()


def mode_of(item) -> str:
    return (
        "exclusive" if item.get_closest_marker("alone") else "lane" if item.get_closest_marker("one_core") else "shared"
    )


# fixtures made by measured_once in a lane, whose readers are ordered around them (``phase``); the lock each is
# measured under
MEASURED = {"cpu_run_dir": "lane", "raised": "lane", "storage_run": "lane"}


def phase(item, first_readers: set) -> tuple[int, int]:
    """(0, 0): alone. (1, ...): the lanes: first the first reader of each run measured in a lane, then the
    one_core tests that read none, then its other one_core readers (by then it is measured: a reader that came
    while it was measured would wait, its lane idle). (2, 0): the other shared readers of measured runs; (2, 1): the
    other shared tests."""
    mode, reads = mode_of(item), bool(set(MEASURED) & set(item.fixturenames))
    if mode == "exclusive":
        return 0, 0
    if item.nodeid in first_readers:
        return 1, 0
    if mode == "lane":
        return 1, 2 if reads else 1
    return (2, 0) if reads else (2, 1)


ALONE: set[str] = set()  # this run's ``alone`` tests (every worker collects the same)
FIRST_READERS: dict[str, str] = {}  # the first reader of each run measured in a lane (``phase``): its mode


@pytest.hookimpl(tryfirst=True)
def pytest_collection_finish(session):  # before xdist's worker reports the order it collected
    if hasattr(session.config, "workerinput"):  # the same stable order on every worker
        first = {
            next(i.nodeid for i in session.items if name in i.fixturenames): mode
            for name, mode in MEASURED.items()
            if any(name in i.fixturenames for i in session.items)
        }
        session.items.sort(key=lambda i: (*phase(i, set(first)), not i.get_closest_marker("slow")))
        ALONE.update(i.nodeid for i in session.items if mode_of(i) == "exclusive")
        FIRST_READERS.update(first)


STALL_S = 120.0  # no alone test ended for this long: a worker died mid-test (xdist replaces it): stop waiting


def _alone_done(nodeid: str) -> Path:
    return SHARED / "alone-done" / hashlib.sha1(nodeid.encode()).hexdigest()


def _after_the_alone_tests() -> None:
    """Wait until every ``alone`` test has ended, on any worker. Without it the first worker done with its
    alone tests starts a lane (or a lane-measured fixture: the CPU run, 23 s) while the other still has an alone
    test queued, which then waits for that lane with its core idle (seen: 23 s at the phases' turn). No worker
    holds a later test ahead of an alone one (xdist hands tests out in the sorted order), so the wait ends."""
    if SHARED is None or not ALONE:
        return
    done, since = -1, time.monotonic()
    while True:
        now = sum(_alone_done(n).exists() for n in ALONE)
        if now == len(ALONE) or time.monotonic() - since > STALL_S:
            ALONE.clear()  # once is enough
            return
        if now != done:
            done, since = now, time.monotonic()
        time.sleep(0.1)


def lock_mode(item) -> str:
    """The lock ``item`` runs under: its marker's, or the lane's of the run measured in a lane it reads first."""
    mode = mode_of(item)
    return FIRST_READERS[item.nodeid] if mode == "shared" and item.nodeid in FIRST_READERS else mode


@contextlib.contextmanager
def under_the_lock(item):
    """Setup, call and teardown (the module and session fixtures set up for this test included) under the lock;
    the other tests after every alone one. The first reader of a run measured in a lane holds the lane
    throughout: holding every CPU shared first, it waited for the other worker's lane test (7 s seen) before
    its fixture dropped that hold for the lane."""
    mode = lock_mode(item)
    if mode != "exclusive":
        _after_the_alone_tests()
    try:
        with CORES.hold(mode):
            yield
    finally:
        if mode == "exclusive" and SHARED is not None:
            _alone_done(item.nodeid).parent.mkdir(exist_ok=True)
            _alone_done(item.nodeid).touch()


# ---- the host's contention: a timed test's failure on a host that took its CPUs away --------------------------
#
# The lock keeps the suite's own tests off each other's cores; it cannot keep the hypervisor off them. On these
# shared virtual machines the host at times takes CPU time from the guest (steal), and the timed tests fail together
# (docs/measured.md, "The test suite"). So the host's steal is measured over every attempt of a timed test, and over
# the making of each measured run a test reads (``measured_once``). An assertion or a time-out in an attempt whose
# steal is one pipeprof itself names a cause (``noise.causes``) is the host's, not the test's. The test runs again,
# up to RETRIES more times while this worker's reruns have taken less than RETRY_BUDGET_S (not when the contended
# part was a measured run it read: a rerun reads the same run). Still failing on a contended host, it is reported
# skipped, with the steal of each attempt and its failure's first line. A failure on a quiet host fails at once, as
# does any other error on any host. The terminal summary lists every test that was rerun or skipped so.

RETRIES = 2
RETRY_BUDGET_S = 300.0  # per xdist worker: a host contended throughout (hours, seen) costs this much, not more
RETRY_PAUSE_S = 5.0  # between attempts: contention comes in bursts


def _cpu_total(t) -> float:
    # guest time is already in user and nice (psutil reads /proc/stat as the kernel writes it)
    return sum(t) - getattr(t, "guest", 0.0) - getattr(t, "guest_nice", 0.0)


class HostClock:
    """The hypervisor's steal since this was made: a percentage of all CPUs' time (None without a steal field, as
    off Linux, or when no time passed)."""

    def __init__(self):
        self.start = psutil.cpu_times()

    def steal_pct(self) -> float | None:
        end = psutil.cpu_times()
        total = _cpu_total(end) - _cpu_total(self.start)
        if not hasattr(end, "steal") or total <= 0:
            return None
        return 100.0 * (end.steal - self.start.steal) / total


def contended(steal: float | None) -> bool:
    """Whether pipeprof would name this steal a cause of a trial's spread: the run's own threshold."""
    return steal is not None and any(cause == "steal" for cause, _ in causes({"cpu_steal_pct_mean": steal}))


def next_step(call_failed: bool, steal: float | None, attempts: int, budget_left_s: float) -> str:
    """After an attempt of a timed test: "done" (passed, or failed on a quiet host: the result stands), "retry"
    (failed on a contended host, with attempts and budget left) or "skip" (failed on a contended host, none left)."""
    if not call_failed or not contended(steal):
        return "done"
    return "retry" if attempts <= RETRIES and budget_left_s > 0 else "skip"


_MAKING: list[list[float | None]] = []  # per fixture being set up: the steal of each measured run it made or read
_FIXTURE_STEAL: dict[str, float] = {}  # fixture name -> the host's steal while its measured run was made
_RETRIED_S = 0.0  # this worker's time in reruns so far


def _made_with_steal(steal: float | None) -> None:
    if _MAKING:
        _MAKING[-1].append(steal)


class MeasuredRuns:
    """Which fixture's value came with a measured run (``measured_once``), and the steal while it was made: a later
    test that reads the cached value is judged by it. A plugin of its own (``pytest_configure`` registers it), not a
    hook of this conftest: a session fixture (``cpu_run_dir``) is set up under the session's hooks, which a conftest
    below the rootdir is not among, and its readers' failures went unjudged."""

    @pytest.hookimpl(wrapper=True)
    def pytest_fixture_setup(self, fixturedef, request):
        _MAKING.append([])
        try:
            return (yield)
        finally:
            made = [s for s in _MAKING.pop() if s is not None]
            if made:
                _FIXTURE_STEAL[fixturedef.argname] = max(made)


# what a timed test's call raised: an assertion on a measured value or a time-out can be the host's doing; any other
# error (a TypeError, a crash) is the code's, on any host
_RAISED = pytest.StashKey[type]()
HOSTS_DOING = (AssertionError, subprocess.TimeoutExpired)


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(item, call):
    if call.when == "call":
        item.stash[_RAISED] = type(None) if call.excinfo is None else call.excinfo.type
    return (yield)


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_protocol(item, nextitem):
    """pytest's own protocol (setup, call, teardown, reported once) under the lock, with the reruns and the skip
    above: every attempt under the same hold."""
    with under_the_lock(item):
        _judged_protocol(item, nextitem, timed=lock_mode(item) != "shared")
    return True


def _judged_protocol(item, nextitem, timed: bool) -> None:
    global _RETRIED_S
    item.ihook.pytest_runtest_logstart(nodeid=item.nodeid, location=item.location)
    steals, attempts = [], 0
    while True:
        attempts += 1
        host, started = HostClock(), time.monotonic()
        # pytest's whole protocol each time: a module's fixtures torn down after its last test are set up again
        reports = runtestprotocol(item, nextitem=nextitem, log=False)
        own = host.steal_pct() if timed else None
        read = [_FIXTURE_STEAL[n] for n in item.fixturenames if _FIXTURE_STEAL.get(n) is not None]
        steal = max([s for s in (own, *read) if s is not None], default=None)
        steals.append(steal)
        call = next((r for r in reports if r.when == "call"), None)
        measured_wrong = call is not None and call.failed and issubclass(item.stash.get(_RAISED, type), HOSTS_DOING)
        step = next_step(measured_wrong, steal, attempts, RETRY_BUDGET_S - _RETRIED_S)
        # a rerun makes no measured run again: one made on a contended host reads the same the next time
        if step == "retry" and contended(own) and not any(contended(s) for s in read):
            time.sleep(RETRY_PAUSE_S)
            _RETRIED_S += time.monotonic() - started
            continue
        break
    seen = ", ".join("?" if s is None else f"{s:.1f}%" for s in steals)
    if step != "done":  # failed on a contended host: no rerun left, or none would help (a measured run it read)
        crash = getattr(call.longrepr, "reprcrash", None)
        first = (crash.message if crash else str(call.longrepr)).strip().splitlines()[0][:200]
        path, line = item.reportinfo()[:2]
        call.outcome = "skipped"
        call.longrepr = (
            os.fspath(path),
            (line or 0) + 1,
            f"Skipped: the host was contended (steal {seen} of the CPU time in {attempts} attempt(s)): a timed test "
            f"cannot tell its own failure from the host's: {first}",
        )
    if attempts > 1 or step != "done":
        call.user_properties.append(("host_contention", f"{call.outcome} after {attempts} attempt(s), steal {seen}"))
    for report in reports:
        item.ihook.pytest_runtest_logreport(report=report)
    item.ihook.pytest_runtest_logfinish(nodeid=item.nodeid, location=item.location)


_CONTENDED: list[tuple[str, str]] = []  # (test, what happened): collected where the reports arrive


def pytest_runtest_logreport(report):
    _CONTENDED.extend((report.nodeid, v) for k, v in report.user_properties if k == "host_contention")


def pytest_terminal_summary(terminalreporter):
    if _CONTENDED:
        terminalreporter.section("timed tests on a contended host (steal: the hypervisor's share of the CPU time)")
        for nodeid, what in _CONTENDED:
            terminalreporter.line(f"{nodeid}: {what}")


def measured_once(name: str, make, tmp_path_factory, mode: str = "exclusive", timed: bool = True):
    """``make(folder)``'s value, measured under the lock in ``mode`` (exclusive, or lane: pinned to one CPU) and
    once for the whole test run: under xdist the first worker to need it measures it in the folder the workers
    share and leaves it there pickled; the other waits for it, holding no lock meanwhile, then reads the pickle.
    For a fixture whose run several tests read (or whose data: the storage sweep's JPEGs, ``timed=False``).
    The host's steal while ``make`` ran goes with the value: its readers' failures are judged by it too
    (``pytest_runtest_protocol``)."""
    if SHARED is None:
        with CORES.hold(mode):
            host = HostClock()
            value = make(tmp_path_factory.mktemp(name))
        if timed:
            _made_with_steal(host.steal_pct())
        return value
    done = SHARED / f"{name}.pickle"
    if not done.exists():
        # one maker at a time per name; the waiter gives up its own lock first, or it could hold a CPU the maker
        # needs while it waits for the maker
        with CORES.hold(None), open(SHARED / f"{name}.making", "a+") as making:
            fcntl.flock(making, fcntl.LOCK_EX)
            if not done.exists():  # the other worker may have measured it while this one waited
                with CORES.hold(mode):
                    host = HostClock()
                    value = make(Path(tempfile.mkdtemp(prefix=f"{name}-", dir=SHARED)))
                    steal = host.steal_pct()
                done.with_suffix(".tmp").write_bytes(pickle.dumps((value, steal)))
                done.with_suffix(".tmp").rename(done)  # whole, or not there
    value, steal = pickle.loads(done.read_bytes())
    if timed:
        _made_with_steal(steal)
    return value


@pytest.fixture(autouse=True)
def no_leftovers():
    """Fail a test that leaks a monitor thread or a DataLoader worker."""
    yield
    threads = [t.name for t in threading.enumerate() if t.name.startswith("pipeprof")]
    children = [
        p for p in psutil.Process().children(recursive=True) if p.is_running() and p.status() != psutil.STATUS_ZOMBIE
    ]
    for p in children:  # give workers being torn down a moment before calling it a leak
        try:
            p.wait(timeout=5)
        except psutil.TimeoutExpired:
            pass
    alive = [p.pid for p in children if p.is_running() and p.status() != psutil.STATUS_ZOMBIE]
    assert not threads, f"monitor threads left running: {threads}"
    assert not alive, f"worker processes left running: {alive}"


@pytest.fixture(scope="session")
def tiny_dataset(tmp_path_factory):
    """A 12-image synthetic ImageNet-like folder, shared by the tests that read JPEGs."""
    from pipeprof.data.synthetic import make_dataset

    root = tmp_path_factory.mktemp("ds")
    make_dataset(root, images=12, classes=3, seed=1, workers=1)
    return root


@pytest.fixture(scope="session")
def shard_dir(tiny_dataset, tmp_path_factory):
    """The tiny dataset packed by ``pipeprof pack`` into at least 3 tar shards (WebDataset layout)."""
    from pipeprof.data.sources.shards import pack_folder

    dst = tmp_path_factory.mktemp("shards")
    info = pack_folder(tiny_dataset, dst, shard_size_mb=0.3)
    assert info["samples"] == 12 and info["shards"] >= 3
    return dst


@pytest.fixture(scope="session")
def cpu_run_dir(tmp_path_factory):
    """One real (tiny) ``pipeprof run`` on synthetic JPEGs, mobilenet_v3_small on the CPU, 0 and 1 workers, the
    overhead checks and a CPU reference: the run folder that test_run_folder and test_report_html read. Measured
    once per test run, in a lane (``measured_once``): its readers check what the run records and how its figures
    agree with each other, not a rate, and the run sees one usable core (its thread counts follow). Its actions
    are predicted, not measured (test_action_trials measures them): on one core its answer falls on either side
    of step-bound and balanced from run to run, and a balanced answer tried the decoder action for 10 pairs of
    windows, 26 s of a 53-s fixture against 21 s without. Windows are added while a trial's interval is wider than
    ±10%, not the default ±5% (its readers check the rule, not how tight it gets): at ±5% most trials ran to
    their 5th window."""
    from pipeprof.cli import main

    def make(out: Path) -> Path:
        sets = [
            "data.images=16",
            "data.classes=2",
            f"data.cache_dir={out}/datasets",
            f"out_dir={out}",
            "loader.num_workers=[0,1]",
            "loader.batch_size=4",
            "augment.preset=light",
            "name=t",
            "measure.warmup_s=0.2",
            "measure.window_s=0.3",
            "measure.window_batches=2",
            "measure.windows=3",
            "measure.max_windows=5",
            "measure.ci_target=0.1",
            "measure.redraws=10",
            "measure.cpu_reference_s=0.3",
            "overhead_checks=true",
            "actions=predict",
        ]
        printed = io.StringIO()
        with contextlib.redirect_stdout(printed):
            assert main(["run"] + [a for s in sets for a in ("--set", s)]) == 0
        (path,) = [p for p in out.iterdir() if p.name.startswith("t-")]
        (out / "printed.txt").write_text(printed.getvalue())  # what the command printed, beside its folder
        return path

    return measured_once("cpu_run", make, tmp_path_factory, MEASURED["cpu_run_dir"])


@pytest.fixture
def quick_measure() -> dict:
    """A short steady-state policy for tests: enough windows to compute a spread."""
    return MeasureConfig(
        warmup_batches=3,
        warmup_s=0.2,
        window_s=0.3,
        window_batches=3,
        windows=3,
        max_trial_s=30,
        ci_target=0.25,
        cpu_reference_s=0,
        redraws=10,
    ).model_dump()


LOOPBACK = "127.0.0.1"  # tests talk only to this machine


class QuietHandler(http.server.SimpleHTTPRequestHandler):
    def log_message(self, *args):  # keep pytest output clean
        pass


@contextlib.contextmanager
def serve_folder(root):
    """A real HTTP file server for ``root`` on a free loopback port; yields its base URL."""
    server = http.server.ThreadingHTTPServer((LOOPBACK, 0), functools.partial(QuietHandler, directory=str(root)))
    # polled every 50 ms (not 0.5 s): shutdown() returns at the next poll
    thread = threading.Thread(
        target=server.serve_forever, kwargs={"poll_interval": 0.05}, name="test-http", daemon=True
    )
    thread.start()
    try:
        yield f"http://{LOOPBACK}:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()
        thread.join(timeout=5)


@contextlib.contextmanager
def refusing_port():
    """A loopback port that refuses connections for as long as the block runs.

    The port stays bound (without SO_REUSEADDR) and never listens: the kernel answers a
    connection with a reset, and no other test's server can take the port meanwhile. A port
    bound, read and released could be handed to a parallel test's server before the
    connection, which then answered 404 instead of refusing.
    """
    with socket.socket() as s:
        s.bind((LOOPBACK, 0))
        yield s.getsockname()[1]


def session_alive(sid: int) -> list[int]:
    """PIDs of the live (not zombie) processes of session ``sid``: what a killed run left running."""
    alive = []
    for p in psutil.process_iter(["status"]):
        try:
            if os.getsid(p.pid) == sid and p.info["status"] != psutil.STATUS_ZOMBIE:
                alive.append(p.pid)
        except (ProcessLookupError, PermissionError):
            pass
    return alive


# ---- pipeprof watch of a test's training script (test_watch, test_watch_actions) --------------------------


def watch_job(tmp: Path, args: list[str], job: list[str], env: dict | None = None) -> subprocess.CompletedProcess:
    """``pipeprof watch`` of ``job`` in ``tmp`` (its run folder under tmp/out, its log tmp/watch.log), short windows
    and few re-draws; ``args`` after those, so a test may set its own."""
    cmd = [
        sys.executable,
        "-m",
        "pipeprof",
        "watch",
        "--out-dir",
        str(tmp / "out"),
        "--window-s",
        "0.5",
        "--live-s",
        "1",
        "--redraws",
        "10",
        "--log",
        str(tmp / "watch.log"),
        *args,
        "--",
        *job,
    ]
    return subprocess.run(cmd, cwd=tmp, capture_output=True, timeout=240, env=env)


def watch_run_folder(tmp: Path):
    """The watch's run folder under tmp/out, loaded; its log in the failure message where there is none."""
    from pipeprof.results import load_run

    found = sorted((tmp / "out").glob("watch-*"))
    log = tmp / "watch.log"
    assert found, f"no run folder; the watch's log:\n{log.read_text() if log.exists() else '(none)'}"
    run = load_run(found[0])
    assert "analysis_error" not in run.meta, run.meta["analysis_error"]
    return run


@contextlib.contextmanager
def fixed_step_context(src, measure, step_s: float):
    """A CPU TrialContext over source ``src`` (labelled "files") whose model ``"fixed"`` takes ``step_s`` a batch
    (``FixedStepModel``), one step thread, with a monitor running: the GPU pipeline's trials on CPU tensors."""
    import torch

    from pipeprof.checks.calibrate import FixedStepModel
    from pipeprof.measure.monitors import Monitor
    from pipeprof.trials import TrialContext

    with Monitor(hz=10, gpu=False) as mon:
        yield TrialContext(
            torch.device("cpu"),
            src,
            measure,
            mon,
            num_classes=10,
            sources={"files": src},
            models={"fixed": lambda: FixedStepModel(step_s, 10)},
            step_threads=1,
        )
