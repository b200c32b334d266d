"""``watch --tune``'s changes on the frameworks' own datasets and loaders, on their real classes: timm's
``ImageDataset`` read through its reader (its files, its transforms mapped or refused with the reason), uint8 not
offered where the batches are uint8 already (timm's ``fast_collate``), and the code to write in timm's terms
(what replaces ``create_loader(...)``) and Lightning's (what ``train_dataloader`` returns, the batch hooks), each
run as written."""

import contextlib
import json
import shutil
import tempfile
import time
from pathlib import Path

import pytest
import torch
from torch.utils.data import DataLoader

timm = pytest.importorskip("timm")

from pipeprof.data import user_actions as ua  # noqa: E402
from pipeprof.data import user_gpu_pipeline as ugp  # noqa: E402
from pipeprof.data import user_pipeline as up  # noqa: E402
from pipeprof.watch import framework_snippets as fs  # noqa: E402

CPU = torch.device("cpu")
MEAN, STD = [0.485, 0.456, 0.406], [0.229, 0.224, 0.225]


@pytest.fixture(scope="module")
def root(tmp_path_factory):
    from pipeprof.data.synthetic import make_dataset

    root = tmp_path_factory.mktemp("timm")
    make_dataset(root / "train", images=8, classes=2, seed=1, workers=1)
    return root


def _timm(root, **kwargs):
    """timm's dataset and loader as its train.py builds them (its loader at 64 px, batches of 4, no workers)."""
    from timm.data import create_dataset, create_loader

    dataset = create_dataset("", root=str(root), split="train", is_training=True)
    kwargs = {"num_workers": 0, "device": CPU} | kwargs
    loader = create_loader(dataset, input_size=(3, 64, 64), batch_size=4, is_training=True, **kwargs)
    return getattr(loader, "loader", loader)  # the DataLoader (inside timm's PrefetchLoader where it made one)


@contextlib.contextmanager
def watched():
    """The watch's hook in this process, over a real channel to a ``records.Store`` as the parent keeps one:
    the loaders built inside the block are recorded there (their sites, library frames and settings)."""
    from pipeprof.watch import channel, hook, records

    folder = tempfile.mkdtemp()  # a short path: a Unix socket's is limited to about 100 bytes
    server, store = channel.Server(folder), records.Store()
    watch = hook.Watch(channel.Client(server.path))
    before, hook._STATE = hook._STATE, watch
    watch.patch(torch.utils.data.dataloader)
    try:
        yield store
    finally:
        watch.unpatch()
        hook._STATE = before
        watch.client.flush()
        deadline = time.monotonic() + 10.0
        while not store.loaders and time.monotonic() < deadline:
            for cid, msg in server.drain():
                store.add(cid, msg)
            time.sleep(0.02)
        server.close()
        shutil.rmtree(folder)


def _line_of(text: str) -> int:
    return next(i for i, line in enumerate(Path(__file__).read_text().splitlines(), 1) if text in line)


def test_timms_image_dataset_is_read_for_its_files_from_its_readers_samples(root):
    ds = _timm(root).dataset
    files, why = up.files_of(ds)
    assert why is None and files.samples == ds.reader.samples and len(files.samples) == 8
    assert (files.decoder, files.form, files.call) == ("pil", "pil", "positional")
    assert files.where == "`ImageDataset.reader.samples`, checked on 4 samples of its own __getitem__"
    data, target = ugp.gpu_pipeline(ds).dataset[5]  # the GPU path's workers: each file's bytes and its target
    path, label = ds.reader.samples[5]
    assert bytes(data.numpy()) == Path(path).read_bytes() and target == label
    decoded, target = up.decoder(ds).dataset[5]  # the other decoder: timm's transform on OpenCV's decode
    assert decoded.shape == (3, 64, 64) and target == label
    snippet = ua.inspect(ds, cuda=True)["decoder"]["snippet"]  # a copy of timm's dataset: timm's code is not edited
    assert "is timm's `ImageDataset`: a copy of it that decodes with OpenCV instead of Pillow" in snippet
    assert snippet.endswith("train_set = decoder(train_set).dataset") and "__getitem__" not in snippet


