"""Shared fixtures. Every test must leave no monitor thread or worker process behind."""
from __future__ import annotations

import contextlib
import functools
import http.server
import os
import socket
import threading

os.environ.setdefault("NO_ALBUMENTATIONS_UPDATE", "1")

import psutil  # noqa: E402
import pytest  # noqa: E402

from pipeprof.config import MeasureConfig  # noqa: E402


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
    overhead checks and a CPU reference: the run folder that test_run_folder and test_report_html read."""
    from pipeprof.cli import main

    out = tmp_path_factory.mktemp("out")
    sets = ["data.images=16", "data.classes=2", f"data.cache_dir={out}/datasets", f"out_dir={out}",
            "loader.num_workers=[0,1]", "loader.batch_size=4", "augment.preset=light", "name=t",
            "measure.warmup_s=0.2", "measure.window_s=0.3", "measure.window_batches=2", "measure.windows=3",
            "measure.max_windows=5", "measure.redraws=10", "measure.cpu_reference_s=0.3", "overhead_checks=true"]
    assert main(["run"] + [a for s in sets for a in ("--set", s)]) == 0
    (path,) = [p for p in out.iterdir() if p.name.startswith("t-")]
    return path


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
    thread = threading.Thread(target=server.serve_forever, name="test-http", daemon=True)
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
