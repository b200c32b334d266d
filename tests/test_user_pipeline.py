"""A user's own Dataset read for the changes ``watch --tune`` tries (``data.user_pipeline``, ``data.user_actions``,
``data.user_gpu_pipeline``) and planned by the actions registry: on real torchvision ImageFolders of real JPEGs and
real albumentations pipelines."""

import pytest
import torch
from torchvision import datasets, transforms
from torchvision.transforms import v2

from pipeprof import actions
from pipeprof.answer import Answer
from pipeprof.data import user_actions as ua
from pipeprof.data import user_gpu_pipeline as ugp
from pipeprof.data import user_pipeline as up

MEAN, STD = [0.485, 0.456, 0.406], [0.229, 0.224, 0.225]


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    from pipeprof.data.synthetic import make_dataset

    root = tmp_path_factory.mktemp("user") / "ds"
    make_dataset(root, images=8, classes=2, seed=1, workers=1)
    return root


def _v1(folder, steps):
    return datasets.ImageFolder(folder, transforms.Compose(steps))


def _imagenet_style(folder):
    """The examples' transform: RandomResizedCrop, flip, ToTensor, Normalize (at 64 px)."""
    crop = [transforms.RandomResizedCrop(64), transforms.RandomHorizontalFlip()]
    return _v1(folder, crop + [transforms.ToTensor(), transforms.Normalize(MEAN, STD)])


class MyCrop:
    """A transform of the user's own: no GPU counterpart."""

    def __call__(self, img):
        return img.crop((0, 0, 64, 64))


def test_uint8_copy_normalised_on_the_device_is_the_users_batch(folder):
    ds = _imagenet_style(folder)
    variant = up.uint8(ds)
    torch.manual_seed(3)
    want = torch.stack([ds[i][0] for i in range(4)])
    torch.manual_seed(3)  # the same draws: the copy's crops and flips are the user's
    got = torch.stack([variant.dataset[i][0] for i in range(4)])
    assert got.dtype == torch.uint8 and ds.transform is not variant.dataset.transform
    assert torch.allclose(variant.on_device(got, "cpu"), want, atol=1e-5)
    assert [t.__class__.__name__ for t in ds.transform.transforms][-2:] == ["ToTensor", "Normalize"]  # untouched


def test_v2_and_albumentations_tails_are_read_with_their_scale(folder):
    ds = datasets.ImageFolder(
        folder,
        v2.Compose(
            [v2.RandomResizedCrop(32), v2.ToImage(), v2.ToDtype(torch.float32, scale=True), v2.Normalize(MEAN, STD)]
        ),
    )
    found, why = up.tail(ds.transform)
    assert (
        why is None
        and found.scale == 255.0
        and [type(t).__name__ for t in found.kept] == ["RandomResizedCrop", "ToImage"]
    )
    assert up.uint8(ds).dataset[0][0].dtype == torch.uint8
    import albumentations as A

    alb = A.Compose([A.HorizontalFlip(), A.Normalize(mean=MEAN, std=STD, max_pixel_value=200.0), A.ToTensorV2()])
    found, why = up.tail(alb)
    assert (
        why is None
        and found.scale == 200.0
        and [type(t).__name__ for t in found.kept] == ["HorizontalFlip", "ToTensorV2"]
    )


def _uint8_form_is_the_users_batch(ds) -> None:
    """The uint8 variant's sample, normalised on the device, is the user's own sample (the same random draws)."""
    import random

    variant = up.uint8(ds)
    torch.manual_seed(4), random.seed(4)  # timm's crop draws from Python's random
    want = ds[1][0]
    torch.manual_seed(4), random.seed(4)
    got = variant.dataset[1][0]
    assert got.dtype == torch.uint8 and torch.allclose(variant.on_device(got[None], "cpu")[0], want, atol=1e-5)


def test_v2_in_its_documented_order_toimage_first_has_a_uint8_form(folder):
    steps = [v2.ToImage(), v2.RandomResizedCrop(32), v2.ToDtype(torch.float32, scale=True), v2.Normalize(MEAN, STD)]
    ds = datasets.ImageFolder(folder, v2.Compose(steps))
    _uint8_form_is_the_users_batch(ds)
    _, words = ugp.gpu_transforms(ds.transform)
    assert "ToImage -> (decoded as uint8 CHW)" in words and "ToDtype -> (its scale in Normalize)" in words
    no_scale = v2.Compose([v2.RandomResizedCrop(32), v2.ToDtype(torch.float32), v2.Normalize(MEAN, STD)])
    assert "not ToTensor (or a scaling ToDtype)" in up.tail(no_scale)[1]


