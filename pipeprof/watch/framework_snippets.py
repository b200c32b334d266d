"""What to write for a tried action in the terms of the framework a watched loader came from.

``data.user_actions.snippet`` writes each change for a script that builds its own DataLoader and runs its own loop
(``train_loader = DataLoader(variant.dataset, ...)``, ``images = variant.on_device(images, device)``). A loader a
framework built or asked for is changed where the framework takes it:

- timm (the loader's library frame in ``timm/``: ``create_loader`` built it): the GPU path replaces the loader
  ``create_loader(...)`` returns with a DataLoader of the same arguments (read off the one it built) over the
  files' bytes, ``create_loader`` kept as the user wrote it, since it is what sets the dataset's transform the
  GPU path reads; its ``PrefetchLoader``'s normalisation, where the batches were uint8 (``fast_collate``), kept
  in the loop. uint8 batches are timm's own ``use_prefetcher=True``;
- Lightning (the user's line called from ``lightning/``: its ``train_dataloader``): what ``train_dataloader``
  returns, and the step on the device in the same class's batch hooks: the GPU path in
  ``transfer_batch_to_device`` (nvJPEG reads the bytes from host memory: ``on_after_batch_transfer`` is handed
  them on the device already), uint8's normalisation in ``on_after_batch_transfer``.

The user's call is read from their file at the loader's line (:func:`loader_call`, pure), its arguments kept as
written. Anything not read falls back to the generic snippet.
"""

from __future__ import annotations

import ast
import linecache
import os
import re
from typing import NamedTuple, Optional

from pipeprof.watch import sites

#: a package's folder name -> the framework it is (a library frame inside it names the loader's framework)
PACKAGES = {"timm": "timm", "lightning": "lightning", "pytorch_lightning": "lightning"}


def framework_of(loader: dict) -> Optional[str]:
    """The framework that built the loader (timm's ``create_loader``: the library frame beside the user's line,
    ``library_site``) or called the user's code that built it (Lightning calls ``train_dataloader``: the frames
    of the loader's ``stack`` that are not the user's own, its first; a re-creation's library frame, where the
    run folder kept it), by the package those frames' files are in; None where none is a framework's."""
    frames = [loader.get("library_site"), (loader.get("rebuilt") or {}).get("library_site")]
    frames += [s.rsplit(" in ", 1)[0] for s in (loader.get("stack") or [])[1:]]
    for frame in frames:
        path = re.sub(r":\d+$", "", frame or "")
        if not path or not sites.is_library(path):
            continue
        found = next((PACKAGES[p] for p in path.replace(os.sep, "/").split("/") if p in PACKAGES), None)
        if found:
            return found
    return None


class LoaderCall(NamedTuple):
    """The user's call that built the loader, as written: the name it is assigned to (None: returned, or an
    expression), the dataset it is handed, its other arguments, whether it is returned, and the function it is
    in (None: at module level) with that function's first parameter (``self`` in a method)."""

    target: Optional[str]
    dataset: Optional[str]
    arguments: list
    returned: bool
    function: Optional[str]
    owner: Optional[str]


def loader_call(source: str, line: int, callee: str) -> Optional[LoaderCall]:
    """The innermost call of a function named ``callee`` (``create_loader``, ``DataLoader``; as a name or an
    attribute) spanning ``line`` of ``source``; None where none does or the source does not parse."""
    try:
        tree = ast.parse(source)
    except (SyntaxError, ValueError):
        return None
    best, parents = None, {}
    for node in ast.walk(tree):
        for child in ast.iter_child_nodes(node):
            parents[child] = node
        if isinstance(node, ast.Call) and _name(node.func) == callee and node.lineno <= line <= node.end_lineno:
            if best is None or node.end_lineno - node.lineno < best.end_lineno - best.lineno:
                best = node
    if best is None:
        return None
    keyword = next((k for k in best.keywords if k.arg == "dataset"), None)
    dataset = ast.unparse(best.args[0]) if best.args else ast.unparse(keyword.value) if keyword else None
    arguments = [ast.unparse(a) for a in best.args[1:]] + [
        f"{k.arg}={ast.unparse(k.value)}" if k.arg else f"**{ast.unparse(k.value)}"
        for k in best.keywords
        if k is not keyword
    ]
    up = parents.get(best)
    target = ast.unparse(up.targets[0]) if isinstance(up, ast.Assign) and len(up.targets) == 1 else None
    while up is not None and not isinstance(up, (ast.FunctionDef, ast.AsyncFunctionDef)):
        up = parents.get(up)
    owner = up.args.args[0].arg if up is not None and up.args.args else None
    return LoaderCall(
        target, dataset, arguments, isinstance(parents.get(best), ast.Return), up.name if up else None, owner
    )


