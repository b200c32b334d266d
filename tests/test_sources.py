"""Shard, URL and throttled sources against real tar files, a real HTTP server and real workers."""

from __future__ import annotations

import gc
import hashlib
import os
import shutil
import socket
import tarfile
import time

import pytest

from conftest import LOOPBACK, refusing_port, serve_folder
from pipeprof.data.dataset import RawBytesDataset, collate_bytes
from pipeprof.data.sources import REGISTRY, Source, SourceError, source_class
from pipeprof.data.sources.files import FileSource
from pipeprof.data.sources.memory import MemorySource
from pipeprof.data.sources.shards import ShardSource, pack_folder
from pipeprof.data.sources.throttled import ThrottledSource
from pipeprof.data.sources.url import UrlSource, write_index
from pipeprof.measure.loader import build_loader, shutdown


def contents(source) -> list[tuple[str, int]]:
    """(sha1 of bytes, label) of every sample, sorted: equal for sources holding the same data."""
    return sorted((hashlib.sha1(source.read(i)).hexdigest(), source.label(i)) for i in range(len(source)))


def read_with_workers(source, batches: int, workers: int = 2) -> list[tuple[int, float]]:
    """Read ``batches`` single samples through a real DataLoader: (bytes, arrival time) each."""
    it = iter(build_loader(RawBytesDataset(source), batch_size=1, num_workers=workers, collate_fn=collate_bytes))
    got = []
    try:
        for _ in range(batches):
            got.append((next(it)["bytes"], time.perf_counter()))
    finally:
        shutdown(it)
    return got


def test_registry_names_new_sources():
    for name in ("shards", "url", "throttled"):
        assert name in REGISTRY and source_class(name).kind == name


# --------------------------------------------------------------------------- shards


def test_shards_hold_the_same_samples_as_the_folder(tiny_dataset, shard_dir):
    shards = ShardSource(shard_dir)
    assert len(shards) == 12 and shards.sequential
    assert contents(shards) == contents(FileSource(tiny_dataset))
    assert shards.total_bytes() == FileSource(tiny_dataset).total_bytes()
    assert shards.describe()["shards"] == len(list(shard_dir.glob("shard-*.tar")))
    assert len(ShardSource(str(shard_dir / "shard-*.tar"))) == 12  # a glob names the same shards


def test_shard_order_covers_all_once_grouped_by_shard(shard_dir):
    source = ShardSource(shard_dir)
    for epoch in range(3):
        order = source.shard_order(seed=5, epoch=epoch)
        assert sorted(order) == list(range(len(source)))
        shards_seen = [source.shard_of(i) for i in order]
        runs = [s for k, s in enumerate(shards_seen) if k == 0 or s != shards_seen[k - 1]]
        assert len(runs) == len(source.shards)  # each shard read in one contiguous run
        for s in set(shards_seen):  # members in file order within a shard
            members = [i for i in order if source.shard_of(i) == s]
            assert members == sorted(members)
    assert source.shard_order(5, 0) == source.shard_order(5, 0)


def test_shards_read_in_dataloader_workers(shard_dir):
    source = ShardSource(shard_dir)
    source.read(0)  # the parent has a cached handle: workers must open their own
    total = sum(n for n, _ in read_with_workers(source, batches=12))
    assert total == source.total_bytes() and source.read(1) == source.read(1)