class Decoded(torch.utils.data.Dataset):
    """torchvision's v2 way: ``decode_image`` gives uint8 tensors, v2 transforms on them, a scaling ToDtype and
    Normalize last, no ToImage (``scaled``: the dataset hands float tensors in [0, 1] instead); targets worked out
    per item from the file's folder through ``classes``, not listed."""

    def __init__(self, folder, transform, scaled=False):
        base = datasets.ImageFolder(folder)
        self.paths, self.classes = [str(p) for p, _ in base.samples], list(base.classes)
        self.transform, self.scaled = transform, scaled

    def __len__(self):
        return len(self.paths)

    def __getitem__(self, i):
        import os

        from torchvision.io import decode_image

        img = decode_image(self.paths[i], mode=torchvision_rgb())
        img = img.float() / 255 if self.scaled else img
        return self.transform(img), self.classes.index(os.path.basename(os.path.dirname(self.paths[i])))


def torchvision_rgb():
    from torchvision.io import ImageReadMode

    return ImageReadMode.RGB


def _decoded_steps():
    return [v2.RandomResizedCrop(32), v2.RandomHorizontalFlip(), v2.ToDtype(torch.float32, scale=True)]


@pytest.mark.filterwarnings("ignore:The image decoding:DeprecationWarning")  # the user's own call
def test_images_that_come_as_uint8_tensors_have_a_uint8_form_and_float_ones_are_refused(folder):
    ds = Decoded(folder, v2.Compose([*_decoded_steps(), v2.Normalize(MEAN, STD)]))
    _uint8_form_is_the_users_batch(ds)
    assert "v2.ToDtype and v2.Normalize (its images are uint8 tensors before them)" in ua.snippet("uint8", "x", ds)
    scaled = Decoded(folder, v2.Compose([*_decoded_steps(), v2.Normalize(MEAN, STD)]), scaled=True)
    with pytest.raises(ValueError, match="its first sample fails: the images reach Normalize as torch.float32"):
        up.uint8(scaled)


@pytest.mark.filterwarnings("ignore:The image decoding:DeprecationWarning")  # the user's own call
def test_targets_worked_out_from_the_files_folder_are_read_through_the_class_list(folder):
    """A dataset with paths and a class list but no list of targets: its targets are its files' folders' indices in
    that list, checked against its own __getitem__; the GPU path and the other decoder read them so."""
    ds = Decoded(folder, v2.Compose([*_decoded_steps(), v2.Normalize(MEAN, STD)]))
    files, why = up.files_of(ds)
    assert why is None and "through `Decoded.classes`" in files.where
    assert [t for _, t in files.samples] == [ds[i][1] for i in range(len(ds))]
    found = ua.inspect(ds, cuda=True)
    assert found["gpu_pipeline"]["why_not"] is None and found["uint8"]["why_not"] is None
    assert "it decodes with torchvision.io" in found["decoder"]["why_not"]  # not a Pillow or OpenCV decode to swap
    encoded, labels = ugp.collate_bytes([ugp.gpu_pipeline(ds).dataset[i] for i in range(3)])
    assert labels.tolist() == [ds[i][1] for i in range(3)]
    # a class list in another order than the folders' answers other targets: not read through it
    ds.classes = ds.classes[::-1]
    shuffled = [ds[i][1] for i in range(len(ds))]
    assert [t for _, t in up.files_of(ds)[0].samples] == shuffled  # still what __getitem__ says


def test_a_transform_that_does_not_end_in_normalize_says_what_it_ends_with():
    found, why = up.tail(
        transforms.Compose([transforms.ToTensor(), transforms.Normalize(MEAN, STD), transforms.RandomErasing()])
    )
    assert found is None and "ends with RandomErasing" in why


def test_the_gpu_path_maps_torchvision_transforms_and_runs_them_on_a_device(folder):
    ds = _v1(
        folder,
        [
            transforms.RandomResizedCrop(48),
            transforms.RandomHorizontalFlip(),
            transforms.ColorJitter(0.2, 0.2),
            transforms.ToTensor(),
            transforms.Normalize(MEAN, STD),
        ],
    )
    stored, words = ugp.gpu_transforms(ds.transform)
    names = [t["__class_fullname__"] for t in stored]
    assert names == ["RandomResizedCrop", "HorizontalFlip", "ColorJitter", "Normalize"], words
    assert stored[2]["brightness"] == pytest.approx([0.8, 1.2]) and stored[3]["max_pixel_value"] == 255.0
    variant = ugp.gpu_pipeline(ds)
    encoded, labels = ugp.collate_bytes([variant.dataset[i] for i in range(4)])
    assert encoded["encoded"].dtype == torch.uint8 and encoded["encoded"].dim() == 1  # one tensor a batch
    files = [open(ds.samples[i][0], "rb").read() for i in range(4)]
    assert encoded["lengths"].tolist() == [len(f) for f in files] and bytes(encoded["encoded"]) == b"".join(files)
    assert labels.tolist() == [ds.samples[i][1] for i in range(4)]
    images = variant.on_device(encoded, "cpu")
    assert images.shape == (4, 3, 48, 48) and images.dtype == torch.float32
    assert -2.2 < float(images.min()) and float(images.max()) < 2.7  # normalised with the user's mean and std


