"""Sources, decoders, the pipeline dataset and the loader, on real JPEGs and real workers."""

import numpy as np
import pytest
import torch

from pipeprof.data.augment import load_preset
from pipeprof.data.dataset import CyclingSampler, PipelineDataset, RawBytesDataset, collate_pipeline
from pipeprof.data.decode import DecodeError, decode_cv2, decode_pil, get_decoder
from pipeprof.data.sources import SourceError, source_class
from pipeprof.measure.loader import build_loader, shutdown, worker_pids


def files(root):
    return source_class("files")(root)


def test_file_source_reads_imagefolder_layout(tiny_dataset):
    src = files(tiny_dataset)
    assert len(src) == 12 and sorted(set(src.labels)) == [0, 1, 2]
    data = src.read(0)
    assert data[:2] == b"\xff\xd8" and len(data) == src.nbytes(0)
    assert src.describe()["total_mb"] == pytest.approx(src.total_bytes() / 1e6)


def test_memory_source_holds_the_same_bytes(tiny_dataset):
    disk = files(tiny_dataset)
    mem = source_class("memory")(disk)
    assert [mem.read(i) for i in range(len(mem))] == [disk.read(i) for i in range(len(disk))]
    with pytest.raises(SourceError, match="more than"):
        source_class("memory")(disk, max_fraction=1e-12)


def test_missing_and_empty_folders_are_clear_errors(tmp_path):
    with pytest.raises(SourceError, match="not found"):
        files(tmp_path / "absent")
    (tmp_path / "cls").mkdir()
    with pytest.raises(SourceError, match="no images"):
        files(tmp_path)


def test_pil_and_cv2_decode_to_the_same_rgb_image(tiny_dataset):
    data = files(tiny_dataset).read(3)
    a, b = decode_pil(data), decode_cv2(data)
    assert a.shape == b.shape and a.dtype == b.dtype == np.uint8
    # two libjpeg builds may round the IDCT differently, but not by much
    assert np.abs(a.astype(int) - b.astype(int)).mean() < 2.0
    with pytest.raises(DecodeError):
        get_decoder("pil")(b"not a jpeg")
    with pytest.raises(ValueError, match="allowed: pil, cv2"):
        get_decoder("nvjpeg")


@pytest.mark.alone
def test_stage_times_cover_every_transform(tiny_dataset):
    ds = PipelineDataset(files(tiny_dataset), "pil", load_preset("heavy"), stage_timing=True)
    image, label, times, notes = ds[0]
    assert image.shape == (3, 224, 224) and label == 0 and notes is None  # a good sample: nothing to report
    assert len(times) == len(ds.stage_names) == 2 + 8 and (times > 0).all()
    assert times[1] > times[0]  # decoding a 110 KB JPEG costs more than reading it from page cache


def test_collate_sums_stage_times_and_adds_its_own():
    samples = [
        (torch.zeros(3, 4, 4), 1, np.array([1.0, 2.0]), None),
        (torch.ones(3, 4, 4), 2, np.array([0.5, 0.5]), None),
    ]
    batch = collate_pipeline(samples)
    assert batch["image"].shape == (2, 3, 4, 4) and batch["label"].tolist() == [1, 2]
    assert batch["stage_s"][:2].tolist() == [1.5, 2.5] and batch["stage_s"][2] > 0


def test_cycling_sampler_covers_every_index_each_pass_and_never_ends():
    it = iter(CyclingSampler(5, seed=0))
    passes = [sorted(next(it) for _ in range(5)) for _ in range(3)]
    assert passes == [list(range(5))] * 3


def test_loader_with_real_workers_is_seeded_and_reports_pids(tiny_dataset):
    def first_batch():
        ds = PipelineDataset(files(tiny_dataset), "cv2", load_preset("standard"), stage_timing=False)
        it = iter(build_loader(ds, batch_size=4, num_workers=2, collate_fn=collate_pipeline, seed=3))
        pids = worker_pids(it)
        batch = next(it)
        shutdown(it)
        return batch, pids

    (b1, pids), (b2, _) = first_batch(), first_batch()
    assert len(pids) == 2 and b1["image"].shape == (4, 3, 224, 224) and b1["image"].dtype == torch.float32
    assert torch.equal(b1["image"], b2["image"])  # same seed, same augmentation draws


def test_raw_bytes_dataset_reads_sizes(tiny_dataset):
    src = files(tiny_dataset)
    n, seconds, skipped = RawBytesDataset(src)[5]
    assert n == src.nbytes(5) and seconds >= 0 and skipped == []
