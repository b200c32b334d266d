"""The actions' forms on a user's own Dataset (``pipeprof watch --tune``): the builder of each by action id,
what each says on a dataset and what to write in the user's script.

:func:`inspect` looks at the dataset object a watched DataLoader was built with and says, for each pipeline
action of ``pipeprof.actions`` that has a user form (``Action.on_user``), whether it can be built here and why
not; the pause measures each variant against the user's own loader (``watch.pause``), and :func:`snippet` says
what to write for it. The builders are ``data.user_pipeline``'s (``uint8``, ``decoder``) and
``data.user_gpu_pipeline``'s (``gpu_pipeline``).

To add an action's user form: a builder ``fn(dataset, ...) -> UserVariant`` in :data:`BUILDERS` under the
action's id (taking ``files=``, its id in :data:`ON_FILES`, where it reads the dataset's files; else ``collate=``,
the loader's), its words in :func:`snippet`, and ``on_user=True`` on the action.
"""

from __future__ import annotations

from typing import Callable, Optional

import torch

from pipeprof.actions import DECODER_NAMES

from .user_gpu_pipeline import gpu_pipeline, gpu_transforms
from .user_pipeline import (
    Files,
    UserVariant,
    decoder,
    family,
    files_of,
    inner,
    other_decoder,
    tail,
    tensors_in,
    transform_attr,
    transform_of,
    uint8,
)

#: action id -> builder of its variant on a user's dataset (the actions with ``Action.on_user``)
BUILDERS: dict[str, Callable[..., UserVariant]] = {"uint8": uint8, "gpu_pipeline": gpu_pipeline, "decoder": decoder}
#: the packages whose dataset classes a snippet does not ask the user to edit (timm's ImageDataset)
LIBRARY_DATASETS = ("timm.",)
ON_FILES = {"gpu_pipeline", "decoder"}  # the builders that read the dataset's files (``files=``: read once)


def inspect(dataset, cuda: bool, collate: Optional[Callable] = None) -> dict:
    """For each builder: ``{"why_not": None or the reason, "snippet": what to write}`` on this dataset (``collate``:
    its loader's, which says whether its batches are uint8 already: ``user_pipeline.uint8_already``); the GPU
    path's ``mapping`` (its transform in the GPU table's words), uint8's ``normalise`` (the mean, std and scale
    the device normalises by) and the decoder's ``was`` (what the dataset decodes with) and ``to``; the GPU path
    is refused without CUDA, its mapping still shown (what would run). The dataset's files are read once
    (:func:`files_of`) for the builders that need them. A ``Subset`` is read through to the dataset it picks from
    (its transform, its files); its variants pick the same indices. A ``ConcatDataset``'s first dataset stands for
    the others in the words; its variants are built on each."""
    try:
        files, files_why = files_of(inner(dataset))
    except Exception as exc:  # noqa: BLE001 - a dataset that cannot be read this way: its reason, uint8 still tried
        files, files_why = None, f"its files could not be read: {type(exc).__name__}: {exc}"
    out = {}
    for key, build in BUILDERS.items():
        try:
            if key in ON_FILES:
                if files is None:
                    raise ValueError(files_why)
                build(dataset, files=files)
            else:
                build(dataset, collate=collate)
            why = None
        except (ValueError, LookupError, ImportError) as exc:
            why = str(exc)
        out[key] = {"why_not": why, "snippet": snippet(key, "{site}", dataset, files) if why is None else None}
    attr, why = transform_attr(inner(dataset))
    mapped, words = gpu_transforms(transform_of(inner(dataset))) if attr else (None, why)
    out["gpu_pipeline"]["mapping"] = words if mapped is not None else None
    if out["gpu_pipeline"]["why_not"] is None and not cuda:
        out["gpu_pipeline"]["why_not"] = f"no CUDA in this job (the transform maps: {words})"
    if files is not None:
        out["decoder"] |= {"was": files.decoder, "to": other_decoder(files), "files": files.where}
    found = tail(transform_of(inner(dataset)))[0] if out["uint8"]["why_not"] is None else None
    if found is not None:  # the normalisation the device does instead (a framework's snippet writes it)
        out["uint8"]["normalise"] = {"mean": found.mean, "std": found.std, "scale": found.scale}
    return out


def snippet(action: str, site: str, dataset, files: Optional[Files] = None) -> Optional[str]:
    """What to write in the user's script for ``action``: the line to change and the code, as measured (for a
    ``Subset``, the dataset it picks from; for a ``ConcatDataset``, each of its datasets: the GPU path's builder
    takes either as it is)."""
    if isinstance(dataset, torch.utils.data.ConcatDataset):
        note = "# train_set is a ConcatDataset: make the change in each of its datasets (train_set.datasets)\n"
        text = _snippet(action, site, inner(dataset), files, "for part in train_set.datasets:\n    part.loader = {}")
    elif isinstance(dataset, torch.utils.data.Subset):  # the change is to the dataset the Subset picks from
        note = (
            "# train_set is a Subset: change the dataset it picks from (train_set.dataset), which the other parts of\n"
            "# its random_split share (give them a dataset of their own where they must not change)\n"
        )
        text = _snippet(action, site, inner(dataset), files, "train_set.dataset.loader = {}")
    else:
        note, text = "", _snippet(action, site, dataset, files)
    return text if text is None or action == "gpu_pipeline" else note + text