def test_inspect_names_the_transform_without_a_counterpart_and_the_missing_gpu(folder):
    mine = ua.inspect(_v1(folder, [MyCrop(), transforms.ToTensor(), transforms.Normalize(MEAN, STD)]), cuda=True)
    assert mine["gpu_pipeline"]["why_not"].startswith("transform `MyCrop` has no GPU counterpart")
    assert mine["uint8"]["why_not"] is None and mine["decoder"]["why_not"] is None
    mapped = ua.inspect(_v1(folder, [transforms.RandomResizedCrop(32), transforms.ToTensor()]), cuda=False)
    assert mapped["gpu_pipeline"]["why_not"].startswith("no CUDA in this job (the transform maps: RandomResizedCrop")
    assert "ends with ToTensor, not Normalize" in mapped["uint8"]["why_not"]


def test_a_dataset_without_a_file_list_or_that_does_more_than_decode_is_refused_with_why(folder):
    tensors = torch.utils.data.TensorDataset(torch.zeros(4, 3, 8, 8), torch.zeros(4))
    found = ua.inspect(tensors, cuda=True)
    assert "has no file list" in found["gpu_pipeline"]["why_not"] and "has no file list" in found["decoder"]["why_not"]
    from PIL import Image

    grey = datasets.ImageFolder(folder, transforms.ToTensor(), loader=lambda p: Image.open(p).convert("L"))
    why = ua.inspect(grey, cuda=True)["decoder"]["why_not"]
    assert "does more than decode a file" in why and "`samples`" in why and "Pillow" in why


class FileList(torch.utils.data.Dataset):
    """A dataset as users write one: its own list of paths and labels, OpenCV's decode, an albumentations
    transform (``rgb``: converted to RGB, as it should; else handed on in OpenCV's BGR; ``crop``: a crop before
    the transform)."""

    def __init__(self, folder, transform, rgb=True, crop=False):
        base = datasets.ImageFolder(folder)
        self.paths = [str(p) for p, _ in base.samples]
        self.labels = [t + 10 for _, t in base.samples]  # not the folder's indices: read from this list
        self.transform, self.rgb, self.crop = transform, rgb, crop

    def __len__(self):
        return len(self.paths)

    def __getitem__(self, i):
        import cv2

        img = cv2.imread(self.paths[i])
        img = cv2.cvtColor(img, cv2.COLOR_BGR2RGB) if self.rgb else img
        img = img[:32] if self.crop else img
        return self.transform(image=img)["image"], self.labels[i]


def _albumentations():
    import albumentations as A

    return A.Compose([A.RandomResizedCrop(size=(48, 48)), A.HorizontalFlip(), A.Normalize(MEAN, STD), A.ToTensorV2()])


def test_a_file_list_dataset_is_read_by_watching_its_own_getitem(folder):
    ds = FileList(folder, _albumentations())
    files, why = up.files_of(ds)
    assert why is None and (files.decoder, files.form, files.call, files.folder) == ("cv2", "rgb", "image", False)
    assert files.samples == list(zip(ds.paths, ds.labels)) and "`FileList.paths`" in files.where
    found = ua.inspect(ds, cuda=True)
    assert all(found[k]["why_not"] is None for k in ("uint8", "gpu_pipeline", "decoder")), found
    assert (found["decoder"]["was"], found["decoder"]["to"]) == ("cv2", "pil")
    assert (
        'Image.open(path).convert("RGB")' in found["decoder"]["snippet"]
        and "FileList.__getitem__" in (found["decoder"]["snippet"])
    )
    # the other decoder hands the user's transform the same image, the same way, with the same targets
    plain = FileList(folder, lambda image: {"image": image})
    other = up.decoder(plain).dataset
    for i in range(len(ds)):
        mine, theirs = plain[i], other[i]
        assert theirs[1] == mine[1] and theirs[0].shape == mine[0].shape
        assert abs(theirs[0].astype(float) - mine[0].astype(float)).mean() < 2.0  # two JPEG decoders
    # the GPU path reads the listed files' bytes, with the listed targets
    encoded, labels = ugp.collate_bytes([ugp.gpu_pipeline(ds).dataset[i] for i in range(3)])
    assert bytes(encoded["encoded"]) == b"".join(open(p, "rb").read() for p in ds.paths[:3])
    assert labels.tolist() == ds.labels[:3]


