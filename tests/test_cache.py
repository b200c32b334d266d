"""Page-cache control and I/O accounting on real files (no mocks): evict, warm, mincore, /proc/PID/io."""

from __future__ import annotations

import os
import shutil
import tempfile
from pathlib import Path

import pytest

from pipeprof import env
from pipeprof.data import cache
from pipeprof.data.dataset import RawBytesDataset, collate_bytes
from pipeprof.data.sources.files import FileSource
from pipeprof.measure.loader import build_loader, shutdown, worker_pids

REPO = Path(__file__).resolve().parents[1]
# Filesystems whose pages live only in memory: fadvise cannot drop them
MEMORY_FS = {"tmpfs", "ramfs", "devtmpfs"}


def fs_type(path: Path) -> str:
    return env.filesystem_of(path)["fstype"] or "unknown"


@pytest.fixture
def disk_files(tmp_path):
    """A few MB in files on a real disk (not tmpfs), flushed so their pages can be dropped."""
    folder = (
        tmp_path
        if fs_type(tmp_path) not in MEMORY_FS
        else Path(tempfile.mkdtemp(prefix="cache-test-", dir=REPO / "out"))
    )
    if fs_type(folder) in MEMORY_FS:
        pytest.skip(f"no disk-backed folder: {folder} is {fs_type(folder)}, whose pages cannot be evicted")
    paths = []
    for k in range(4):
        p = folder / f"blob{k}.bin"
        with open(p, "wb") as f:
            f.write(os.urandom(1 << 20))
            f.flush()
            os.fsync(f.fileno())  # dirty pages cannot be dropped; make them clean
        paths.append(p)
    yield paths
    if folder != tmp_path:
        shutil.rmtree(folder, ignore_errors=True)


def require_mincore(paths) -> None:
    if cache.resident_fraction(paths) is None:
        pytest.skip("mincore is unavailable here: residency cannot be checked")


def test_evict_then_warm_changes_residency(disk_files):
    require_mincore(disk_files)
    info = cache.evict(disk_files)
    assert info == {"files": 4, "bytes": 4 << 20, "method": "fadvise"}
    assert cache.resident_fraction(disk_files) < 0.2
    assert cache.warm(disk_files)["bytes"] == 4 << 20
    assert cache.resident_fraction(disk_files) > 0.9


def test_folders_expand_to_their_files(disk_files):
    folder = disk_files[0].parent
    assert cache.evict(folder)["files"] == len(list(folder.iterdir()))


def test_io_probe_sees_cold_and_warm_reads(disk_files):
    require_mincore(disk_files)
    cache.evict(disk_files)
    with cache.IoProbe() as cold:
        cache.warm(disk_files)
    assert cold.read_chars >= 4 << 20
    warm = cache.IoProbe().start()
    cache.warm(disk_files)
    warm.stop()
    assert warm.disk_fraction() < 0.2
    if cold.read_bytes == 0:
        pytest.skip("this kernel/container reports read_bytes = 0 in /proc/PID/io")
    assert cold.disk_fraction() > 0.8


def test_io_probe_counts_the_workers_reads_until_they_exit(tiny_dataset):
    source = FileSource(tiny_dataset)
    it = iter(build_loader(RawBytesDataset(source), batch_size=1, num_workers=2, collate_fn=collate_bytes))
    try:
        probe = cache.IoProbe(worker_pids(it)).start()  # as a trial does: at its first measured window
        got = sum(next(it)["bytes"] for _ in range(2 * len(source)))  # a second pass: read during the probe
        result = probe.stop()  # before shutdown: an exited worker's counters are gone
    finally:
        shutdown(it)
    assert len(probe.pids) == 2 and result["lost_pids"] == []
    assert 0 < result["read_chars"] and result["read_chars"] >= got - 2 * 2 * max(
        source.nbytes(i) for i in range(len(source))
    )
    assert len(probe.stop()["lost_pids"]) == 2  # stopped too late: the workers' reads are lost


def test_fits_in_page_cache():
    assert cache.fits_in_page_cache(1)["fits"] is True
    big = cache.fits_in_page_cache(10 * 10**15)  # 10 PB
    assert big["fits"] is False and big["room_bytes"] > 0 and "exceeds" in big["reason"]


def test_drop_all_caches_needs_root():
    if os.geteuid() == 0:
        pytest.skip("running as root: dropping the machine's page cache is not done in a test")
    with pytest.raises(PermissionError, match="drop_caches"):
        cache.drop_all_caches()


def test_the_rights_check_names_what_is_missing(tmp_path):
    # runs as root too (as CI does): the check reads the path it is given, and drops nothing
    missing = tmp_path / "drop_caches"
    assert cache.can_drop_all_caches(str(missing)) == (False, f"{missing} does not exist (not Linux?)")
    missing.write_text("")
    missing.chmod(0o444)
    able, why = cache.can_drop_all_caches(str(missing))
    assert (able, why) == (True, "ok") if os.geteuid() == 0 else (not able and "needs root" in why)
