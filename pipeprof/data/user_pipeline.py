"""A user's own Dataset, read for what ``pipeprof watch --tune`` can change in it, and the changes made there.

What it reads, and nothing else:

- the dataset's ``transform``: a torchvision ``Compose`` (v1 or v2) or an albumentations ``Compose``, and its
  steps by class name, or a class of the user's that only hands its image on to one (torchvision's references'
  ``ClassificationPresetTrain``: ``return self.transforms(img)``, read from its source);
- where its images come from (:func:`files_of`): a torchvision ``DatasetFolder`` / ``ImageFolder`` (``samples``:
  path and target; ``loader``: torchvision's own ``default_loader`` / ``pil_loader``), or any other dataset by
  watching its own ``__getitem__`` on a few samples.

The builders here each return a :class:`UserVariant` (a shallow copy of the dataset with one thing changed, the
collate it needs, and what the training process does to a batch on the job's device before the step):

- ``uint8``: the transform without its float conversion and Normalize (ToTensor + Normalize, ToImage +
  ToDtype + Normalize, albumentations' Normalize before ToTensorV2), the batch converted and normalised on
  the device (4x fewer bytes through the hand-off, no float work in the workers);
- ``decoder``: OpenCV's decoder instead of Pillow's where the dataset loads through torchvision's loader
  (the image handed to the transform is still a PIL image, so the transform is unchanged).

The GPU path (workers read the files' bytes; the batch decoded and augmented on the GPU) is
``data.user_gpu_pipeline``, built on what this module reads; ``data.user_actions`` holds the builders by action
id, what each says on a dataset (``inspect``) and what to write (``snippet``).
"""

from __future__ import annotations

import copy
from typing import Any, Callable, NamedTuple, Optional

import torch

from pipeprof.actions import DECODER_NAMES
from pipeprof.data.gpu_augment import channels
from pipeprof.measure.confounders import cap_cv2_threads

JPEG = (".jpg", ".jpeg", ".JPG", ".JPEG")


class UserVariant(NamedTuple):
    """A changed copy of the user's dataset, the collate its batches need (None: the loader's own) and the
    training process's work on a batch (``on_device(batch, device) -> images``; None: copy the images)."""

    dataset: Any
    collate: Optional[Callable] = None
    on_device: Optional[Callable] = None
    key: Any = None  # what ``collate`` and ``on_device`` do, comparable: the parts of a ConcatDataset must agree


def steps_of(transform) -> list:
    """The steps of a Compose (torchvision's or albumentations'), or the transform alone; a v2 ``ToPureTensor``
    at the end left out (it only unwraps a tensor subclass, which nothing after it reads)."""
    inner = getattr(transform, "transforms", None)
    steps = list(inner) if isinstance(inner, (list, tuple)) else [transform]
    while len(steps) > 1 and step_name(steps[-1]) == "ToPureTensor":
        steps.pop()
    return steps


#: timm's conversions (``timm.data.transforms``) by the torchvision step whose work each does: MaybePILToTensor
#: and ToNumpy hand on the image's uint8 values CHW (ToNumpy as an ndarray), as PILToTensor does; timm's own
#: ToTensor casts them to float unscaled, as a v2 ToDtype without ``scale`` does. (MaybeToTensor extends
#: torchvision's ToTensor, and is read through its class.)
TIMM_AS = {"MaybePILToTensor": "PILToTensor", "ToNumpy": "PILToTensor", "ToTensor": "ToDtype"}


def step_name(t) -> str:
    """The class name a step is read by: its own, or that of the torchvision / albumentations class it extends
    (a user's ``class MyNormalize(transforms.Normalize)`` is a Normalize), or the one a timm conversion stands for
    (:data:`TIMM_AS`)."""
    for c in type(t).__mro__:
        if c.__module__.startswith(("torchvision", "albumentations")):
            return c.__name__
    if type(t).__module__.startswith("timm.") and type(t).__name__ in TIMM_AS:
        return TIMM_AS[type(t).__name__]
    return type(t).__name__


def said(t) -> str:
    """A step's name in the words a user reads: :func:`step_name`, with a timm conversion's own name first."""
    name, own = step_name(t), type(t).__name__
    return f"timm's {own} (as {name})" if type(t).__module__.startswith("timm.") and name != own else name


def family(transform) -> Optional[str]:
    """'torchvision', 'albumentations' or None (something else, or no transform)."""
    if transform is None:
        return None
    module = type(transform).__module__
    for fam in ("torchvision", "albumentations"):
        if module.startswith(fam):
            return fam
    return None