def test_a_file_list_dataset_that_crops_or_keeps_bgr_is_read_as_it_is(folder):
    why = ua.inspect(FileList(folder, _albumentations(), crop=True), cuda=True)["gpu_pipeline"]["why_not"]
    assert "does more than decode a file" in why and "`paths`" in why and "OpenCV" in why
    bgr = FileList(folder, _albumentations(), rgb=False)
    assert up.files_of(bgr)[0].form == "bgr"
    found = ua.inspect(bgr, cuda=True)
    assert "BGR" in found["gpu_pipeline"]["why_not"] and found["decoder"]["why_not"] is None
    plain = FileList(folder, lambda image: {"image": image}, rgb=False)
    assert abs(up.decoder(plain).dataset[1][0].astype(float) - plain[1][0].astype(float)).mean() < 2.0


def test_the_other_decoder_hands_the_transform_the_same_image(folder):
    ds = _v1(folder, [transforms.PILToTensor()])
    pil, cv2 = ds[0][0].float(), up.decoder(ds).dataset[0][0].float()
    assert pil.shape == cv2.shape and (pil - cv2).abs().mean() < 2.0  # two JPEG decoders: within rounding


def _answer(side="input", resource="unattributed") -> Answer:
    return Answer({}, 2, 100.0, 2, 100.0, verdict="input-bound", side=side, resource=resource)


def test_the_registry_plans_the_users_pipeline_changes_from_what_the_pause_read(folder):
    user = ua.inspect(_v1(folder, [MyCrop(), transforms.ToTensor(), transforms.Normalize(MEAN, STD)]), cuda=True)
    facts = actions.Facts("cuda", "loader", prefetch_factor=2, user=user)
    planned = {p.id: p for p in actions.plan(_answer(), {"num_workers": 2, "pin_memory": True}, facts)}
    assert planned["uint8"].why_not is None and planned["decoder"].why_not is None
    assert "decode with OpenCV instead of Pillow" in planned["decoder"].action
    other = ua.inspect(FileList(folder, _albumentations()), cuda=True)
    flipped = actions.plan(_answer(), {"num_workers": 2}, actions.Facts("cuda", "loader", user=other))
    assert [p.params for p in flipped if p.id == "decoder"] == [{"decoder": "pil"}]
    assert "decode with Pillow instead of OpenCV" in next(p.action for p in flipped if p.id == "decoder")
    assert planned["gpu_pipeline"].why_not.startswith("transform `MyCrop`")
    assert "storage and decoding are its own" in planned["memory"].why_not
    assert planned["prefetch_factor"].params == {"prefetch_factor": 4}
    # without the pause's reading (a user's loader in a sweep), the pipeline's changes stay out of reach
    old = {p.id: p for p in actions.plan(_answer(), {"num_workers": 2}, actions.Facts("cuda", "loader"))}
    assert "only the DataLoader's knobs are tried" in old["uint8"].why_not
    # a step-bound answer: nothing input-side is tried
    step = {p.id: p for p in actions.plan(_answer("step", "step"), {"num_workers": 2}, facts)}
    assert all("binds on the step side" in p.why_not for p in step.values())


@pytest.mark.gpu
def test_the_users_pipeline_on_cuda_matches_its_cpu_form(folder):
    if not torch.cuda.is_available():
        pytest.skip("needs CUDA")
    ds = _imagenet_style(folder)
    variant = ugp.gpu_pipeline(ds, seed=5)
    encoded, _ = ugp.collate_bytes([variant.dataset[i] for i in range(4)])
    on_gpu = variant.on_device(encoded, "cuda")
    assert on_gpu.device.type == "cuda" and on_gpu.shape == (4, 3, 64, 64)
    on_cpu = ugp.gpu_pipeline(ds, seed=5).on_device(encoded, "cpu")  # the same draws; two JPEG decoders
    assert (on_gpu.cpu() - on_cpu).abs().mean() < 0.05
    u8 = up.uint8(ds)
    batch = torch.stack([u8.dataset[i][0] for i in range(4)])
    assert torch.allclose(u8.on_device(batch, "cuda").cpu(), u8.on_device(batch, "cpu"), atol=1e-5)


def test_each_action_with_a_user_form_has_its_builder_and_no_builder_is_orphaned():
    from pipeprof.actions import ACTIONS
    from pipeprof.data.user_actions import BUILDERS

    assert {a.id for a in ACTIONS.values() if a.on_user} == set(BUILDERS)