def test_timms_training_transforms_map_to_the_gpu_path_its_random_interpolation_as_bilinear(root):
    built = _timm(root, interpolation="random")  # train.py's default: bilinear or bicubic drawn per image
    stored, words = ugp.gpu_transforms(built.dataset.transform)
    assert [t["__class_fullname__"] for t in stored] == ["RandomResizedCrop", "HorizontalFlip", "ColorJitter"]
    assert stored[0]["interpolation"] == 1 and stored[0]["size"] == [64, 64] and stored[0]["scale"] == [0.08, 1.0]
    assert words == (
        "RandomResizedCropAndInterpolation -> RandomResizedCrop, interpolation='random' (each image's drawn: "
        "bilinear or bicubic) -> bilinear for every image (the one the GPU's crop runs on the whole batch); "
        "RandomHorizontalFlip -> HorizontalFlip; ColorJitter -> ColorJitter; "
        "timm's MaybePILToTensor (as PILToTensor) -> (decoded as uint8 CHW)"
    )
    found = ua.inspect(built.dataset, cuda=False, collate=built.collate_fn)
    assert found["gpu_pipeline"]["why_not"] == f"no CUDA in this job (the transform maps: {words})"
    assert json.dumps(found).count("interpolation='random'") == 2  # in the mapping, and in the reason it quotes
    variant = ugp.gpu_pipeline(built.dataset)  # what the step gets: as timm's fast_collate hands it over
    ours = variant.on_device(ugp.collate_bytes([variant.dataset[i] for i in range(4)])[0], "cpu")
    theirs, _ = next(iter(built))
    assert ours.dtype == theirs.dtype == torch.uint8 and ours.shape == theirs.shape == (4, 3, 64, 64)
    floats = _timm(root, use_prefetcher=False)  # MaybeToTensor + Normalize: the normalisation moves too
    stored, words = ugp.gpu_transforms(floats.dataset.transform)
    assert words.endswith("timm's MaybeToTensor (as ToTensor) -> (its scale in Normalize); Normalize -> Normalize")
    assert stored[-1]["mean"] == pytest.approx(MEAN) and stored[-1]["max_pixel_value"] == 255.0


def test_timms_other_transforms_are_mapped_by_what_they_do_or_refused_with_the_reason(root):
    from timm.data import create_transform
    from timm.data.transforms import ToNumpy, ToTensor
    from torchvision import transforms

    erasing = create_transform(64, is_training=True, use_prefetcher=False, re_prob=0.25)
    assert ugp.gpu_transforms(erasing) == (
        None,
        f"transform `RandomErasing` has no GPU counterpart (mapped: {', '.join(ugp.MAPPED)})",
    )
    assert ugp.gpu_transforms(create_transform(64, is_training=True, auto_augment="rand-m9-mstd0.5"))[1].startswith(
        "transform `RandAugment` has no GPU counterpart"
    )
    stored, words = ugp.gpu_transforms(transforms.Compose([transforms.CenterCrop(48), ToNumpy()]))
    assert [t["__class_fullname__"] for t in stored] == ["CenterCrop"]
    assert words == "CenterCrop -> CenterCrop; timm's ToNumpy (as PILToTensor) -> (decoded as uint8 CHW)"
    # timm's own ToTensor casts without the /255: its Normalize is read on pixel values, and the GPU path's images
    # are the dataset's own (the two decoders differ by a level or two)
    ds = _timm(root).dataset
    ds.transform = transforms.Compose([ToTensor(), transforms.Normalize([128.0] * 3, [64.0] * 3)])
    stored, words = ugp.gpu_transforms(ds.transform)
    assert stored[-1]["max_pixel_value"] == 1.0 and "timm's ToTensor (as ToDtype)" in words
    variant = ugp.gpu_pipeline(ds)
    for i in range(4):  # one image a batch: the files are of several sizes
        ours = variant.on_device(ugp.collate_bytes([variant.dataset[i]])[0], "cpu")[0]
        theirs = ds[i][0]
        assert ours.shape == theirs.shape and float((ours - theirs).abs().mean()) < 2.0 / 64