class Tail(NamedTuple):
    """Where a transform ends in a float conversion and Normalize: the steps kept (up to uint8 CHW) and the
    normalisation the device does instead, ``(x / scale - mean) / std``."""

    kept: list
    mean: list
    std: list
    scale: float


def tail(transform) -> tuple[Optional[Tail], Optional[str]]:
    """(the uint8 form's parts, None) or (None, why the transform has none)."""
    fam, steps = family(transform), steps_of(transform)
    names = [step_name(t) for t in steps]
    if fam is None:
        return None, "the dataset's transform is not a torchvision or albumentations Compose"
    if fam == "albumentations":
        if names[-2:] != ["Normalize", "ToTensorV2"]:
            return None, f"its albumentations transform ends {' + '.join(names[-2:])}, not Normalize + ToTensorV2"
        norm = steps[-2]
        if getattr(norm, "normalization", "standard") != "standard":
            return None, f"its Normalize uses normalization={norm.normalization!r}: only 'standard' moves as is"
        return Tail(
            steps[:-2] + [steps[-1]], channels(norm.mean), channels(norm.std), float(norm.max_pixel_value)
        ), None
    if names[-1:] != ["Normalize"] or len(steps) < 2:
        return None, f"its transform ends with {names[-1] if names else 'nothing'}, not Normalize"
    norm, conv = steps[-1], steps[-2]
    # v2 converts once, anywhere before (ToImage first is its documented order), and scales at the end; with no
    # conversion before a scaling ToDtype the images come as tensors already (torchvision.io.decode_image, v2's
    # documented way): uint8 ones for the variant, which :func:`uint8` checks on a sample
    scales = names[-2] == "ToDtype" and getattr(conv, "scale", False)
    if not (names[-2] == "ToTensor" or scales):
        return None, f"its Normalize follows {names[-2]}, not ToTensor (or a scaling ToDtype)"
    return Tail(steps[:-2], channels(norm.mean), channels(norm.std), conversion_scale(conv, 1.0)), None


def tensors_in(transform) -> bool:
    """Whether a torchvision transform that ends in a scaling ToDtype + Normalize is handed tensors (no ToImage
    or PILToTensor before it): its uint8 form ends where its steps end, on the images as they came."""
    names = [step_name(t) for t in steps_of(transform)]
    return names[-2:] == ["ToDtype", "Normalize"] and not any(n in ("ToImage", "PILToTensor") for n in names[:-2])


class ToUint8CHW:
    """A PIL image, an HWC array or a CHW tensor as a uint8 CHW tensor (what ToTensor takes, before its /255)."""

    def __call__(self, img):
        if isinstance(img, torch.Tensor):
            if img.dtype != torch.uint8:  # a float image cast to uint8 would be truncated, not converted
                raise ValueError(f"the images reach Normalize as {img.dtype} tensors, not uint8 ones")
            return img
        import numpy as np

        arr = np.array(img)  # a copy: torch takes only writable arrays
        arr = arr[:, :, None] if arr.ndim == 2 else arr
        return torch.from_numpy(np.ascontiguousarray(arr)).permute(2, 0, 1).contiguous()

    def __repr__(self) -> str:
        return "ToUint8CHW()"


def normaliser(t: Tail) -> Callable:
    """``fn(images, device) -> float32 images``: the uint8 batch copied to ``device`` and normalised there by the
    GPU pipeline's Normalize (``gpu_augment.normalize``: (x / scale - mean) / std)."""
    from .gpu_augment import normalize

    op = normalize({"mean": list(t.mean), "std": list(t.std), "max_pixel_value": t.scale})

    def on_device(images: torch.Tensor, device) -> torch.Tensor:
        return op.batch(images.to(device, non_blocking=True), None)

    return on_device