def _snippet(
    action: str, site: str, dataset, files: Optional[Files], set_loader: str = "train_set.loader = {}"
) -> Optional[str]:
    """:func:`snippet` for the dataset itself; ``set_loader``: the statement that gives the user's dataset (or the
    datasets it wraps) another image loader, ``{}`` the loader."""
    if action == "uint8":
        return _uint8_snippet(site, dataset)
    if action in ("gpu_pipeline", "decoder"):
        files = files if files is not None else files_of(dataset)[0]
        return (
            _gpu_snippet(site, files)
            if action == "gpu_pipeline"
            else _decoder_snippet(site, dataset, files, set_loader)
        )
    return None


def _uint8_snippet(site: str, dataset) -> Optional[str]:
    attr, _ = transform_attr(dataset)
    transform = transform_of(dataset)
    found, _ = tail(transform) if attr else (None, None)
    if found is None:
        return None
    alb = family(transform) == "albumentations"
    drop = (
        "Normalize (keep ToTensorV2)"
        if alb
        else "v2.ToDtype and v2.Normalize (its images are uint8 tensors before them)"
        if tensors_in(transform)
        else "the float conversion and Normalize (end with transforms.PILToTensor(), or v2.ToImage())"
    )
    mean, std = ([round(v, 4) for v in vs] for vs in (found.mean, found.std))
    return (
        f"# the dataset's transform (`{type(dataset).__name__}.{attr}`, its DataLoader: {site}): drop {drop}\n"
        f"mean = torch.tensor({mean}, device=device).view(1, -1, 1, 1) * {found.scale:g}\n"
        f"std = torch.tensor({std}, device=device).view(1, -1, 1, 1) * {found.scale:g}\n"
        "# in the loop, where the batch goes to the device:\n"
        "images = images.to(device, non_blocking=True).float().sub_(mean).div_(std)"
    )


def _gpu_snippet(site: str, files: Optional[Files]) -> str:
    keys = files.keys if files is not None else None
    loop = (
        f"for images, labels in train_loader:  # (bytes, labels) pairs, not dicts of {', '.join(keys)}\n    "
        if keys
        else ""
    )
    return (
        f"# the DataLoader at {site}: workers read bytes, the GPU decodes and augments (as measured)\n"
        "from pipeprof.data.user_gpu_pipeline import gpu_pipeline\n"
        "variant = gpu_pipeline(train_set)\n"
        "train_loader = DataLoader(variant.dataset, collate_fn=variant.collate, ...same arguments...)\n"
        f"# in the loop:\n{loop}"
        "images = variant.on_device(images, device)"
    )


def _decoder_snippet(site: str, dataset, files: Optional[Files], set_loader: str) -> Optional[str]:
    if files is None or other_decoder(files) is None:
        return None
    if files.folder:
        return (
            f"# the dataset of the DataLoader at {site}: decode with OpenCV\n"
            "from pipeprof.data.user_pipeline import cv2_loader\n" + set_loader.format("cv2_loader")
        )
    cls = type(dataset).__name__
    if type(dataset).__module__.startswith(LIBRARY_DATASETS):  # its __getitem__ is not the user's to edit
        return (
            f"# the dataset of the DataLoader at {site} is {type(dataset).__module__.split('.')[0]}'s `{cls}`: "
            f"a copy of it that decodes with {DECODER_NAMES[other_decoder(files)]} instead of "
            f"{DECODER_NAMES[files.decoder]}\n# (its files and targets, its own transform; as measured)\n"
            "from pipeprof.data.user_pipeline import decoder\ntrain_set = decoder(train_set).dataset"
        )
    if other_decoder(files) == "cv2":
        code = (
            "img = cv2.imread(path)"
            if files.form == "bgr"
            else "img = cv2.cvtColor(cv2.imread(path), cv2.COLOR_BGR2RGB)"
        )
        code += {
            "pil": "\nimg = Image.fromarray(img)",
            "chw": "\nimg = torch.from_numpy(img).permute(2, 0, 1)",
        }.get(files.form, "")
    else:
        code = 'img = Image.open(path).convert("RGB")'
        code += {
            "rgb": "\nimg = np.asarray(img)",
            "bgr": "\nimg = np.asarray(img)[:, :, ::-1]",
            "chw": "\nimg = torch.from_numpy(np.asarray(img)).permute(2, 0, 1)",
        }.get(files.form, "")
    return (
        f"# in `{cls}.__getitem__` (the dataset of the DataLoader at {site}), where it reads file `path`: decode "
        f"with {DECODER_NAMES[other_decoder(files)]} instead of {DECODER_NAMES[files.decoder]}\n{code}"
    )
