"""Shared fixtures, and how tests share this machine's cores. Every test must leave no monitor thread or
worker process behind.

The suite runs on two xdist workers (README: ``pytest -q -n 2 --maxschedchunk 1``). Many tests measure real
DataLoader workers and real CPU work, and a test running beside them would load the cores they time (the
monitor even counts its processes as foreign load). So the workers share the machine through a reader/writer
lock (``CoreLock``): an ordinary test holds it shared, beside any other ordinary test; a test marked ``alone``
holds it exclusively, with no other test running anywhere. Waiting writers go first, so an ``alone`` test
never starves. Without xdist (``-n 0``, ``-p no:xdist``, one file run by hand) the lock does nothing.

Which tests are ``alone`` (the rule; when unsure, ``alone``):

- ``alone``: the test, or a fixture it sets up, measures something whose value an assertion checks against
  time: a rate, a share or ratio of time (data wait, cost, overhead, foreign cores), a verdict or bound, a
  sizing or core count, a search decision taken on measured rates, a sampling interval or count per second,
  or a wall-clock bound tight enough that a second test on the other core could break it (within about 10x
  of what the work takes); and a test that asserts the monitor saw no foreign load.
- shared: logic on tables of known content, errors and their messages, files and folders, signals, kills and
  resumes, report rendering, config validation, distributed plumbing; runs whose measured figures no assertion
  reads beyond "> 0" or a bound that holds at any speed (a share within 0-1); and tests that only read what a
  measurement saved under the exclusive lock (``measured_once``: the run folder of ``cpu_run_dir``). A
  wall-clock bound of 10x and more over the work is a hang guard, not a timing check: shared.

A module that times throughout is marked with ``pytestmark = pytest.mark.alone``, single tests with
``@pytest.mark.alone``. A fixture that measures a run several tests read makes it with ``measured_once``:
under the exclusive lock, and once for the test run, not once per worker.

Order: under xdist every worker sorts the tests alike (``phase``): the ``alone`` ones first, then the shared
ones that read a run measured once, then the other shared ones; ``--maxschedchunk 1`` hands them out in that
order a test or two at a time. So both workers take the ``alone`` tests in turn, then run the shared ones in
parallel: one switch between the two kinds, not a wait for the other worker's test at every ``alone`` one
(``pytest -n 2`` alone hands each worker a long run of consecutive tests: correct, only slower).
"""
from __future__ import annotations

import contextlib
import fcntl
import functools
import http.server
import os
import pickle
import socket
import tempfile
import threading
from pathlib import Path

os.environ.setdefault("NO_ALBUMENTATIONS_UPDATE", "1")

import psutil  # noqa: E402
import pytest  # noqa: E402

from pipeprof.config import MeasureConfig  # noqa: E402

class CoreLock:
    """A machine-wide reader/writer lock on two files (``fcntl.flock``) in a folder the xdist workers of one run
    share. Readers and writers first take the turnstile, briefly; a writer keeps it while it waits for the
    readers to finish, so no new reader starts meanwhile (writer-preferring: an ``alone`` test cannot starve).
    ``hold`` nests: an exclusive hold inside a shared one drops the shared lock first (an upgrade in place
    could deadlock against the other worker's) and takes it back after."""

    def __init__(self, folder: Path):
        folder.mkdir(parents=True, exist_ok=True)
        self.rw = open(folder / "cores.lock", "a+")  # noqa: SIM115 - held for the worker's life
        self.turnstile = open(folder / "turnstile.lock", "a+")  # noqa: SIM115
        self.mode: str | None = None

    def _take(self, mode: str) -> None:
        fcntl.flock(self.turnstile, fcntl.LOCK_EX)
        try:
            fcntl.flock(self.rw, fcntl.LOCK_EX if mode == "exclusive" else fcntl.LOCK_SH)
        finally:
            fcntl.flock(self.turnstile, fcntl.LOCK_UN)
        self.mode = mode

    def _drop(self) -> None:
        fcntl.flock(self.rw, fcntl.LOCK_UN)
        self.mode = None

    @contextlib.contextmanager
    def hold(self, mode: str):
        before = self.mode
        if before == mode or before == "exclusive":
            yield
            return
        if before is not None:
            self._drop()
        self._take(mode)
        try:
            yield
        finally:
            self._drop()
            if before is not None:
                self._take(before)


class _NoLock:
    """Not under xdist: one test at a time anyway."""

    @contextlib.contextmanager
    def hold(self, mode: str):
        yield


CORES: CoreLock | _NoLock = _NoLock()
SHARED: Path | None = None  # the folder this run's xdist workers share (None without xdist)