def subset_aware(build: Callable[..., UserVariant]) -> Callable[..., UserVariant]:
    """``build`` through the datasets that wrap others: a ``torch.utils.data.Subset`` (``random_split``'s result)
    is built on the dataset it picks from, the variant picking the same indices; a ``ConcatDataset`` on each of
    its datasets (each read for its own files and transform), the variant their concatenation, where their
    variants agree on the batch's collate and its work on the device (one loader runs them all)."""
    import functools

    @functools.wraps(build)
    def built(dataset, *args, **kwargs) -> UserVariant:
        if isinstance(dataset, torch.utils.data.Subset):
            inner = built(dataset.dataset, *args, **kwargs)
            return inner._replace(dataset=torch.utils.data.Subset(inner.dataset, dataset.indices))
        if isinstance(dataset, torch.utils.data.ConcatDataset):
            kwargs.pop("files", None)  # each part's own
            parts = [built(d, *args, **kwargs) for d in dataset.datasets]
            if len({repr(p.key) for p in parts}) > 1:  # (one builder: one collate for every part)
                raise ValueError(
                    f"the {len(parts)} datasets of its ConcatDataset would need different work on each batch "
                    f"({'; '.join(repr(p.key) for p in parts)}): one loader cannot run them together"
                )
            return parts[0]._replace(dataset=torch.utils.data.ConcatDataset([p.dataset for p in parts]))
        return build(dataset, *args, **kwargs)

    return built


def inner(dataset):
    """The dataset a (nested) ``Subset`` picks from, or the first dataset of a ``ConcatDataset`` (its transform and
    files stand for the others', which its variants check), or the dataset itself."""
    while isinstance(dataset, (torch.utils.data.Subset, torch.utils.data.ConcatDataset)):
        dataset = dataset.dataset if isinstance(dataset, torch.utils.data.Subset) else dataset.datasets[0]
    return dataset


def _vision_dataset() -> tuple:
    try:
        from torchvision.datasets import VisionDataset
    except ImportError:  # no torchvision: no VisionDataset to tell apart
        return ()
    return (VisionDataset,)


def transform_attr(dataset) -> tuple[Optional[str], Optional[str]]:
    """(the attribute that holds the dataset's transform, None) or (None, why not): ``transform`` as torchvision's
    datasets name it, else the one attribute that holds a torchvision or albumentations transform (a user's
    ``self.tf`` or ``self.augment``). Two such attributes (``train_tf`` and ``val_tf``) are not told apart. A class
    of the user's that only hands the image on (:func:`forwarded`) is read through: 'transform.transforms'."""
    if getattr(dataset, "transform", None) is not None:
        inner = forwarded(dataset.transform)
        return ("transform" if inner is None else f"transform.{inner}"), None
    attrs = vars(dataset) if hasattr(dataset, "__dict__") else {}
    others = {"target_transform"}  # the targets'
    if isinstance(dataset, _vision_dataset()):  # its `transforms` takes (image, target) together
        others.add("transforms")
    found = [k for k, v in attrs.items() if k not in others and (_is_transform(v) or forwarded(v))]
    name = type(dataset).__name__
    if len(found) == 1:
        inner = forwarded(attrs[found[0]])
        return (found[0] if inner is None else f"{found[0]}.{inner}"), None
    if found:
        listed = ", ".join(f"`{k}`" for k in found)
        return None, f"`{name}` holds several transforms ({listed}): which one its items go through is not known"
    return None, f"`{name}` holds no torchvision or albumentations transform among its attributes"


def _is_transform(v) -> bool:
    return type(v).__module__.startswith(("torchvision.transforms", "albumentations"))  # not a model or a dataset


def forwarded(t) -> Optional[str]:
    """The attribute a transform class of the user's only hands its image on to, or None: its ``__call__``'s
    source is one ``return self.<attr>(img)`` (or albumentations' ``self.<attr>(image=img)``) and the attribute
    holds a torchvision or albumentations transform. torchvision's references (``ClassificationPresetTrain``,
    copied into many scripts) wrap their Compose so; anything more in the call is not read through."""
    import ast
    import inspect as source
    import textwrap

    if t is None or _is_transform(t) or not hasattr(t, "__dict__"):
        return None
    try:
        fn = ast.parse(textwrap.dedent(source.getsource(type(t).__call__))).body[0]
    except (OSError, TypeError, SyntaxError, IndexError):  # a builtin's, or source not at hand
        return None
    body = [b for b in getattr(fn, "body", []) if not (isinstance(b, ast.Expr) and isinstance(b.value, ast.Constant))]
    params = [a.arg for a in fn.args.args] if isinstance(fn, ast.FunctionDef) else []
    if len(params) != 2 or len(body) != 1 or not isinstance(body[0], ast.Return):
        return None
    call = body[0].value
    if not (isinstance(call, ast.Call) and isinstance(call.func, ast.Attribute)):
        return None
    handed = [*call.args, *(k.value for k in call.keywords if k.arg == "image")]
    only_image = len(handed) == 1 == len(call.args) + len(call.keywords) and isinstance(handed[0], ast.Name)
    forwards = isinstance(call.func.value, ast.Name) and call.func.value.id == params[0]
    if only_image and forwards and handed[0].id == params[1] and _is_transform(getattr(t, call.func.attr, None)):
        return call.func.attr
    return None