def test_uint8_is_not_offered_where_timms_batches_are_uint8_already(root):
    built = _timm(root)  # timm's default, use_prefetcher: MaybePILToTensor, fast_collate, PrefetchLoader
    found = ua.inspect(built.dataset, cuda=True, collate=built.collate_fn)
    assert found["uint8"] == {
        "why_not": "its batches are uint8 already (`timm.data.loader.fast_collate` hands over uint8 images of "
        "3x64x64): nothing to convert or normalise is left in its workers",
        "snippet": None,
    }
    assert json.dumps(found).count("uint8 already") == 1
    assert "the default collate hands over uint8" in ua.inspect(built.dataset, cuda=True)["uint8"]["why_not"]
    floats = _timm(root, use_prefetcher=False)  # float batches: offered, timm's Normalize read for the device
    found = ua.inspect(floats.dataset, cuda=True, collate=floats.collate_fn)
    assert found["uint8"]["why_not"] is None
    assert found["uint8"]["normalise"]["mean"] == pytest.approx(MEAN) and found["uint8"]["normalise"]["scale"] == 255
    from torchvision import transforms

    floats.dataset.transform = transforms.Compose([transforms.CenterCrop(48), transforms.ToTensor()])
    assert (
        ua.inspect(floats.dataset, cuda=True)["uint8"]["why_not"] == "its transform ends with ToTensor, not Normalize"
    )


