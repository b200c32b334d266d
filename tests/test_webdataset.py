"""pipeprof's tar shards and the webdataset library read each other's files.

Real JPEGs, real tar shards written by ``webdataset.TarWriter`` and by ``pack_folder``,
real ``webdataset.WebDataset`` pipelines, a real DataLoader with worker processes. No mocks.
"""

from __future__ import annotations

import hashlib
import io
import tarfile

import pytest
import webdataset as wds
from PIL import Image

from pipeprof import config as C
from pipeprof.data.dataset import RawBytesDataset
from pipeprof.data.sources import SourceError, source_class
from pipeprof.data.sources.files import FileSource
from pipeprof.data.sources.shards import ShardSource, pack_folder
from pipeprof.measure.loader import build_loader, shutdown


def sha(data: bytes) -> str:
    return hashlib.sha1(data).hexdigest()


def folder_samples(folder) -> list[tuple[str, int]]:
    """(sha1 of the image bytes, label) of every image of an ImageFolder tree, sorted."""
    files = FileSource(folder)
    return sorted((sha(files.read(i)), files.label(i)) for i in range(len(files)))


def write_with_tarwriter(folder, dst, per_shard: int, label_ext: str = "cls", image_ext: str = "jpg") -> dict:
    """The tiny dataset as ``webdataset.TarWriter`` shards; key -> (image bytes, label) written."""
    dst.mkdir()
    files = FileSource(folder)
    written, writer = {}, None
    for i in range(len(files)):
        if i % per_shard == 0:
            if writer is not None:
                writer.close()
            writer = wds.TarWriter(str(dst / f"data-{i // per_shard:06d}.tar"))
        key, data, label = f"sample{i:06d}", files.read(i), files.label(i)
        sample = {"__key__": key, image_ext: data}
        if label_ext == "cls":
            sample["cls"] = label  # TarWriter's encoder writes the integer as text
        elif label_ext == "json":
            sample["json"] = {"label": label, "source": "synthetic"}
        else:  # both: the .cls wins
            sample["cls"], sample["json"] = label, {"label": label + 100}
        writer.write(sample)
        written[key] = (data, label)
    writer.close()
    return written


def by_key(source: ShardSource) -> dict:
    """key -> (bytes read, label) for every sample of a shard source."""
    return {source._names[i].rpartition(".")[0]: (source.read(i), source.label(i)) for i in range(len(source))}


# --------------------------------------------------------------------------- webdataset -> pipeprof


@pytest.mark.parametrize("reader", ["pipeprof", "webdataset"])
@pytest.mark.parametrize("label_ext, image_ext", [("cls", "jpg"), ("json", "jpeg"), ("both", "jpg")])
def test_tarwriter_shards_are_a_pipeprof_source(tiny_dataset, tmp_path, reader, label_ext, image_ext):
    written = write_with_tarwriter(
        tiny_dataset, tmp_path / "wds", per_shard=5, label_ext=label_ext, image_ext=image_ext
    )
    source = ShardSource(tmp_path / "wds", reader=reader)
    assert len(source) == len(written) == 12 and len(source.shards) == 3
    assert source.describe()["reader"] == reader
    got = by_key(source)
    assert got.keys() == written.keys()
    for key, (data, label) in written.items():
        assert got[key] == (data, label), key  # the same bytes; the .cls label, not the json's +100
        assert source.nbytes(list(got).index(key)) == len(data)
    # a brace range names the same shards, as it does for webdataset
    assert len(ShardSource(str(tmp_path / "wds" / "data-{000000..000002}.tar"), reader=reader)) == 12


def test_tarwriter_png_and_webp_images(tmp_path):
    dst = tmp_path / "wds"
    dst.mkdir()
    written = {}
    with wds.TarWriter(str(dst / "data-000000.tar")) as writer:
        for i, fmt in enumerate(["PNG", "WEBP", "PNG"]):
            buf = io.BytesIO()
            Image.new("RGB", (9, 7), (i * 40, 20, 200)).save(buf, fmt)
            key, ext = f"sample{i:06d}", fmt.lower()
            writer.write({"__key__": key, ext: buf.getvalue(), "cls": i + 3})
            written[key] = (buf.getvalue(), i + 3)
    for reader in ("pipeprof", "webdataset"):
        source = ShardSource(dst, reader=reader)
        assert by_key(source) == written
        assert Image.open(io.BytesIO(source.read(1))).size == (9, 7)


def test_a_json_label_must_hold_an_integer(tiny_dataset, tmp_path):
    dst = tmp_path / "wds"
    dst.mkdir()
    with wds.TarWriter(str(dst / "data-000000.tar")) as writer:
        writer.write({"__key__": "sample000000", "jpg": b"\xff\xd8not-a-real-jpeg", "json": {"caption": "a cat"}})
    with pytest.raises(SourceError, match=r"sample000000\.json is not an integer or an object with an integer 'label'"):
        ShardSource(dst)


# --------------------------------------------------------------------------- pipeprof -> webdataset


@pytest.fixture(scope="module")
def packed_one_shard(tiny_dataset, tmp_path_factory):
    dst = tmp_path_factory.mktemp("packed1")
    assert pack_folder(tiny_dataset, dst, shard_size_mb=100)["shards"] == 1
    return dst