def _get(dataset, path: str):
    """``dataset.a.b`` for the path 'a.b'."""
    for part in path.split("."):
        dataset = getattr(dataset, part)
    return dataset


def transform_of(dataset):
    """The dataset's transform (:func:`transform_attr`), or None."""
    attr, _ = transform_attr(dataset)
    return _get(dataset, attr) if attr else None


def _with_transform(dataset, transform):
    """A shallow copy of ``dataset`` whose transform (:func:`transform_attr`) is ``transform`` (the samples, files
    and labels shared); a wrapper the transform is handed through (:func:`forwarded`) copied with it."""
    out = copy.copy(dataset)
    attr, _, inner = (transform_attr(dataset)[0] or "transform").partition(".")
    value = transform
    if inner:
        value = copy.copy(getattr(dataset, attr))
        setattr(value, inner, transform)
    setattr(out, attr, value)
    wrapped = getattr(dataset, "transforms", None)
    if attr == "transform" and type(wrapped).__name__ == "StandardTransform":  # torchvision's VisionDataset keeps both
        from torchvision.datasets.vision import StandardTransform

        out.transforms = StandardTransform(value, getattr(dataset, "target_transform", None))
    return out


def _compose_like(transform, steps: list):
    if family(transform) == "albumentations":
        import albumentations as A

        return A.Compose(steps)
    return type(transform)(steps)


def uint8_already(dataset, collate: Optional[Callable] = None) -> Optional[str]:
    """Why the uint8 change has nothing to move where the loader's batches are uint8 already (timm's
    ``fast_collate`` stacks its transform's uint8 images, normalised on the device by its ``PrefetchLoader``):
    the images of a batch of the dataset's first sample through the loader's collate (``default_collate`` where
    none is given); None where they are not uint8, or no batch could be made here."""
    from torch.utils.data import default_collate

    try:
        batch = (collate or default_collate)([dataset[0]])
    except Exception:  # noqa: BLE001 - an item or a collate that fails here: the transform's own reason stands
        return None
    images = batch[0] if isinstance(batch, (list, tuple)) else batch
    if isinstance(batch, dict):
        images = next((v for v in batch.values() if isinstance(v, torch.Tensor)), None)
    if not (isinstance(images, torch.Tensor) and images.dtype == torch.uint8):
        return None
    by = f"`{getattr(collate, '__module__', '')}.{getattr(collate, '__qualname__', type(collate).__name__)}`"
    return (
        f"its batches are uint8 already ({by if collate else 'the default collate'} hands over uint8 images of "
        f"{'x'.join(str(d) for d in images.shape[1:])}): nothing to convert or normalise is left in its workers"
    )


@subset_aware
def uint8(dataset, collate: Optional[Callable] = None) -> UserVariant:
    """The uint8 change (the module's docstring); ``collate``: the loader's, which says whether its batches are
    uint8 already (:func:`uint8_already`, read only where the transform has no float end to drop)."""
    attr, why = transform_attr(dataset)
    transform = _get(dataset, attr) if attr else None
    found, why = tail(transform) if attr else (None, why)
    if found is None:
        raise ValueError(uint8_already(dataset, collate) or why)
    kept = found.kept if family(transform) == "albumentations" else [*found.kept, ToUint8CHW()]
    key = {"mean": found.mean, "std": found.std, "scale": found.scale}  # the normalisation on the device
    variant = _with_transform(dataset, _compose_like(transform, kept))
    if family(transform) == "torchvision" and tensors_in(transform):
        try:  # what reaches ToDtype is the dataset's own: one sample says whether it is uint8
            variant[0]
        except Exception as exc:  # noqa: BLE001 - any failure of the changed transform is why it does not apply
            raise ValueError(f"without its ToDtype and Normalize, its first sample fails: {exc}") from exc
    return UserVariant(variant, None, normaliser(found), key)


#: the conversions to a tensor a transform's end is read through (:func:`tail`, and the GPU path's mapping)
CONVERSIONS = {"ToTensor": 255.0, "PILToTensor": None, "ToImage": None, "ToDtype": "scale"}


def conversion_scale(t, scale: Optional[float]) -> Optional[float]:
    """The pixel value 1.0 stands for after conversion ``t`` (one of :data:`CONVERSIONS`), ``scale`` before it:
    ToTensor divides by 255; ToDtype does where it scales; the others leave it as it was."""
    conv = CONVERSIONS[step_name(t)]
    return 255.0 if conv == "scale" and getattr(t, "scale", False) else conv if isinstance(conv, float) else scale


