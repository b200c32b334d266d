"""The GPU pipeline's JPEG decoders, one axis of the sweep (``augment.gpu_decoder``): each turns a batch of
encoded byte tensors (CPU, 1-D uint8) into a list of CHW uint8 RGB images on the device, in one call.

| backend      | library                                     | where it decodes                                 |
|--------------|---------------------------------------------|--------------------------------------------------|
| ``nvjpeg``     | ``torchvision.io.decode_jpeg`` (batched)     | nvJPEG: its hardware backend for baseline JPEGs  |
|              |                                             | on A100/H100/H200, else the SMs (libjpeg on CPU) |
| ``torchcodec`` | ``torchcodec.decoders.decode_jpeg`` (≥ 0.14) | nvJPEG on CUDA, libjpeg-turbo on the CPU          |
| ``nvimgcodec`` | ``nvidia.nvimgcodec`` HW_GPU_ONLY backend    | the GPU's hardware JPEG engines (NVJPG) only     |

torchvision 0.29 deprecates its ``decode_jpeg`` in favour of TorchCodec's, so the path must not rest on it
alone. torchvision's decoder already asks nvJPEG for its hardware backend (its source: ``NVJPEG_BACKEND_HARDWARE``
where the GPU has the engines, baseline JPEGs batched there, the others on the SMs); nvImageCodec's HW_GPU_ONLY
takes the engines only, and only a measurement end to end says which is faster (docs/measured.md, "The GPU
pipeline"). A backend that cannot run here is
refused with the reason (:class:`BackendMissing`): the sweep records the trial as failed with it, the benchmark
skips it and says why.

Each decoder's output is ordered on the *current* CUDA stream, so the producer thread of an overlapped pipeline
(``trials.device_side.Overlapped``) gets its batches on its own stream: torchvision and TorchCodec decode on a
stream of their own and make the current one wait for it; nvImageCodec is handed the current one
(``cuda_stream``). Before each decode the current stream's queued work is waited for (:func:`settle`): no backend
waits for it on the device.
"""

from __future__ import annotations

import importlib.util
import warnings
from typing import Callable, Optional

import torch

from pipeprof.config import ConfigError
from pipeprof.schema import GPU_DECODERS


class BackendMissing(ConfigError):
    """A decoder backend that cannot run in this process: the message says why and what would make it run."""


Decode = Callable[[list], list]


def settle(device: torch.device) -> None:
    """Wait for the work queued on the current stream before a decode, whichever the backend: none of them waits
    for it on the device.

    * torchvision's and TorchCodec's decoders take their output tensors from PyTorch's cache
      on the current stream but write them from a stream of their own: a block freed with kernels still queued (the
      step's activations, the last batch's augment scratch) could be written while they read it.
    * nvImageCodec starts decoding on its own streams when called and orders only its result on the stream it is
      handed: serially, without the wait, a batch's decode ran beside the step before it, and the marks around it
      read a fraction of its time (docs/measured.md, "The GPU pipeline's decode behind the step").

    The wait costs the producer thread nothing it would not wait anyway (the decode call blocks it, its stream holds
    only its own work); on the training thread (overlap off) it keeps the next batch's decode behind this step,
    which is what serial means. Nothing to wait for on a CPU."""
    if torch.device(device).type == "cuda":
        torch.cuda.current_stream().synchronize()


def missing(name: str, device: torch.device) -> Optional[str]:
    """Why backend ``name`` cannot decode on ``device`` here, or None when it can (imports nothing heavy
    beyond what the check needs)."""
    if name not in GPU_DECODERS:
        return f"unknown GPU decoder {name!r}: one of {', '.join(GPU_DECODERS)}"
    if name == "torchcodec":
        if importlib.util.find_spec("torchcodec") is None:
            return "torchcodec is not installed (pip install 'pipeprof[torchcodec]', a release built for this torch)"
        try:
            from torchcodec.decoders import decode_jpeg  # noqa: F401  (image decoders arrived in 0.14)
        except (ImportError, OSError, RuntimeError) as exc:  # a build for another torch fails to load its ops
            return f"torchcodec does not load its image decoder here ({type(exc).__name__}: {str(exc)[:160]})"
    if name == "nvimgcodec":
        if device.type != "cuda":
            return "nvImageCodec's hardware backend decodes on a GPU's JPEG engines; this trial's device is the CPU"
        if importlib.util.find_spec("nvidia.nvimgcodec") is None:
            return "nvImageCodec is not installed (pip install 'pipeprof[nvimgcodec]': nvidia-nvimgcodec-cu13)"
    return None


def decoder(name: str, device: torch.device) -> Decode:
    """``decode(list of CPU byte tensors) -> list of CHW uint8 RGB images on device``; raises
    :class:`BackendMissing` naming why the backend cannot run."""
    device = torch.device(device)
    why = missing(name, device)
    if why is not None:
        raise BackendMissing(f"augment.gpu_decoder: {name}: {why}")
    return {"nvjpeg": _torchvision, "torchcodec": _torchcodec, "nvimgcodec": _nvimgcodec}[name](device)


def _torchvision(device: torch.device) -> Decode:
    from torchvision.io import ImageReadMode, decode_jpeg

    def decode(encoded: list) -> list:
        with warnings.catch_warnings():  # its deprecation names TorchCodec, which is this axis's next backend
            warnings.simplefilter("ignore", DeprecationWarning)
            return decode_jpeg(list(encoded), mode=ImageReadMode.RGB, device=device)

    return decode


def _torchcodec(device: torch.device) -> Decode:
    from torchcodec.decoders import decode_jpeg

    def decode(encoded: list) -> list:
        return decode_jpeg(list(encoded), mode="RGB", device=device)

    return decode


def _nvimgcodec(device: torch.device) -> Decode:
    from nvidia import nvimgcodec

    hw = nvimgcodec.Decoder(
        device_id=device.index if device.index is not None else torch.cuda.current_device(),
        backends=[nvimgcodec.Backend(nvimgcodec.BackendKind.HW_GPU_ONLY)],
    )
    rgb = nvimgcodec.DecodeParams(  # as torchvision decodes: no EXIF rotation
        apply_exif_orientation=False,
        color_spec=nvimgcodec.ColorSpec.SRGB,
        sample_format=nvimgcodec.SampleFormat.I_RGB,
    )

    def decode(encoded: list) -> list:
        stream = torch.cuda.current_stream(device)
        streams = [nvimgcodec.CodeStream(e.numpy()) for e in encoded]
        images = hw.decode(streams, params=rgb, cuda_stream=stream.cuda_stream)
        failed = [i for i, img in enumerate(images) if img is None]
        if failed:  # the engines take baseline JPEGs only: a progressive or CMYK file is not theirs
            raise RuntimeError(
                f"nvImageCodec's hardware decoder could not decode {len(failed)} of {len(images)} images "
                f"(first at position {failed[0]}): the JPEG engines take baseline 4:2:0/4:2:2/4:4:4 files; "
                "use augment.gpu_decoder: nvjpeg for this dataset"
            )
        # HWC views of nvImageCodec's buffers (DLPack keeps each alive), as CHW like the other backends
        return [torch.from_dlpack(img).permute(2, 0, 1) for img in images]

    return decode