def test_packed_shards_are_a_webdataset(tiny_dataset, shard_dir):
    n = len(list(shard_dir.glob("shard-*.tar")))
    urls = str(shard_dir / f"shard-{{000000..{n - 1:06d}}}.tar")  # WebDataset's own brace notation
    raw = list(wds.WebDataset(urls, shardshuffle=False).to_tuple("__key__", "jpg;jpeg;png", "cls"))
    assert len(raw) == 12 and len({key for key, _, _ in raw}) == 12
    for _, data, _ in raw:
        with Image.open(io.BytesIO(data)) as im:
            im.load()  # a whole image, decodable
    assert sorted((sha(data), int(cls)) for _, data, cls in raw) == folder_samples(tiny_dataset)
    # the usual user pipeline: decoded images and integer labels
    decoded = list(wds.WebDataset(urls, shardshuffle=False).decode("pil").to_tuple("jpg", "cls"))
    assert len(decoded) == 12
    assert all(isinstance(im, Image.Image) and isinstance(label, int) for im, label in decoded)
    assert sorted(label for _, label in decoded) == sorted(label for _, label in folder_samples(tiny_dataset))


def test_packed_members_are_grouped_by_key(shard_dir):
    for shard in sorted(shard_dir.glob("shard-*.tar")):
        with tarfile.open(shard) as tf:
            names = tf.getnames()
        keys = [name.partition(".")[0] for name in names]
        assert len(names) == 2 * len(set(keys))  # image + cls per key
        assert all(keys[k] == keys[k + 1] for k in range(0, len(keys), 2))  # one sample's files adjacent
        assert {name.partition(".")[2] for name in names} <= {"jpg", "jpeg", "png", "cls"}


# --------------------------------------------------------------------------- both readers agree


class IndexedBytes(RawBytesDataset):
    """Raw reads that say which sample they were, with its label (the loader sees the same ``source``)."""

    def __getitem__(self, index):
        return index, sha(self.source.read(index)), self.source.label(index)


def read_through_loader(source, workers: int = 2, batch_size: int = 2, max_batches: int = 60) -> dict:
    """index -> (sha1, label) from a real DataLoader with the shard sampler, until every sample came back."""
    it = iter(build_loader(IndexedBytes(source), batch_size=batch_size, num_workers=workers, collate_fn=list))
    got: dict = {}
    try:
        for _ in range(max_batches):
            for index, digest, label in next(it):
                assert got.setdefault(index, (digest, label)) == (digest, label)  # the same every pass
            if len(got) == len(source):
                break
    finally:
        shutdown(it)
    return got


@pytest.mark.parametrize("shards", ["shard_dir", "packed_one_shard"])  # one shard: the 2nd worker starts mid-shard
def test_webdataset_reader_matches_the_default_reader_in_workers(shards, request):
    where = request.getfixturevalue(shards)
    default, through_wds = ShardSource(where), ShardSource(where, reader="webdataset")
    assert len(through_wds) == len(default) == 12
    expected = {i: (sha(default.read(i)), default.label(i)) for i in range(len(default))}
    assert read_through_loader(through_wds) == expected
    assert read_through_loader(default) == expected


def test_webdataset_reader_serves_any_order_in_one_process(shard_dir):
    default, through_wds = ShardSource(shard_dir), ShardSource(shard_dir, reader="webdataset")
    order = list(range(len(default)))[::-1] + [3, 4, 5, 5, 0]  # backwards, forwards, a repeat
    assert [through_wds.read(i) for i in order] == [default.read(i) for i in order]
    through_wds.close()
    assert through_wds.read(7) == default.read(7)  # reopened after close


def test_source_class_takes_the_reader(shard_dir):
    assert source_class("shards")(shard_dir, reader="webdataset").reader == "webdataset"
    with pytest.raises(ValueError, match="unknown shard reader 'tfrecord'; allowed: pipeprof, webdataset"):
        ShardSource(shard_dir, reader="tfrecord")


def test_webdataset_reader_refuses_samples_split_across_the_shard(tiny_dataset, tmp_path):
    """All images, then all labels: pipeprof's index reads it, webdataset would see 24 half samples."""
    files = FileSource(tiny_dataset)
    shard = tmp_path / "shard-000000.tar"
    with tarfile.open(shard, "w") as tf:
        for ext in ("jpg", "cls"):
            for i in range(len(files)):
                data = files.read(i) if ext == "jpg" else str(files.label(i)).encode()
                info = tarfile.TarInfo(f"{i:06d}.{ext}")
                info.size = len(data)
                tf.addfile(info, io.BytesIO(data))
    assert by_key(ShardSource(tmp_path)) == {f"{i:06d}": (files.read(i), files.label(i)) for i in range(len(files))}
    with pytest.raises(SourceError, match=r"000000\.cls is not next to the other members of its sample"):
        ShardSource(tmp_path, reader="webdataset")


# --------------------------------------------------------------------------- config


def test_webdataset_reader_config_gets_its_own_label():
    cfg = C.build({"data": {"source": [{"kind": "shards", "reader": "webdataset"}]}})
    (spec,) = cfg.data.source
    assert spec.reader == "webdataset" and spec.label == "shards-webdataset" and spec.file_backed
    both = C.build(
        {
            "data": {
                "source": [
                    "shards",
                    {"kind": "shards", "reader": "webdataset"},
                    {"kind": "shards", "shard_size_mb": 50, "reader": "webdataset"},
                    {"kind": "throttled", "inner": {"kind": "shards", "reader": "webdataset"}, "mb_s": 20},
                ]
            }
        }
    )
    labels = [s.label for s in both.data.source]
    assert labels == ["shards", "shards-webdataset", "shards-50MB-webdataset", "throttled-shards-webdataset-20MBps"]
    assert both.data.source[0].reader == "pipeprof"
    assert [s.label for s in C.build(both.model_dump()).data.source] == labels  # run.json round trip


def test_bad_reader_names_the_allowed_values():
    with pytest.raises(C.ConfigError) as exc:
        C.build({"data": {"source": [{"kind": "shards", "reader": "tfrecord"}]}})
    msg = str(exc.value)
    assert "data.source.0.shards.reader" in msg and "'pipeprof'" in msg and "'webdataset'" in msg, msg