def test_truncated_shard_names_the_member(shard_dir, tmp_path):
    victim = tmp_path / "shard-000000.tar"
    victim.write_bytes((shard_dir / "shard-000000.tar").read_bytes())
    with tarfile.open(victim) as tf:
        jpg = [m for m in tf.getmembers() if m.name.endswith(".jpg")][-1]
    os.truncate(victim, jpg.offset_data + jpg.size // 2)  # cut inside the last image's data
    with pytest.raises(SourceError, match=rf"shard-000000\.tar.*{jpg.name}"):
        ShardSource(tmp_path)


def test_not_a_tar_is_a_source_error(tmp_path):
    bad = tmp_path / "shard-000000.tar"
    bad.write_bytes(b"this is not a tar archive" * 100)
    with pytest.raises(SourceError, match="shard-000000.tar"):
        ShardSource(tmp_path)


def test_pack_folder_rejects_bad_arguments(tiny_dataset, tmp_path):
    with pytest.raises(ValueError, match="shard_size_mb"):
        pack_folder(tiny_dataset, tmp_path, shard_size_mb=0)
    with pytest.raises(SourceError, match="not found"):
        pack_folder(tmp_path / "missing", tmp_path / "out")


# --------------------------------------------------------------------------- url


@pytest.fixture(scope="module")
def served_dir(tiny_dataset, tmp_path_factory):
    """A copy of the tiny dataset with an index (the shared fixture stays untouched)."""
    root = tmp_path_factory.mktemp("served") / "ds"
    shutil.copytree(tiny_dataset, root)
    write_index(root)
    return root


@pytest.fixture(scope="module")
def http_base(served_dir):
    """A real HTTP server on loopback serving the dataset copy and its index."""
    with serve_folder(served_dir) as base:
        yield base


def test_url_reads_the_same_bytes_as_files(tiny_dataset, http_base):
    source = UrlSource(http_base)
    files = FileSource(tiny_dataset)
    assert len(source) == 12 and contents(source) == contents(files)
    assert source.total_bytes() == files.total_bytes()  # sizes from the index's 3rd column


def test_url_index_given_as_url(tiny_dataset, http_base):
    source = UrlSource(http_base, index=f"{http_base}/index.txt")
    assert len(source) == 12 and source.read(0) == FileSource(tiny_dataset).read(0)


def test_url_size_without_index_column(tiny_dataset, http_base):
    files = FileSource(tiny_dataset)
    rel = os.path.relpath(files.paths[0], tiny_dataset)
    source = UrlSource(http_base, index=[(rel, files.label(0))])
    assert source.nbytes(0) == files.nbytes(0)  # one HEAD request


def test_url_reads_in_dataloader_workers(tiny_dataset, http_base):
    total = sum(n for n, _ in read_with_workers(UrlSource(http_base), batches=12))
    assert total == FileSource(tiny_dataset).total_bytes()  # 12 batches = one pass in shuffled order


def test_url_missing_object_is_404(http_base):
    source = UrlSource(http_base, index=[("class_000/nope.jpg", 0)])
    with pytest.raises(SourceError, match=r"nope\.jpg.*404"):
        source.read(0)


@pytest.mark.one_core  # time-outs and a token bucket's waits
def test_url_refused_connection_fails_fast():
    with refusing_port() as port:
        base = f"http://{LOOPBACK}:{port}"
        t0 = time.perf_counter()
        with pytest.raises(SourceError, match=rf"{base}/index.txt.*connection refused"):
            UrlSource(base, timeout_s=2)
        source = UrlSource(base, index=[("a.jpg", 0)], timeout_s=2)
        with pytest.raises(SourceError, match="connection refused"):
            source.read(0)
        assert time.perf_counter() - t0 < 5


class CollectOnRead(Source):
    """Runs the garbage collector before each read, as any allocation-heavy worker eventually does."""

    def __init__(self, inner):
        self.inner = inner

    def __len__(self):
        return len(self.inner)

    def read(self, index):
        gc.collect()
        return self.inner.read(index)

    def label(self, index):
        return self.inner.label(index)

    def nbytes(self, index):
        return self.inner.nbytes(index)


@pytest.mark.alone
def test_url_sessions_in_parent_do_not_stall_workers(http_base, memory_source):
    """A forked worker must not finalize the parent's HTTP sessions: fsspec would wait ~1 s each
    on the parent's event loop, whose thread does not exist in the child."""
    t0 = time.perf_counter()
    read_with_workers(CollectOnRead(memory_source), batches=4)
    baseline = time.perf_counter() - t0  # the same reads with no session to finalize: this machine's pace
    gc.disable()  # keep the garbage uncollected in the parent until the workers have forked
    try:
        for _ in range(3):
            garbage = UrlSource(http_base)
            garbage.read(0)  # opens a client session
            garbage.cycle = garbage  # freed only by the garbage collector
        del garbage
        t0 = time.perf_counter()
        read_with_workers(CollectOnRead(memory_source), batches=4)
        elapsed = time.perf_counter() - t0
    finally:
        gc.enable()
    assert elapsed - baseline < 2.0  # three stalled sessions would add about 3 s


@pytest.mark.one_core  # time-outs and a token bucket's waits
def test_url_silent_server_times_out():
    """A server that accepts but never answers must not hang a trial."""
    with socket.socket() as listener:
        listener.bind((LOOPBACK, 0))
        listener.listen(8)  # connections complete in the backlog; nothing ever replies
        base = f"http://{LOOPBACK}:{listener.getsockname()[1]}"
        t0 = time.perf_counter()
        with pytest.raises(SourceError, match="timed out"):
            UrlSource(base, index=[("a.jpg", 0)], timeout_s=0.5, retries=1).read(0)
        assert time.perf_counter() - t0 < 5


# --------------------------------------------------------------------------- throttled


@pytest.fixture(scope="module")
def memory_source(tiny_dataset):
    return MemorySource(FileSource(tiny_dataset))


@pytest.mark.one_core  # time-outs and a token bucket's waits
def test_throttle_caps_bandwidth_in_one_process(memory_source):
    source = ThrottledSource(memory_source, mb_s=5)
    indices = list(range(len(source))) * 2  # ~2.6 MB
    expected = sum(source.nbytes(i) for i in indices) / 5e6
    t0 = time.perf_counter()
    for i in indices:
        source.read(i)
    assert time.perf_counter() - t0 == pytest.approx(expected, rel=0.25)


@pytest.mark.one_core  # time-outs and a token bucket's waits
def test_throttle_cap_is_shared_by_workers(memory_source):
    """Two workers together get the cap, not twice it: the bucket lives in shared memory."""
    source = ThrottledSource(memory_source, mb_s=5)
    got = read_with_workers(source, batches=36)
    # from the 6th arrival on: before it, samples prefetched while the main process
    # waited for the workers to start arrive back to back
    steady = got[5:]
    rate = sum(n for n, _ in steady[1:]) / (steady[-1][1] - steady[0][1]) / 1e6
    assert rate == pytest.approx(5.0, rel=0.25), f"{rate:.2f} MB/s with 2 workers, cap 5"


@pytest.mark.one_core  # time-outs and a token bucket's waits
def test_throttle_latency_per_read(memory_source):
    source = ThrottledSource(memory_source, latency_ms=20)
    t0 = time.perf_counter()
    for i in range(10):
        source.read(i)
    assert 0.2 <= time.perf_counter() - t0 < 0.6


@pytest.mark.one_core  # time-outs and a token bucket's waits
def test_throttle_reads_per_second(memory_source):
    source = ThrottledSource(memory_source, reads_s=50)
    t0 = time.perf_counter()
    for i in range(10):
        source.read(i)
    assert time.perf_counter() - t0 == pytest.approx(0.2, rel=0.25)


def test_throttle_describe_and_passthrough(memory_source):
    source = ThrottledSource(memory_source, mb_s=100, latency_ms=1)
    d = source.describe()
    assert d["emulated"] is True and d["mb_s"] == 100 and d["latency_ms"] == 1 and d["reads_s"] is None
    assert d["inner"] == memory_source.describe()
    assert source.read(3) == memory_source.read(3) and source.label(3) == memory_source.label(3)


@pytest.mark.parametrize(
    "kwargs, name",
    [
        ({"mb_s": 0}, "mb_s"),
        ({"mb_s": -1}, "mb_s"),
        ({"reads_s": 0}, "reads_s"),
        ({"latency_ms": -5}, "latency_ms"),
        ({"mb_s": float("nan")}, "mb_s"),
    ],
)
def test_throttle_rejects_bad_limits(memory_source, kwargs, name):
    with pytest.raises(ValueError, match=name):
        ThrottledSource(memory_source, **kwargs)