class DictItems(torch.utils.data.Dataset):
    """Items as dicts (an image and its label), Pillow's decode in ``__getitem__``, a torchvision transform."""

    def __init__(self, folder, transform):
        base = datasets.ImageFolder(folder)
        self.image_paths, self.targets = [p for p, _ in base.samples], [t for _, t in base.samples]
        self.transform = transform

    def __len__(self):
        return len(self.image_paths)

    def __getitem__(self, i):
        from PIL import Image

        with Image.open(self.image_paths[i]) as im:
            return {"pixels": self.transform(im.convert("RGB")), "label": torch.tensor(self.targets[i])}


def test_dict_items_are_read_and_rebuilt_with_their_keys(folder):
    ds = DictItems(folder, transforms.Compose([transforms.CenterCrop(32), transforms.PILToTensor()]))
    files, why = up.files_of(ds)
    assert why is None and (files.decoder, files.form, files.keys) == ("pil", "pil", ("pixels", "label"))
    assert "not dicts of pixels, label" in ua.snippet("gpu_pipeline", "train.py:9", ds, files)
    other = up.decoder(ds).dataset
    mine, theirs = ds[2], other[2]
    assert set(theirs) == {"pixels", "label"} and int(theirs["label"]) == int(mine["label"])
    assert (theirs["pixels"].float() - mine["pixels"].float()).abs().mean() < 2.0  # OpenCV's decode, same image
    three = DictItems(folder, transforms.PILToTensor())
    three.__class__ = type(
        "WithPath", (DictItems,), {"__getitem__": lambda s, i: {**DictItems.__getitem__(s, i), "p": 1}}
    )
    assert "are dicts of pixels, label, p" in up.files_of(three)[1]


def test_a_transform_called_twice_is_refused_and_one_that_decodes_inside_is_not_a_second_decoder(folder):
    import albumentations as A

    class TwoViews(FileList):
        def __getitem__(self, i):
            image, label = super().__getitem__(i)
            return torch.stack([image, self.transform(image=np.zeros((8, 8, 3), np.uint8))["image"]]), label

    import numpy as np

    two = TwoViews(folder, A.Compose([A.Resize(8, 8), A.ToTensorV2()]))
    assert "calls its transform 2 times a sample" in up.files_of(two)[1]
    # ImageCompression encodes and decodes with OpenCV inside the transform: the dataset's own decode is Pillow's
    jpeg = A.Compose([A.ImageCompression(quality_range=(50, 60), p=1.0), A.ToTensorV2()])
    files, why = up.files_of(DictItems(folder, lambda img: jpeg(image=np.asarray(img))["image"]))
    assert why is None and files.decoder == "pil"


def test_a_grey_picture_reads_in_either_channel_order_and_does_not_split_a_bgr_dataset(tmp_path, folder):
    import cv2
    import numpy as np

    grey = tmp_path / "grey" / "g"
    grey.mkdir(parents=True)
    cv2.imwrite(str(grey / "0.jpg"), np.full((40, 40, 3), 128, np.uint8))
    import shutil

    for p in sorted(folder.rglob("*.jpg"))[:3]:
        shutil.copy(p, grey / p.name)
    bgr = FileList(tmp_path / "grey", _albumentations(), rgb=False)
    assert bgr.paths[0].endswith("0.jpg")  # the grey picture is among the samples watched
    files, why = up.files_of(bgr)
    assert why is None and files.form == "bgr"


def test_a_subset_is_read_through_to_its_dataset_and_its_variants_pick_the_same_indices(folder):
    full = _imagenet_style(folder)
    train, _ = torch.utils.data.random_split(full, [6, len(full) - 6], generator=torch.Generator().manual_seed(0))
    found = ua.inspect(train, cuda=True)
    assert all(found[k]["why_not"] is None for k in ("uint8", "gpu_pipeline", "decoder")), found
    u8 = up.uint8(train).dataset
    assert isinstance(u8, torch.utils.data.Subset) and list(u8.indices) == list(train.indices)
    assert u8[0][0].dtype == torch.uint8 and u8[0][1] == train[0][1]
    assert found["decoder"]["snippet"].count("train_set.dataset.loader = cv2_loader") == 1
    gpu = ugp.gpu_pipeline(train).dataset
    first = train.indices[0]
    assert bytes(gpu[0][0]) == open(full.samples[first][0], "rb").read() and gpu[0][1] == full.samples[first][1]