def pytest_configure(config):
    global CORES, SHARED
    if not hasattr(config, "workerinput"):
        # the timed tests run first: not beside the kernel writing back what was just installed or built (CI runs
        # the tests straight after `pip install`; the hand-off test, early, once read 2,850 against 1,988/s)
        os.sync()
    else:
        # xdist gives each local worker <the controller's basetemp>/popen-gwN: the parent is the run's own folder
        SHARED = (Path(config.option.basetemp).parent if config.option.basetemp else
                  Path(tempfile.gettempdir()) / f"pipeprof-tests-{config.workerinput['testrunuid']}") / "shared"
        CORES = CoreLock(SHARED)


def is_alone(item) -> bool:
    return item.get_closest_marker("alone") is not None


def phase(item) -> int:
    """0: alone; 1: shared, reading a run measured once (measured as the alone tests end, not in the middle of
    the shared ones, where the exclusive lock would wait for the other worker's test); 2: the other shared."""
    return 0 if is_alone(item) else 1 if MEASURED & set(item.fixturenames) else 2


@pytest.hookimpl(tryfirst=True)
def pytest_collection_finish(session):  # before xdist's worker reports the order it collected
    if hasattr(session.config, "workerinput"):  # the same stable order on every worker
        session.items.sort(key=phase)


@pytest.hookimpl(wrapper=True)
def pytest_runtest_protocol(item, nextitem):
    """Setup, call and teardown (the module and session fixtures set up for this test included) under the lock."""
    with CORES.hold("exclusive" if is_alone(item) else "shared"):
        return (yield)


def measured_once(name: str, make, tmp_path_factory):
    """``make(folder)``'s value, measured under the exclusive lock and once for the whole test run: under xdist the
    first worker to need it measures it in the folder the workers share and leaves it there pickled; the other
    reads the pickle. For a fixture whose run several tests read (or whose data: the storage sweep's JPEGs)."""
    if SHARED is None:
        with CORES.hold("exclusive"):
            return make(tmp_path_factory.mktemp(name))
    done = SHARED / f"{name}.pickle"
    if not done.exists():
        with CORES.hold("exclusive"):
            if not done.exists():  # the other worker may have measured it while this one waited
                value = make(Path(tempfile.mkdtemp(prefix=f"{name}-", dir=SHARED)))
                done.with_suffix(".tmp").write_bytes(pickle.dumps(value))
                done.with_suffix(".tmp").rename(done)  # whole, or not there
    return pickle.loads(done.read_bytes())


# fixtures made by measured_once that shared tests read: those tests run just after the alone ones (``phase``)
MEASURED = {"cpu_run_dir"}


@pytest.fixture(autouse=True)
def no_leftovers():
    """Fail a test that leaks a monitor thread or a DataLoader worker."""
    yield
    threads = [t.name for t in threading.enumerate() if t.name.startswith("pipeprof")]
    children = [p for p in psutil.Process().children(recursive=True) if p.is_running()
                and p.status() != psutil.STATUS_ZOMBIE]
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
    alone and once per test run (``measured_once``): its readers only read it."""
    from pipeprof.cli import main

    def make(out: Path) -> Path:
        sets = ["data.images=16", "data.classes=2", f"data.cache_dir={out}/datasets", f"out_dir={out}",
                "loader.num_workers=[0,1]", "loader.batch_size=4", "augment.preset=light", "name=t",
                "measure.warmup_s=0.2", "measure.window_s=0.3", "measure.window_batches=2", "measure.windows=3",
                "measure.max_windows=5", "measure.redraws=10", "measure.cpu_reference_s=0.3", "overhead_checks=true"]
        assert main(["run"] + [a for s in sets for a in ("--set", s)]) == 0
        (path,) = [p for p in out.iterdir() if p.name.startswith("t-")]
        return path

    return measured_once("cpu_run", make, tmp_path_factory)


@pytest.fixture
def quick_measure() -> dict:
    """A short steady-state policy for tests: enough windows to compute a spread."""
    return MeasureConfig(warmup_batches=3, warmup_s=0.2, window_s=0.3, window_batches=3, windows=3,
                         max_trial_s=30, ci_target=0.25, cpu_reference_s=0, redraws=10).model_dump()


LOOPBACK = "127.0.0.1"  # tests talk only to this machine


class QuietHandler(http.server.SimpleHTTPRequestHandler):
    def log_message(self, *args):  # keep pytest output clean
        pass


@contextlib.contextmanager
def serve_folder(root):
    """A real HTTP file server for ``root`` on a free loopback port; yields its base URL."""
    server = http.server.ThreadingHTTPServer((LOOPBACK, 0), functools.partial(QuietHandler, directory=str(root)))
    # polled every 50 ms (not 0.5 s): shutdown() returns at the next poll
    thread = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05}, name="test-http",
                              daemon=True)
    thread.start()
    try:
        yield f"http://{LOOPBACK}:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()
        thread.join(timeout=5)


def free_port() -> int:
    """A loopback port nothing listens on (bound, read, released)."""
    with socket.socket() as s:
        s.bind((LOOPBACK, 0))
        return s.getsockname()[1]



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
