"""Workers that only read bytes (``augment.device: cuda``): the training process decodes and augments.

Sample ``i`` is the file's encoded bytes as a 1-D uint8 tensor (what ``torchvision.io.decode_jpeg``
takes), its label and its read's CPU seconds; :func:`collate_encoded` packs a batch's bytes into one
flat tensor with each sample's length (JPEGs differ in length), and :func:`unpacked` splits it into the
list of views that ``decode_jpeg`` decodes in one call on the step's device (``gpu_augment``). One
tensor, not a list of 256: a DataLoader worker hands every tensor of a batch over through a
shared-memory segment and a file descriptor of its own, and the pin-memory thread pins each: with a
list, handing a batch over cost more than decoding and augmenting it on the GPU (docs/measured.md).
"""

from __future__ import annotations

import time
from typing import NamedTuple, Optional

import numpy as np
import torch
from torch.utils.data import Dataset

from .dataset import SamplePolicy, _bad, _no_stand_in, _stand_ins
from .sources import Source


class EncodedSample(NamedTuple):
    data: torch.Tensor  # the encoded bytes, uint8, 1-D
    label: int
    stage_s: np.ndarray  # [read]
    notes: Optional[dict] = None  # {"bad": [(where, reason)], "large": None} when stand-ins were taken


class EncodedDataset(Dataset):
    """Sample ``i`` -> :class:`EncodedSample`; an unreadable sample is replaced as in ``PipelineDataset``
    (a JPEG that cannot be decoded is found only when the batch is decoded, in the training process)."""

    stage_names = ["read"]

    def __init__(self, source: Source, stage_timing=True, policy: SamplePolicy = SamplePolicy()):
        self.source, self.stage_timing, self.policy = source, stage_timing, policy

    def __len__(self) -> int:
        return len(self.source)

    def __getitem__(self, index: int) -> EncodedSample:
        bad = []
        for i in _stand_ins(index, len(self)):
            c0 = time.thread_time()  # CPU time, as PipelineDataset's read: a wait on storage costs no CPU
            try:
                data = self.source.read(i)
            except OSError as exc:
                bad.append(_bad(self.source, i, exc, self.policy))
                continue
            read_s = time.thread_time() - c0 if self.stage_timing else 0.0
            # bytearray: frombuffer over immutable bytes would share memory torch may not write
            tensor = torch.frombuffer(bytearray(data), dtype=torch.uint8)
            return EncodedSample(
                tensor, self.source.label(i), np.array([read_s]), {"bad": bad, "large": None} if bad else None
            )
        raise _no_stand_in(bad)


def collate_encoded(samples: list[EncodedSample]) -> dict:
    """``{"encoded": flat uint8 tensor, "lengths", "label", "stage_s": [read, collate], "bad_samples",
    "large_images"}``: the samples' bytes end to end, ``lengths`` each one's byte count."""
    t0 = time.perf_counter()
    labels = torch.as_tensor([s.label for s in samples], dtype=torch.long)
    stage = np.sum([s.stage_s for s in samples], axis=0)
    notes = [s.notes for s in samples if s.notes]
    return packed([s.data for s in samples]) | {
        "label": labels,
        "stage_s": torch.as_tensor(np.append(stage, time.perf_counter() - t0), dtype=torch.float64),
        "bad_samples": [b for n in notes for b in n["bad"]],
        "large_images": [],
    }


def packed(datas: list[torch.Tensor]) -> dict:
    """``{"encoded": the byte tensors end to end, "lengths": each one's byte count}``: one tensor a batch."""
    return {"encoded": torch.cat(datas), "lengths": torch.as_tensor([len(d) for d in datas], dtype=torch.long)}


def unpacked(batch: dict) -> list[torch.Tensor]:
    """The batch's samples' bytes as a list of 1-D views into its flat tensor (no copy)."""
    return list(torch.split(batch["encoded"], batch["lengths"].tolist()))