# ---- where a dataset's images come from: its files, its decoder, what its transform is handed ------------

PROBES = 4  # samples a dataset's own __getitem__ is watched on (each decoded once more to check its file)


class Files(NamedTuple):
    """A dataset read as "decode file i, hand it to the transform": each index's (path, target), the decoder it
    decodes with ('pil', 'cv2' or 'torchvision'), what its transform is handed (``form``: 'pil' an RGB PIL
    image, 'rgb' / 'bgr' an HWC uint8 array, 'chw' a uint8 CHW tensor), how the transform is called
    (``call``: 'positional', or albumentations' keyword 'image'), and where the list was found, in words."""

    samples: list
    decoder: str
    form: str
    call: str
    where: str
    folder: bool = False  # a torchvision DatasetFolder reading through torchvision's loader (``loader`` swaps)
    keys: Optional[tuple] = None  # items that are dicts: (the image's key, the target's key); None: pairs


def _torchvision_loader(loader) -> bool:
    return getattr(loader, "__module__", "") == "torchvision.datasets.folder" and getattr(loader, "__name__", "") in (
        "default_loader",
        "pil_loader",
    )


class _Recorder:
    """A transform that hands its input on to the real one and keeps a copy of it (the dataset's decoded image),
    how it was called and how often. The decoders are not looked for inside the real transform (a JPEG
    compression augmentation decodes too)."""

    def __init__(self, transform):
        self.transform, self.seen, self.call, self.calls = transform, None, None, 0

    def __call__(self, *args, **kwargs):
        import sys

        self.calls += 1
        if args:
            self.seen, self.call = copy.deepcopy(args[0]), "positional"
        elif set(kwargs) == {"image"}:
            self.seen, self.call = copy.deepcopy(kwargs["image"]), "image"
        else:
            self.call = f"keywords {', '.join(sorted(kwargs))}"
        watching = sys.getprofile()
        sys.setprofile(None)
        try:
            return self.transform(*args, **kwargs)
        finally:
            sys.setprofile(watching)


def _decoders_seen(found: set):
    """A profile function that adds to ``found`` each image decoder a call on this thread enters: Pillow's
    ``Image.open``, OpenCV's ``imread`` / ``imdecode``, torchvision.io's decoders. Seen by the calls, not by the
    user's source: whatever name the dataset imported them under."""
    import os
    import sys

    cv2 = sys.modules.get("cv2")
    cv2_fns = {id(getattr(cv2, n, None)) for n in ("imread", "imdecode")} - {id(None)} if cv2 else set()
    pil = os.path.join("PIL", "Image.py")
    tvio = os.path.join("torchvision", "io", "image.py")

    def profile(frame, event, arg):
        if event == "c_call" and id(arg) in cv2_fns:
            found.add("cv2")
        elif event == "call":
            code = frame.f_code
            if code.co_name == "open" and code.co_filename.endswith(pil):
                found.add("pil")
            elif code.co_name in ("decode_image", "decode_jpeg", "read_image") and code.co_filename.endswith(tvio):
                found.add("torchvision")

    return profile


def decode_file(path, decoder: str, form: str):
    """File ``path`` decoded by ``decoder`` and handed on in ``form`` (see :class:`Files`)."""
    import numpy as np

    with open(path, "rb") as f:
        data = f.read()
    if decoder == "torchvision":
        from torchvision.io import ImageReadMode, decode_image

        chw = decode_image(torch.frombuffer(bytearray(data), dtype=torch.uint8), mode=ImageReadMode.RGB)
        rgb = chw.permute(1, 2, 0).numpy()
    else:
        from .decode import decode_cv2, decode_pil

        rgb = (decode_cv2 if decoder == "cv2" else decode_pil)(data)
    if form == "pil":
        from PIL import Image

        return Image.fromarray(rgb)
    if form == "chw":
        return torch.from_numpy(np.ascontiguousarray(rgb)).permute(2, 0, 1).contiguous()
    return np.ascontiguousarray(rgb[:, :, ::-1] if form == "bgr" else rgb)


