"""The user's own DataLoader (a factory taking num_workers), an IterableDataset, and a user's WebDataset
pipeline, profiled end to end with verdicts. Real DataLoaders, real worker processes, real tar shards; no mocks.
"""

from __future__ import annotations

import io

import pytest
import torch
import webdataset as wds
from PIL import Image
from torch.utils.data import DataLoader, IterableDataset, Sampler

import pipeprof
from pipeprof import config as C
from pipeprof.checks.calibrate import BurnDataset, FixedStepModel
from pipeprof.measure.loader import EndlessIter, shutdown, user_batch, worker_pids

# short windows and warm-up: these tests check the plumbing, not the rates (a 0.1-s window still holds 7 or
# more batches of every loader here, and each trial outlives several of its loader's passes)
MEASURE = {
    "warmup_batches": 2,
    "warmup_s": 0.1,
    "warmup_max_s": 0.5,
    "redraws": 10,
    "window_s": 0.1,
    "window_batches": 2,
    "windows": 3,
    "max_windows": 3,
    "cpu_reference_s": 0,
}


def quiet(*args) -> None:
    pass


def profile(tmp_path, **kw):
    """pipeprof.profile on the CPU with a 5 ms CPU-free step and one step thread."""
    return pipeprof.profile(
        model=FixedStepModel(0.005, num_classes=10),
        device="cpu",
        threads=1,
        measure=MEASURE,
        out_dir=str(tmp_path),
        log=quiet,
        **kw,
    )


def assert_profiled(run, workers: list[int]) -> None:
    """cpu_pipeline and end_to_end ok at each worker count, with a verdict for each end-to-end trial."""
    rows = run.trials
    for kind in ("cpu_pipeline", "end_to_end"):
        sub = rows[rows["kind"] == kind]
        assert sorted(sub["num_workers"]) == workers, sub[["trial_id", "status", "error"]]
        assert (sub["status"] == "ok").all(), sub["error"].tolist()
        assert (sub["samples_per_s"] > 0).all()
    verdicts = run.meta["analysis"]["verdicts"]
    assert sorted(v["num_workers"] for v in verdicts) == workers
    assert all(v["verdict"] for v in verdicts)


# ---- 1. a user's DataLoader with its own sampler and collate ---------------------------------


class EvenIndices(Sampler):
    """A custom sampler: the even indices only, in order."""

    def __init__(self, n: int):
        self.n = n

    def __iter__(self):
        return iter(range(0, self.n, 2))

    def __len__(self) -> int:
        return self.n // 2


def even_tuple_collate(samples):
    """A custom collate returning a tuple; BurnDataset's label is index % 10, so even indices give even labels."""
    labels = torch.tensor([s[1] for s in samples])
    if (labels % 2).any():
        raise AssertionError("the custom sampler was bypassed")
    return torch.stack([s[0] for s in samples]), labels


def test_user_dataloader_factory_profiled_end_to_end(tmp_path):
    calls: list[int] = []

    def factory(num_workers: int) -> DataLoader:
        calls.append(num_workers)
        return DataLoader(
            BurnDataset(96, 0.001),
            batch_size=8,
            sampler=EvenIndices(96),
            collate_fn=even_tuple_collate,
            num_workers=num_workers,
        )

    run = profile(tmp_path, loader=factory, num_workers=[0, 1])
    assert_profiled(run, [0, 1])
    rows = run.trials
    loader_rows = rows[rows["kind"].isin(["cpu_pipeline", "end_to_end"])]
    assert (loader_rows["worker_policy"] == "user's DataLoader").all()
    assert (loader_rows["batch_size"] == 8).all() and loader_rows["pin_memory"].isna().all()
    # one pass is 6 batches: every trial outlived several epochs of the user's loader
    assert (loader_rows["loader_restarts"] > 0).all()
    # the probe's factory(0), then one loader per trial: cpu_pipeline and end_to_end at 1, and the answer's pair
    # trial (the pick against its rival in alternation) one more at 1 where it ran
    pair = len((run.meta.get("pair_trials") or {}).get("rows", []))
    assert calls.count(1) == 2 + pair and set(calls) == {0, 1}
    assert run.meta["dataset"] == {"kind": "user", "form": "loader"}
    assert "user's DataLoader" in run.meta["worker_policy"]


def test_profile_refuses_dataset_and_loader_together():
    with pytest.raises(ValueError, match="not both"):
        pipeprof.profile(BurnDataset(8), loader=lambda w: [])


# ---- 2. an IterableDataset passed as dataset= -------------------------------------------------


class Stream(IterableDataset):
    """24 tiny uint8 images, then the stream ends (it has no __getitem__ and no __len__)."""

    def __iter__(self):
        for i in range(24):
            yield torch.full((3, 8, 8), i, dtype=torch.uint8), i % 10


def test_iterable_dataset_restarts_when_exhausted(tmp_path):
    run = profile(tmp_path, dataset=Stream(), batch_size=8, num_workers=[0, 1], trials=["cpu_pipeline", "end_to_end"])
    assert_profiled(run, [0, 1])
    rows = run.trials
    assert (rows["loader_restarts"] > 0).all()  # each pass ends after 3 batches
    assert (rows["samples_measured"] % 8 == 0).all()
    assert "worker_policy" not in rows or rows["worker_policy"].isna().all()  # pipeprof's own loader