def test_timms_snippets_replace_create_loader_its_arguments_kept_and_run_as_written(root):
    from timm.data import create_dataset, create_loader

    dataset = create_dataset("", root=str(root), split="train", is_training=True)
    with watched() as store:
        loader = create_loader(  # the user's line
            dataset, (3, 64, 64), 4, is_training=True, interpolation="random", num_workers=0, device=CPU
        )
    (record,) = store.loaders.values()
    assert fs.framework_of(record) == "timm" and record["line"] == _line_of("create_loader(  # the user's line")
    user = ua.inspect(loader.loader.dataset, cuda=True, collate=loader.loader.collate_fn)
    text = fs.in_framework("gpu_pipeline", record, user["gpu_pipeline"]["snippet"], user)
    assert text == (
        f"# {__file__}:{record['line']}: timm's create_loader as it is (it sets dataset.transform, which the GPU "
        "path reads), then a DataLoader of\n"
        "# the same arguments over the files' bytes; the GPU decodes and augments each batch (as measured)\n"
        "from pipeprof.data.user_gpu_pipeline import gpu_pipeline\n\n"
        "loader = create_loader(\n    dataset,\n    (3, 64, 64),\n    4,\n    is_training=True,\n"
        "    interpolation='random',\n    num_workers=0,\n    device=CPU,\n)\n"
        "variant = gpu_pipeline(dataset)\n"
        'built = getattr(loader, "loader", loader)  # the DataLoader create_loader built (in a PrefetchLoader)\n'
        "loader = torch.utils.data.DataLoader(\n    variant.dataset,\n    batch_size=built.batch_size,\n"
        "    sampler=built.sampler,\n    drop_last=built.drop_last,\n    num_workers=built.num_workers,\n"
        "    pin_memory=built.pin_memory,\n    persistent_workers=built.persistent_workers,\n"
        "    worker_init_fn=built.worker_init_fn,\n    collate_fn=variant.collate,\n)\n"
        "# timm's PrefetchLoader normalised the uint8 batches on the device: now the loop does\n"
        "mean = torch.tensor(timm.data.IMAGENET_DEFAULT_MEAN, device=device).view(1, -1, 1, 1) * 255\n"
        "std = torch.tensor(timm.data.IMAGENET_DEFAULT_STD, device=device).view(1, -1, 1, 1) * 255\n"
        "# in the loop: the images are the files' bytes until on_device decodes and augments them\n"
        "for images, labels in loader:\n"
        "    images, labels = variant.on_device(images, device), labels.to(device)\n"
        "    images = images.float().sub_(mean).div_(std)"
    )
    ran = {
        "create_loader": create_loader,
        "dataset": dataset,
        "torch": torch,
        "timm": timm,
        "CPU": CPU,
        "device": "cpu",
    }
    exec(text, ran)  # as written: the loop runs a pass of the variant
    new, built = ran["loader"], ran["built"]
    assert new.dataset is ran["variant"].dataset and new.collate_fn is ran["variant"].collate
    kept = [(getattr(new, k), getattr(built, k)) for k in fs.TIMM_KEPT]
    assert all(a is b or a == b for a, b in kept), kept
    assert ran["images"].dtype == torch.float32 and ran["images"].shape == (4, 3, 64, 64)
    with watched() as store:  # timm's PrefetchLoader erases at random too: the loop does, with its arguments
        erased = create_loader(  # the user's erasing line
            dataset, (3, 64, 64), 4, is_training=True, re_prob=0.5, re_count=2, num_workers=0, device=CPU
        )
    (record,) = store.loaders.values()
    user = ua.inspect(erased.loader.dataset, cuda=True, collate=erased.loader.collate_fn)
    text = fs.in_framework("gpu_pipeline", record, user["gpu_pipeline"]["snippet"], user)
    assert (
        "random_erasing = timm.data.random_erasing.RandomErasing(probability=0.5, mode='const', max_count=2, "
        "device=device)"
        in text
        and text.endswith("    images = images.float().sub_(mean).div_(std)\n    images = random_erasing(images)")
    )
    exec(text, ran)
    assert ran["images"].dtype == torch.float32 and ran["images"].shape == (4, 3, 64, 64)
    # uint8 where its batches are floats: timm's own prefetcher, the call's other arguments kept
    with watched() as store:
        floats = create_loader(  # the user's float line
            dataset, (3, 64, 64), 4, is_training=True, use_prefetcher=False, num_workers=0, device=CPU
        )
    (record,) = store.loaders.values()
    user = ua.inspect(floats.dataset, cuda=True, collate=floats.collate_fn)
    text = fs.in_framework("uint8", record, user["uint8"]["snippet"], user)
    assert text.endswith(
        "floats = create_loader(\n    dataset,\n    (3, 64, 64),\n    4,\n    is_training=True,\n    num_workers=0,\n"
        "    use_prefetcher=True,\n    device=CPU,\n)"
    )
    exec(text, ran)
    images, _ = next(iter(ran["floats"]))
    assert type(ran["floats"]).__name__ == "PrefetchLoader" and images.dtype == torch.float32