def _forms_of(img, rgb) -> set:
    """The forms (see :class:`Files`) in which ``img``, what the transform was handed, is the RGB array ``rgb``
    (a decode of its file): empty where it is not that image (cropped, resized, grey, another file); both 'rgb'
    and 'bgr' for a grey picture in an array, which either order reads alike."""
    import numpy as np

    def same(a) -> bool:
        a = np.asarray(a)
        return a.shape == rgb.shape and float(np.abs(a.astype(np.int16) - rgb.astype(np.int16)).mean()) <= 0.5

    if type(img).__module__.startswith("PIL") and getattr(img, "mode", None) == "RGB":
        return {"pil"} if same(img) else set()
    if isinstance(img, torch.Tensor) and img.dtype == torch.uint8 and img.dim() == 3 and img.shape[0] == 3:
        return {"chw"} if same(img.permute(1, 2, 0).numpy()) else set()
    if isinstance(img, np.ndarray) and img.dtype == np.uint8 and img.ndim == 3 and img.shape[2] == 3:
        return {f for f, a in (("rgb", img), ("bgr", img[:, :, ::-1])) if same(a)}
    return set()


def _int(v) -> Optional[int]:
    try:
        return int(v) if not isinstance(v, (str, bytes, float)) and int(v) == v else None
    except (TypeError, ValueError, RuntimeError):
        return None


def _path(v) -> bool:
    import os

    return isinstance(v, (str, os.PathLike))


def _columns(attrs: dict):
    """(name, value) for each attribute, a pandas DataFrame's columns and a Series as lists of their own
    (``df['path']``): a dataset read from a CSV holds its files and labels there, not in a list; and the
    ``samples`` list of an object that holds one (timm's ``ImageDataset`` keeps its files in its reader's:
    ``reader.samples``, (path, target) pairs)."""
    for name, v in attrs.items():
        if type(v).__module__.startswith("pandas") and hasattr(v, "columns"):
            yield from ((f"{name}[{c!r}]", v[c].to_list()) for c in v.columns)
        elif type(v).__module__.startswith("pandas") and hasattr(v, "to_list"):
            yield name, v.to_list()
        elif not isinstance(v, (list, tuple)) and isinstance(getattr(v, "samples", None), list):
            yield f"{name}.samples", v.samples
        else:
            yield name, v


def _lists(dataset, n: int) -> tuple[dict, dict]:
    """The dataset's attributes of ``n`` entries: those of paths (or (path, target) pairs), and those of
    integers (candidate targets), by name."""
    import numpy as np

    paths, ints = {}, {}
    for name, v in _columns(vars(dataset)):
        if not isinstance(v, (list, tuple, np.ndarray, torch.Tensor)) or getattr(v, "ndim", 1) == 0:
            continue
        if len(v) != n or n == 0:
            continue
        first = v[0]
        if _path(first):
            paths[name] = [(p, None) for p in v]
        elif isinstance(first, (list, tuple)) and len(first) >= 2 and _path(first[0]):
            paths[name] = [(p[0], p[1]) for p in v]
        elif _int(first) is not None:
            ints[name] = v
    return paths, ints


class _Seen(NamedTuple):
    index: int
    rec: _Recorder
    target: Any
    decoders: set
    keys: Optional[tuple]  # a dict item's (image key, target key)


def _watch_getitem(dataset, n: int) -> tuple[list, Optional[str]]:
    """The dataset's own ``__getitem__`` on :data:`PROBES` samples spread over it, its transform recorded and
    the decoders it calls seen (``sys.setprofile`` on this thread): ([_Seen], None) or ([], why not)."""
    import sys

    name, seen = type(dataset).__name__, []
    if sys.getprofile() is not None:  # another profiler (cProfile) holds the hook: it is not ours to replace
        return [], "a profiler is active in this process: the decoder calls cannot be watched"
    for i in sorted({round(k * (n - 1) / max(PROBES - 1, 1)) for k in range(PROBES)}):
        rec, found = _Recorder(transform_of(dataset)), set()
        probe = _with_transform(dataset, rec)
        old = sys.getprofile()
        sys.setprofile(_decoders_seen(found))
        try:
            item = probe[i]
        except Exception as exc:  # noqa: BLE001 - its own error, as a reason
            return [], f"`{name}[{i}]` failed with its transform recorded: {type(exc).__name__}: {exc}"
        finally:
            sys.setprofile(old)
        if rec.calls > 1:
            return [], f"`{name}.__getitem__` calls its transform {rec.calls} times a sample: one image is rebuilt"
        if rec.call is None or rec.call.startswith("keywords"):
            how = "did not call its transform" if rec.call is None else f"called its transform with {rec.call[9:]}"
            return [], f"`{name}.__getitem__` {how}: only (an image) or (image=...) is rebuilt"
        target, why = _target_of(item)
        if why:
            return [], f"`{name}`'s items {why}"
        seen.append(_Seen(i, rec, target, found, _dict_keys(item) if isinstance(item, dict) else None))
    return seen, None