# ---- 3. a user's WebDataset pipeline -----------------------------------------------------------


def tiny_jpeg(i: int) -> bytes:
    buf = io.BytesIO()
    Image.new("RGB", (16, 16), (i * 7 % 256, 80, 160)).save(buf, "JPEG", quality=90)
    return buf.getvalue()


@pytest.fixture
def shards(tmp_path) -> list[str]:
    """4 TarWriter shards of 16 samples (jpg + cls): as many shards as the most workers tested, and more."""
    urls = []
    for s in range(4):
        path = tmp_path / f"train-{s:04d}.tar"
        with wds.TarWriter(str(path)) as sink:
            for i in range(16):
                sink.write({"__key__": f"s{s}-{i:04d}", "jpg": tiny_jpeg(i), "cls": (s * 16 + i) % 10})
        urls.append(str(path))
    return urls


def to_chw_uint8_tensor(image) -> torch.Tensor:
    """webdataset's rgb8 decoding gives HWC uint8 arrays; the model takes CHW."""
    return torch.tensor(image).permute(2, 0, 1).contiguous()  # a copy: the decoded array is read-only


def test_webdataset_pipeline_profiled_end_to_end(tmp_path, shards):
    def factory(num_workers: int):
        dataset = (
            wds.WebDataset(shards, shardshuffle=False)
            .decode("rgb8")
            .to_tuple("jpg", "cls")
            .map_tuple(to_chw_uint8_tensor, int)
            .batched(8)
        )
        return wds.WebLoader(dataset, batch_size=None, num_workers=num_workers)

    run = profile(tmp_path / "out", loader=factory, num_workers=[0, 2])
    assert_profiled(run, [0, 2])
    e2e = run.trials[run.trials["kind"] == "end_to_end"]
    ceiling = run.trials[run.trials["kind"] == "gpu_ceiling"].iloc[0]  # the step ceiling on batches like the user's
    assert (e2e["image_size"] == 16).all() and ceiling["input_dtype"] == "uint8" and ceiling["batch_size"] == 8
    # the monitor saw the WebLoader's workers (reached through the DataLoader it wraps)
    assert e2e.loc[e2e["num_workers"] == 2, "loader_restarts"].iloc[0] > 0


def test_webloader_worker_pids_are_found_and_stopped(shards):
    loader = wds.WebLoader(
        wds.WebDataset(shards, shardshuffle=False).to_tuple("jpg", "cls").batched(4), batch_size=None, num_workers=2
    )
    it = EndlessIter(loader)
    next(it)
    assert len(worker_pids(it)) == 2
    shutdown(it)


# ---- 4. batches and the config form --------------------------------------------------------------


def test_user_batch_forms():
    x, y = torch.zeros(4, 3, 8, 8), torch.arange(4)
    for batch in ({"image": x, "label": y}, {"images": x, "labels": y}, (x, y), [x, y, "extra"]):
        out = user_batch(batch)
        assert out["image"] is x and out["label"].tolist() == [0, 1, 2, 3]
    with pytest.raises(ValueError, match=r"dict with keys \['img', 'target'\].*'images' and 'labels'"):
        user_batch({"img": x, "target": y})
    with pytest.raises(ValueError, match="a Tensor; accepted batches"):
        user_batch(x)


def test_config_loader_kind_validates():
    cfg = C.build({"data": {"kind": "loader", "factory": "pipeprof.checks.calibrate:burn_loader"}})
    assert cfg.data.kind == "loader"
    with pytest.raises(C.ConfigError, match=r"data\.factory: required with kind 'loader'"):
        C.build({"data": {"kind": "loader"}})
    with pytest.raises(C.ConfigError, match="storage axes need pipeprof's own pipeline"):
        C.build({"data": {"kind": "loader", "factory": "pipeprof.checks.calibrate:burn_loader", "source": ["memory"]}})


@pytest.mark.parametrize("factory", ["pipeprof.checks.calibrate:no_such_loader", "pipeprof.checks.calibrate:burn"])
def test_config_loader_factory_that_cannot_serve_is_refused(tmp_path, factory):
    # burn(0) returns None: not an iterable of batches
    raw = {"data": {"kind": "loader", "factory": factory}, "device": "cpu", "out_dir": str(tmp_path)}
    with pytest.raises(C.ConfigError, match=r"data\.factory"):
        pipeprof.run(C.build(raw), log=quiet)
    assert not list(tmp_path.iterdir())  # refused before any run folder


def test_config_names_user_loader_by_import_path(tmp_path):
    raw = {
        "data": {"kind": "loader", "factory": "pipeprof.checks.calibrate:burn_loader"},
        "model": {"name": "pipeprof.checks.calibrate:fixed_step_model_5ms", "threads": 1},
        "loader": {"num_workers": [1]},
        "device": "cpu",
        "measure": MEASURE,
        "out_dir": str(tmp_path),
        "actions": "predict",
    }  # the plumbing of a loader named by path; action trials are test_action_trials.py's
    run = pipeprof.run(C.build(raw, origin="test"), log=quiet)
    assert_profiled(run, [1])
    rows = run.trials[run.trials["kind"] != "gpu_ceiling"]
    assert (rows["worker_policy"] == "user's DataLoader").all() and (rows["batch_size"] == 8).all()
