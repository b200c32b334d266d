"""Everything that silently changes a measurement, controlled in one place.

Thread pools inside DataLoader workers (OpenCV's, torch's intra-op pool) would
oversubscribe the cores N workers already use, so each worker is capped to one
thread; albumentations phones home for updates at import in every process unless
told not to; and unseeded augmentations make two runs do different work. A worker
that sets these differently from the next run is a confounder, so they live here.
"""
from __future__ import annotations

import os
import random

import numpy as np
import torch

#: Recorded in run.json so a reader knows what the workers were allowed to do.
WORKER_POLICY = {
    "cv2_threads": 0,
    "torch_threads": 1,
    "seed": "base_seed + worker_id (numpy, random, torch, albumentations)",
    "NO_ALBUMENTATIONS_UPDATE": "1",
}


def quiet_albumentations() -> None:
    """Stop albumentations' update check; must run before it is first imported."""
    os.environ.setdefault("NO_ALBUMENTATIONS_UPDATE", "1")


def cap_worker_threads() -> None:
    """One thread per worker: parallelism comes from the number of workers."""
    import cv2

    cv2.setNumThreads(0)
    torch.set_num_threads(1)


def seed_worker(seed: int) -> None:
    """Seed every random source a worker's pipeline may draw from."""
    random.seed(seed)
    np.random.seed(seed % 2**32)
    torch.manual_seed(seed)