def _target_of(item) -> tuple[Any, Optional[str]]:
    """(an item's target, None) for an (image, target) pair or a dict of an image and one integer; else
    (None, what it is instead)."""
    if isinstance(item, (tuple, list)):
        return (item[1], None) if len(item) == 2 else (None, f"have {len(item)} parts, not (image, target)")
    if isinstance(item, dict):
        keys = _dict_keys(item)
        return (
            (item[keys[1]], None)
            if keys
            else (None, f"are dicts of {', '.join(map(str, item))}, not an image and a target")
        )
    return None, f"are {type(item).__name__}, not (image, target) pairs"


def _dict_keys(item: dict) -> Optional[tuple]:
    """(image key, target key) of a dict item of two entries, one of them an integer; else None."""
    if len(item) != 2:
        return None
    ints = [
        k for k, v in item.items() if (v.dim() == 0 if isinstance(v, torch.Tensor) else True) and _int(v) is not None
    ]
    if len(ints) != 1:
        return None
    return next(k for k in item if k != ints[0]), ints[0]


def _matching_paths(paths: dict, seen: list, decoder: str) -> tuple[Optional[str], Optional[str]]:
    """(the attribute whose paths decode to what the transform was handed on every sample seen, the form it was
    handed in), or (None, None)."""
    for attr, listed in paths.items():
        forms = {"pil", "chw", "rgb", "bgr"}
        for s in seen:
            try:
                forms &= _forms_of(s.rec.seen, decode_file(listed[s.index][0], decoder, "rgb"))
            except Exception:  # noqa: BLE001 - not an image file: not this list
                forms = set()
            if not forms:
                break
        if forms:
            return attr, "rgb" if "rgb" in forms else forms.pop()  # all grey: either order, read as RGB
    return None, None


def _probe(dataset) -> tuple[Optional[Files], Optional[str]]:
    """A dataset that is not a DatasetFolder, read by watching its own ``__getitem__`` (:func:`_watch_getitem`):
    the one decoder it calls, the list of paths that decodes to what its transform is handed, and the list
    that holds the targets it returns."""
    name = type(dataset).__name__
    if isinstance(dataset, torch.utils.data.IterableDataset):
        return None, f"`{name}` is an IterableDataset: its items are not read by index, so its files cannot be listed"
    try:
        n = len(dataset)
    except TypeError:
        return None, f"`{name}` has no length: its files cannot be listed"
    paths, ints = _lists(dataset, n)
    if not paths:
        return None, f"`{name}` has no file list (a list of {n} paths among its attributes, or `samples`)"
    attr, why = transform_attr(dataset)
    if attr is None:
        return None, f"{why}: its decoded images cannot be seen through one"
    seen, why = _watch_getitem(dataset, n)
    if why:
        return None, why
    decoders = set().union(*(s.decoders for s in seen))
    if len(decoders) != 1:
        what = " and ".join(DECODER_NAMES[d] for d in sorted(decoders)) or "no Pillow, OpenCV or torchvision.io call"
        return None, f"`{name}.__getitem__` decodes with {what} (one of them, once a sample, is what can be swapped)"
    decoder = decoders.pop()
    attr, form = _matching_paths(paths, seen, decoder)
    if attr is None:
        return None, (
            f"none of `{name}`'s path lists ({', '.join(f'`{a}`' for a in paths)}) decodes, with "
            f"{DECODER_NAMES[decoder]}, to the image its transform is handed (checked on {len(seen)} samples): it "
            "does more than decode a file"
        )
    listed = paths[attr]
    lists = ([[t for _, t in listed]] if listed[0][1] is not None else []) + list(ints.values())
    for values in (v.tolist() if hasattr(v, "tolist") else v for v in lists):  # numbers, not 0-d tensors
        if all(_int(values[s.index]) is not None and _int(values[s.index]) == _int(s.target) for s in seen):
            where = f"`{name}.{attr}`, checked on {len(seen)} samples of its own __getitem__"
            samples = [(p, _int(values[i])) for i, (p, _) in enumerate(listed)]
            return Files(samples, decoder, form, seen[0].rec.call, where, keys=seen[0].keys), None
    by_folder = _folder_targets(dataset, listed, seen)
    if by_folder is not None:
        targets, classes = by_folder
        where = (
            f"`{name}.{attr}`, its targets by each file's folder through `{name}.{classes}`, checked on {len(seen)} "
            "samples of its own __getitem__"
        )
        samples = [(p, t) for (p, _), t in zip(listed, targets)]
        return Files(samples, decoder, form, seen[0].rec.call, where, keys=seen[0].keys), None
    return None, (
        f"`{name}`'s targets are not class indices in a list of its own, nor its files' folders' indices in a class "
        f"list or dict of its own (checked on {len(seen)} samples)"
    )