class OwnNames(torch.utils.data.Dataset):
    """A dataset whose transform is not called ``transform``: ``self.tf`` (and ``self.val_tf`` where ``both``)."""

    def __init__(self, folder, tf, both=False):
        self.files = [str(p) for p, _ in datasets.ImageFolder(folder).samples]
        self.targets = [t for _, t in datasets.ImageFolder(folder).samples]
        self.tf = tf
        if both:
            self.val_tf = transforms.Compose([transforms.ToTensor()])

    def __len__(self):
        return len(self.files)

    def __getitem__(self, i):
        from PIL import Image

        with Image.open(self.files[i]) as im:
            return self.tf(im.convert("RGB")), self.targets[i]


class Streamed(torch.utils.data.IterableDataset):
    """An IterableDataset of the same files: nothing is read by index."""

    def __init__(self, folder, tf):
        self.files, self.tf = [str(p) for p, _ in datasets.ImageFolder(folder).samples], tf

    def __iter__(self):
        from PIL import Image

        for f in self.files:
            with Image.open(f) as im:
                yield self.tf(im.convert("RGB")), 0


def test_a_transform_under_its_own_attribute_name_is_found_and_replaced_there(folder):
    tf = _imagenet_style(folder).transform
    ds = OwnNames(folder, tf)
    assert up.transform_attr(ds) == ("tf", None)
    found = ua.inspect(ds, cuda=False)
    assert found["uint8"]["why_not"] is None and "`OwnNames.tf`" in found["uint8"]["snippet"]
    assert found["decoder"]["why_not"] is None and found["decoder"]["was"] == "pil"
    variant = up.uint8(ds)
    torch.manual_seed(5)
    want = torch.stack([ds[i][0] for i in range(3)])
    torch.manual_seed(5)
    got = torch.stack([variant.dataset[i][0] for i in range(3)])
    assert got.dtype == torch.uint8 and ds.tf is tf  # the copy's `tf` changed, the user's not
    assert torch.allclose(variant.on_device(got, "cpu"), want, atol=1e-5)
    two = ua.inspect(OwnNames(folder, tf, both=True), cuda=False)
    assert "several transforms (`tf`, `val_tf`)" in two["uint8"]["why_not"]
    assert "several transforms" in two["decoder"]["why_not"]


def test_an_iterable_dataset_gets_uint8_and_says_why_its_files_are_not_listed(folder):
    ds = Streamed(folder, _imagenet_style(folder).transform)
    found = ua.inspect(ds, cuda=True)
    assert found["uint8"]["why_not"] is None
    assert "IterableDataset" in found["decoder"]["why_not"] and "IterableDataset" in found["gpu_pipeline"]["why_not"]
    images = torch.stack([x for x, _ in up.uint8(ds).dataset])
    assert images.dtype == torch.uint8 and images.shape[0] == len(ds.files)


def test_a_concat_dataset_is_changed_in_each_of_its_datasets_where_one_loader_can_run_them(folder):
    """An ImageFolder and a file-list dataset of the same files and transform, concatenated: each part is read for
    its own files and transform, the variant is their concatenation; parts whose Normalize differs are refused."""
    folder_part = _imagenet_style(folder)
    own_part = OwnNames(folder, folder_part.transform)
    both = torch.utils.data.ConcatDataset([folder_part, own_part])
    found = ua.inspect(both, cuda=True)
    assert all(found[k]["why_not"] is None for k in ("uint8", "gpu_pipeline", "decoder")), found
    assert found["uint8"]["snippet"].startswith("# train_set is a ConcatDataset: make the change in each")
    assert "for part in train_set.datasets:\n    part.loader = cv2_loader" in found["decoder"]["snippet"]
    u8 = up.uint8(both)
    assert isinstance(u8.dataset, torch.utils.data.ConcatDataset) and len(u8.dataset) == len(both)
    last = len(both) - 1  # the second part's last item, through its own `tf`
    torch.manual_seed(7)
    want = both[last][0]
    torch.manual_seed(7)
    got = u8.dataset[last][0]
    assert got.dtype == torch.uint8 and torch.allclose(u8.on_device(got[None], "cpu")[0], want, atol=1e-5)
    decoded = up.decoder(both).dataset.datasets
    assert decoded[0].loader is up.cv2_loader and type(decoded[1]).__name__ == "Decoded"  # each by its own way
    gpu = ugp.gpu_pipeline(both).dataset
    assert bytes(gpu[last][0]) == open(own_part.files[-1], "rb").read() and gpu[last][1] == own_part.targets[-1]
    other = _v1(folder, [transforms.CenterCrop(32), transforms.ToTensor(), transforms.Normalize([0.5] * 3, [0.5] * 3)])
    why = ua.inspect(torch.utils.data.ConcatDataset([folder_part, other]), cuda=True)["uint8"]["why_not"]
    assert "would need different work on each batch" in why