def _name(func: ast.AST) -> str:
    return func.attr if isinstance(func, ast.Attribute) else func.id if isinstance(func, ast.Name) else ""


def _keyword(call: LoaderCall, name: str) -> Optional[str]:
    """The expression the call passes as keyword ``name``, as written; None where it does not."""
    return next((a.split("=", 1)[1] for a in call.arguments if a.startswith(f"{name}=")), None)


def _written(callee: str, first: str, arguments: list) -> str:
    """A call laid out one argument a line, as a formatter would."""
    return f"{callee}(\n" + "".join(f"    {a},\n" for a in [first, *arguments]) + ")"


def in_framework(action: str, loader: dict, snippet: Optional[str], user: Optional[dict] = None) -> Optional[str]:
    """``snippet`` (the generic one, ``{site}`` in it) written in the terms of the loader's framework
    (:func:`framework_of`) where it has a form for ``action`` and the user's call is read from their file;
    else ``snippet`` as it is. Only an action the pause could build (a snippet) gets one. ``user``: what the
    pause read of the dataset (``data.user_actions.inspect``: the uint8 change's normalisation)."""
    fw = framework_of(loader)
    writer = WRITERS.get((fw, action))
    if snippet is None or writer is None or not loader.get("path"):
        return snippet
    source = "".join(linecache.getlines(loader["path"]))
    call = loader_call(source, int(loader.get("line") or 0), CALLEES[fw]) if source else None
    if call is None or call.dataset is None:
        return snippet
    site = f"{loader['path']}:{loader['line']}"
    return writer(site, call, loader, (user or {}).get(action) or {}) or snippet


# ---- timm: what replaces create_loader(...) --------------------------------------------------------------


def _timm_gpu(site: str, call: LoaderCall, loader: dict, _found: dict) -> str:
    name = call.target or "loader"
    uint8_batches = str((loader.get("settings") or {}).get("collate_fn") or "").endswith("fast_collate")
    out = [
        f"# {site}: timm's create_loader as it is (it sets {call.dataset}.transform, which the GPU path reads), "
        "then a DataLoader of",
        "# the same arguments over the files' bytes; the GPU decodes and augments each batch (as measured)",
        "from pipeprof.data.user_gpu_pipeline import gpu_pipeline",
        "",
        f"{name} = " + _written("create_loader", call.dataset, call.arguments),
        f"variant = gpu_pipeline({call.dataset})",
        f'built = getattr({name}, "loader", {name})  # the DataLoader create_loader built (in a PrefetchLoader)',
        f"{name} = "
        + _written(
            "torch.utils.data.DataLoader",
            "variant.dataset",
            [f"{k}=built.{k}" for k in TIMM_KEPT] + ["collate_fn=variant.collate"],
        ),
    ]
    if uint8_batches:  # PrefetchLoader normalised the uint8 batches on the device: the loop does it now
        out += [
            "# timm's PrefetchLoader normalised the uint8 batches on the device: now the loop does",
            *(
                f"{v} = torch.tensor({_keyword(call, v) or 'timm.data.IMAGENET_DEFAULT_' + v.upper()}, "
                "device=device).view(1, -1, 1, 1) * 255"
                for v in ("mean", "std")
            ),
        ]
    erasing = _keyword(call, "re_prob") if uint8_batches else None
    if erasing is not None:  # ...and erased at random there (create_loader's re_prob)
        mode, count = _keyword(call, "re_mode") or "'const'", _keyword(call, "re_count") or "1"
        out.append(
            "random_erasing = timm.data.random_erasing.RandomErasing("
            f"probability={erasing}, mode={mode}, max_count={count}, device=device)"
        )
    out += [
        "# in the loop: the images are the files' bytes until on_device decodes and augments them",
        f"for images, labels in {name}:",
        "    images, labels = variant.on_device(images, device), labels.to(device)",
    ]
    if uint8_batches:
        out.append("    images = images.float().sub_(mean).div_(std)")
    if erasing is not None:
        out.append("    images = random_erasing(images)")
    return "\n".join(out)