def _folder_targets(dataset, listed: list, seen: list) -> Optional[tuple[list, str]]:
    """(each file's target, the attribute it was read through) where the dataset's ``__getitem__`` returned, on
    every sample seen, its file's folder's index in a class list (``classes``) or a dict (``class_to_idx``) of its
    own: ImageFolder's layout with its targets worked out per item, not listed. None where no attribute does."""
    import os

    def folder(path) -> str:
        return os.path.basename(os.path.dirname(str(path)))

    for attr, value in vars(dataset).items():
        if (
            isinstance(value, dict)
            and value
            and all(isinstance(k, str) and _int(v) is not None for k, v in value.items())
        ):
            index = {k: _int(v) for k, v in value.items()}
        elif isinstance(value, (list, tuple)) and value and all(isinstance(k, str) for k in value):
            index = {k: i for i, k in enumerate(value)}
        else:
            continue
        if all(index.get(folder(listed[s.index][0])) == _int(s.target) for s in seen):
            targets = [index.get(folder(p)) for p, _ in listed]
            if None not in targets:  # every file in a folder the class list names
                return targets, attr
    return None


def files_of(dataset) -> tuple[Optional[Files], Optional[str]]:
    """(how the dataset's images come from its files, None) or (None, why not): a torchvision DatasetFolder read
    through torchvision's loader at once; any other dataset by watching its own ``__getitem__`` (:func:`_probe`)."""
    samples = getattr(dataset, "samples", None)
    if isinstance(samples, list) and samples and _torchvision_loader(getattr(dataset, "loader", None)):
        return Files(samples, "pil", "pil", "positional", f"`{type(dataset).__name__}.samples`", folder=True), None
    return _probe(dataset)


# ---- the other decoder -------------------------------------------------------------------------


def cv2_loader(path: str):
    """A file decoded by OpenCV (``data.decode.decode_cv2``), handed on as the RGB PIL image torchvision's loader
    gives."""
    from PIL import Image

    from .decode import DecodeError, decode_cv2

    cap_cv2_threads()
    with open(path, "rb") as f:
        data = f.read()
    try:
        return Image.fromarray(decode_cv2(data))
    except DecodeError as exc:
        raise ValueError(f"{path}: {exc}") from None


def other_decoder(files: Files) -> Optional[str]:
    """The decoder the other-decoder action swaps in: OpenCV for Pillow and Pillow for OpenCV (None: neither)."""
    return {"pil": "cv2", "cv2": "pil"}.get(files.decoder)


class Decoded(torch.utils.data.Dataset):
    """A dataset of :class:`Files` rebuilt with another decoder: file i decoded by ``decoder``, handed to the
    dataset's own transform in the form and the call its ``__getitem__`` used, with its target."""

    def __init__(self, files: Files, decoder: str, transform):
        self.files, self.decoder, self.transform = files, decoder, transform

    def __len__(self) -> int:
        return len(self.files.samples)

    def __getitem__(self, i):
        path, target = self.files.samples[i]
        if self.decoder == "cv2":
            cap_cv2_threads()
        img = decode_file(path, self.decoder, self.files.form)
        out = self.transform(image=img)["image"] if self.files.call == "image" else self.transform(img)
        if self.files.keys:  # the dataset's own dicts, for its own collate
            return {self.files.keys[0]: out, self.files.keys[1]: target}
        return out, target


@subset_aware
def decoder(dataset, files: Optional[Files] = None) -> UserVariant:
    files, why = (files, None) if files is not None else files_of(dataset)
    if files is None:
        raise ValueError(why)
    other = other_decoder(files)
    if other is None:
        raise ValueError(f"it decodes with {DECODER_NAMES[files.decoder]}: pipeprof swaps Pillow and OpenCV")
    if files.folder:  # torchvision's loader: swap the loader, the dataset is otherwise the user's own
        out = copy.copy(dataset)
        out.loader = cv2_loader
        return UserVariant(out)
    return UserVariant(Decoded(files, other, transform_of(dataset)))