def test_resize_of_the_shorter_side_and_a_plain_crop_map_to_the_gpu_and_give_torchvisions_images(folder):
    from pipeprof.data import gpu_augment as ga

    tail = [transforms.ToTensor(), transforms.Normalize(MEAN, STD)]
    ds = _v1(folder, [transforms.Resize(40), transforms.CenterCrop(32), *tail])
    stored, words = ugp.gpu_transforms(ds.transform)
    assert [t["__class_fullname__"] for t in stored] == ["SmallestMaxSize", "CenterCrop", "Normalize"], words
    variant = ugp.gpu_pipeline(ds)
    encoded, _ = ugp.collate_bytes([variant.dataset[i] for i in range(4)])
    got, want = variant.on_device(encoded, "cpu"), torch.stack([ds[i][0] for i in range(4)])
    assert got.shape == want.shape == (4, 3, 32, 32)
    # Pillow's antialiased resize against the tensor one (0.0003 levels of 255 apart on average, 1 at most)
    assert float((got - want).abs().mean()) * 0.226 * 255 < 0.1 and float((got - want).abs().max()) * 0.226 * 255 < 2
    # torchvision's rounding of the longer side (int) and albumentations' (round) where they differ: 70 x 99 to 64
    img = torch.randint(0, 256, (3, 70, 99), dtype=torch.uint8)
    g = torch.Generator()
    tv = ga.smallest_max_size(stored[0] | {"max_size": 64}).one(img, g)
    assert tv.shape[-2:] == v2.Resize(64)(img).shape[-2:] == (64, 90)
    import albumentations as A

    alb = A.SmallestMaxSize(max_size=64, p=1.0)(image=img.permute(1, 2, 0).numpy())["image"]
    assert (
        ga.smallest_max_size(A.to_dict(A.SmallestMaxSize(max_size=64))["transform"]).one(img, g).shape[-2:]
        == (alb.shape[:2])
        == (64, 91)
    )
    crop = ugp.gpu_transforms(transforms.Compose([transforms.RandomCrop(24), *tail]))[0]
    assert crop[0] == {"__class_fullname__": "RandomCrop", "height": 24, "width": 24}
    padded = ugp.gpu_transforms(transforms.Compose([transforms.RandomCrop(24, padding=4), *tail]))
    assert padded[0] is None and "RandomCrop with padding" in padded[1]
    capped = ugp.gpu_transforms(transforms.Compose([transforms.Resize(24, max_size=30), *tail]))
    assert capped[0] is None and "max_size=30" in capped[1]


class CsvImages(torch.utils.data.Dataset):
    """A dataset read from a table, as Kaggle notebooks write one: its paths and labels in a pandas DataFrame,
    its transform under ``transforms``, dict items."""

    def __init__(self, folder, transforms_):
        import pandas as pd

        base = datasets.ImageFolder(folder)
        self.df = pd.DataFrame({"path": [str(p) for p, _ in base.samples], "label": [t for _, t in base.samples]})
        self.transforms = transforms_

    def __len__(self):
        return len(self.df)

    def __getitem__(self, i):
        from PIL import Image

        row = self.df.iloc[i]
        return {"image": self.transforms(Image.open(row["path"]).convert("RGB")), "label": int(row["label"])}


def test_files_and_labels_in_a_dataframe_and_a_transform_under_transforms_are_found(folder):
    ds = CsvImages(folder, _imagenet_style(folder).transform)
    assert up.transform_attr(ds) == ("transforms", None)
    files, why = up.files_of(ds)
    assert why is None and "`CsvImages.df['path']`" in files.where and files.keys == ("image", "label")
    assert files.samples == list(zip(ds.df["path"], ds.df["label"]))
    found = ua.inspect(ds, cuda=True)
    assert all(found[k]["why_not"] is None for k in ("uint8", "gpu_pipeline", "decoder")), found
    variant = up.uint8(ds)
    torch.manual_seed(3)
    want = ds[2]["image"]
    torch.manual_seed(3)
    got = variant.dataset[2]["image"]
    assert got.dtype == torch.uint8 and torch.allclose(variant.on_device(got[None], "cpu")[0], want, atol=1e-5)
    # a VisionDataset's `transforms` takes the image and the target together: not read as the image's
    vision = datasets.ImageFolder(folder)
    assert up.transform_attr(vision)[0] is None