#: the DataLoader arguments create_loader passes, read off the loader it built (its sampler: shuffle or the
#: distributed one)
TIMM_KEPT = (
    "batch_size",
    "sampler",
    "drop_last",
    "num_workers",
    "pin_memory",
    "persistent_workers",
    "worker_init_fn",
)


def _timm_uint8(site: str, call: LoaderCall, loader: dict, _found: dict) -> str:
    kept = [a for a in call.arguments if not a.startswith(("use_prefetcher=", "device="))]
    device = _keyword(call, "device") or "device"
    return "\n".join(
        [
            f"# {site}: timm's own uint8 hand-off: its transform ends in uint8 (MaybePILToTensor, no Normalize), "
            "fast_collate",
            "# stacks uint8 batches and its PrefetchLoader converts and normalises them on the device (mean and "
            "std as passed)",
            f"{call.target or 'loader'} = "
            + _written("create_loader", call.dataset, [*kept, "use_prefetcher=True", f"device={device}"]),
        ]
    )


# ---- Lightning: what train_dataloader returns, and the batch hooks ---------------------------------------


def _lightning_returns(call: LoaderCall, site: str, variant: str) -> tuple[list[str], str, str]:
    """(the lines that replace the user's DataLoader statement, where the hook goes, the variant's name there):
    the variant kept on the method's ``self`` (the same class's hooks read it; a loader built outside a method
    keeps it in a name of its own), the DataLoader over its dataset with the call's other arguments as written."""
    held = f"{call.owner}.variant" if call.function and call.owner == "self" else "variant"
    where = f"in `{call.function}`" if call.function else "where the DataLoader is built"
    args = [a for a in call.arguments if not a.startswith("collate_fn=")]
    built = _written("DataLoader", f"{held}.dataset", [*args, f"collate_fn={held}.collate"])
    head = "return " if call.returned else f"{call.target} = " if call.target else ""
    hook = "in the same class" if held != "variant" else "in the LightningModule"
    return [f"# {where} ({site}), instead of its DataLoader:", f"{held} = {variant}", head + built], hook, held


def _lightning_gpu(site: str, call: LoaderCall, loader: dict, _found: dict) -> str:
    lines, hook, held = _lightning_returns(call, site, f"gpu_pipeline({call.dataset})")
    return "\n".join(
        [
            "from pipeprof.data.user_gpu_pipeline import gpu_pipeline",
            "",
            *lines,
            "",
            f"# {hook}: Lightning hands each batch (the files' bytes) to transfer_batch_to_device, where the "
            "device decodes",
            "# and augments it (as measured); nvJPEG reads the bytes from host memory, so not in "
            "on_after_batch_transfer,",
            "# which is handed them on the device already",
            "def transfer_batch_to_device(self, batch, device, dataloader_idx):",
            "    images, labels = batch",
            f"    return {held}.on_device(images, device), labels.to(device)",
        ]
    )


def _lightning_uint8(site: str, call: LoaderCall, loader: dict, found: dict) -> Optional[str]:
    norm, generic = found.get("normalise"), (found.get("snippet") or "").splitlines()
    drop = next((line for line in generic if line.startswith("# the dataset's transform")), None)
    if not norm or drop is None:
        return None
    mean, std = ([round(v, 4) for v in norm[k]] for k in ("mean", "std"))
    hook = "in the same class" if call.function and call.owner == "self" else "in the LightningModule"
    return "\n".join(
        [
            drop.replace("{site}", site),
            f"# {hook}: Lightning copies the uint8 batch to the device, then on_after_batch_transfer converts "
            "and normalises",
            "# it there (as measured)",
            "def on_after_batch_transfer(self, batch, dataloader_idx):",
            "    images, labels = batch",
            f"    mean = torch.tensor({mean}, device=images.device).view(1, -1, 1, 1) * {norm['scale']:g}",
            f"    std = torch.tensor({std}, device=images.device).view(1, -1, 1, 1) * {norm['scale']:g}",
            "    return images.float().sub_(mean).div_(std), labels",
        ]
    )


#: (framework, action id) -> its writer ``fn(site, call, loader record, what the pause read of the action)``
WRITERS = {
    ("timm", "gpu_pipeline"): _timm_gpu,
    ("timm", "uint8"): _timm_uint8,
    ("lightning", "gpu_pipeline"): _lightning_gpu,
    ("lightning", "uint8"): _lightning_uint8,
}
#: the call the framework's loader is built by at the user's line
CALLEES = {"timm": "create_loader", "lightning": "DataLoader"}