def test_lightnings_snippets_are_what_train_dataloader_returns_and_its_batch_hooks_and_they_train(root):
    L = pytest.importorskip("lightning")
    from torchvision import datasets, transforms

    crop = [transforms.RandomResizedCrop(48), transforms.RandomHorizontalFlip()]
    tf = transforms.Compose([*crop, transforms.ToTensor(), transforms.Normalize(MEAN, STD)])

    class Data(L.LightningDataModule):
        def setup(self, stage=None):
            self.ds = datasets.ImageFolder(str(root / "train"), tf)

        def train_dataloader(self):
            return DataLoader(self.ds, batch_size=4, shuffle=True, num_workers=0)  # the Lightning line

    class Model(L.LightningModule):
        def __init__(self):
            super().__init__()
            self.net, self.seen = torch.nn.Linear(3, 2), []

        def training_step(self, batch, i):
            images, labels = batch
            self.seen.append((images.dtype, tuple(images.shape)))
            return torch.nn.functional.cross_entropy(self.net(images.mean((2, 3))), labels)

        def configure_optimizers(self):
            return torch.optim.SGD(self.parameters(), lr=0.01)

    def fit(data) -> list:
        model = Model()
        trainer = L.Trainer(
            max_steps=2,
            accelerator="cpu",
            logger=False,
            enable_checkpointing=False,
            enable_progress_bar=False,
            enable_model_summary=False,
        )
        trainer.fit(model, datamodule=data)
        return model.seen

    with watched() as store:
        theirs = fit(Data())
    (record,) = store.loaders.values()
    site = f"{__file__}:{_line_of('# the Lightning line')}"
    assert fs.framework_of(record) == "lightning" and f"{record['path']}:{record['line']}" == site
    user = ua.inspect(datasets.ImageFolder(str(root / "train"), tf), cuda=True)
    text = fs.in_framework("gpu_pipeline", record, user["gpu_pipeline"]["snippet"], user)
    assert text == (
        "from pipeprof.data.user_gpu_pipeline import gpu_pipeline\n\n"
        f"# in `train_dataloader` ({site}), instead of its DataLoader:\n"
        "self.variant = gpu_pipeline(self.ds)\n"
        "return DataLoader(\n    self.variant.dataset,\n    batch_size=4,\n    shuffle=True,\n    num_workers=0,\n"
        "    collate_fn=self.variant.collate,\n)\n\n"
        "# in the same class: Lightning hands each batch (the files' bytes) to transfer_batch_to_device, where the "
        "device decodes\n"
        "# and augments it (as measured); nvJPEG reads the bytes from host memory, so not in "
        "on_after_batch_transfer,\n"
        "# which is handed them on the device already\n"
        "def transfer_batch_to_device(self, batch, device, dataloader_idx):\n"
        "    images, labels = batch\n"
        "    return self.variant.on_device(images, device), labels.to(device)"
    )
    # written into the DataModule as it says (the lines in train_dataloader, the hook beside it), it trains on the
    # images the user's transform made: the same dtype and shape at each step
    code = text.split("instead of its DataLoader:\n")[1]
    body, hook = code.split("\n\n", 1)
    hook = "\n".join(line for line in hook.splitlines() if not line.startswith("#"))
    indent = "\n        "
    source = f"class Snipped(Data):\n    def train_dataloader(self):{indent}{indent.join(body.splitlines())}\n"
    source += "".join(f"    {line}\n" for line in hook.splitlines())
    scope = {"Data": Data, "DataLoader": DataLoader, "gpu_pipeline": ugp.gpu_pipeline}
    exec(source, scope)
    assert fit(scope["Snipped"]()) == theirs == [(torch.float32, (4, 3, 48, 48))] * 2
    text = fs.in_framework("uint8", record, user["uint8"]["snippet"], user)
    assert text.splitlines()[0].startswith("# the dataset's transform (`ImageFolder.transform`, its DataLoader: ")
    assert text.split("\n", 1)[1] == (
        "# in the same class: Lightning copies the uint8 batch to the device, then on_after_batch_transfer converts "
        "and normalises\n# it there (as measured)\n"
        "def on_after_batch_transfer(self, batch, dataloader_idx):\n"
        "    images, labels = batch\n"
        "    mean = torch.tensor([0.485, 0.456, 0.406], device=images.device).view(1, -1, 1, 1) * 255\n"
        "    std = torch.tensor([0.229, 0.224, 0.225], device=images.device).view(1, -1, 1, 1) * 255\n"
        "    return images.float().sub_(mean).div_(std), labels"
    )


def test_a_loader_of_the_users_own_keeps_the_generic_snippet(root):
    from torchvision import datasets, transforms

    ds = datasets.ImageFolder(
        str(root / "train"), transforms.Compose([transforms.CenterCrop(48), transforms.ToTensor()])
    )
    with watched() as store:
        DataLoader(ds, batch_size=4)
    (record,) = store.loaders.values()
    generic = ua.inspect(ds, cuda=True)["gpu_pipeline"]["snippet"]
    assert fs.framework_of(record) is None and fs.in_framework("gpu_pipeline", record, generic) == generic
    assert fs.in_framework("uint8", record, None) is None