class PresetTrain:
    """torchvision's references/classification/presets.py, as scripts copy it: a class that only hands the image on
    to its v2 Compose, which ends in ToPureTensor."""

    def __init__(self, crop_size):
        self.transforms = v2.Compose(
            [
                v2.RandomResizedCrop(crop_size, antialias=True),
                v2.RandomHorizontalFlip(),
                v2.PILToTensor(),
                v2.ToDtype(torch.float, scale=True),
                v2.Normalize(MEAN, STD),
                v2.ToPureTensor(),
            ]
        )

    def __call__(self, img):
        return self.transforms(img)


class Converting(PresetTrain):
    """A wrapper that does more than hand the image on: not read through."""

    def __call__(self, img):
        return self.transforms(img.convert("RGB"))


def test_a_class_that_only_hands_its_image_to_a_compose_is_read_through(folder):
    ds = datasets.ImageFolder(folder, PresetTrain(48))
    assert up.transform_attr(ds) == ("transform.transforms", None) and up.transform_of(ds) is ds.transform.transforms
    found = ua.inspect(ds, cuda=True)
    assert all(found[k]["why_not"] is None for k in ("uint8", "gpu_pipeline", "decoder")), found
    assert "`ImageFolder.transform.transforms`" in found["uint8"]["snippet"]
    variant = up.uint8(ds)
    assert ds.transform.transforms.transforms[-1].__class__.__name__ == "ToPureTensor"  # the user's not changed
    torch.manual_seed(4)
    want = torch.stack([ds[i][0] for i in range(3)])
    torch.manual_seed(4)
    got = torch.stack([variant.dataset[i][0] for i in range(3)])
    assert got.dtype == torch.uint8 and torch.allclose(variant.on_device(got, "cpu"), want, atol=1e-5)
    stored, words = ugp.gpu_transforms(up.transform_of(ds))
    assert [t["__class_fullname__"] for t in stored] == ["RandomResizedCrop", "HorizontalFlip", "Normalize"], words
    why = ua.inspect(datasets.ImageFolder(folder, Converting(48)), cuda=True)["uint8"]["why_not"]
    assert why == "the dataset's transform is not a torchvision or albumentations Compose"


def test_timms_training_transform_gets_uint8_and_the_gpu_path_and_a_scalar_mean_is_read(folder):
    """timm's ``create_transform``: its crop (RandomResizedCropAndInterpolation) maps to the GPU's, its ToTensor
    (MaybeToTensor) converts, and its Normalize holds tensors (a snippet once failed on ``round`` of one)."""
    from timm.data import create_transform

    ds = datasets.ImageFolder(folder, create_transform(48, is_training=True, color_jitter=0.4))
    found = ua.inspect(ds, cuda=True)
    assert all(found[k]["why_not"] is None for k in ("uint8", "gpu_pipeline", "decoder")), found
    assert "mean = torch.tensor([0.485, 0.456, 0.406], device=device)" in found["uint8"]["snippet"]
    _uint8_form_is_the_users_batch(ds)
    stored, words = ugp.gpu_transforms(ds.transform)
    names = [t["__class_fullname__"] for t in stored]
    assert names == ["RandomResizedCrop", "HorizontalFlip", "ColorJitter", "Normalize"], words
    assert stored[0]["scale"] == [0.08, 1.0] and stored[3]["mean"] == pytest.approx(MEAN)
    encoded, _ = ugp.collate_bytes([ugp.gpu_pipeline(ds).dataset[i] for i in range(3)])
    assert ugp.gpu_pipeline(ds).on_device(encoded, "cpu").shape == (3, 3, 48, 48)
    drawn = datasets.ImageFolder(folder, create_transform(48, is_training=True, interpolation="random"))
    found = ua.inspect(drawn, cuda=True)["gpu_pipeline"]  # bilinear or bicubic per image: bilinear for all, said
    assert found["why_not"] is None and "interpolation='random'" in found["mapping"]
    # a mode the GPU's resize lacks is refused with its name, never timed as bilinear
    lanczos = datasets.ImageFolder(folder, create_transform(48, is_training=True, interpolation="lanczos"))
    found = ua.inspect(lanczos, cuda=True)["gpu_pipeline"]
    assert "interpolation lanczos has no GPU counterpart" in found["why_not"]
    import albumentations as A

    scalar = A.Compose([A.HorizontalFlip(), A.Normalize(mean=0.5, std=0.25), A.ToTensorV2()])
    assert up.tail(scalar)[0].mean == [0.5] and up.tail(scalar)[0].std == [0.25]
    img = torch.randint(0, 256, (2, 3, 8, 8), dtype=torch.uint8)
    on_device = up.normaliser(up.tail(scalar)[0])(img, "cpu")
    assert torch.allclose(on_device, (img / 255.0 - 0.5) / 0.25, atol=1e-6)
