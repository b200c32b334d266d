"""An Accelerate script: the user's own DataLoader (its workers from `--workers`), `accelerator.prepare(model, opt,
loader)` (which re-creates the loader inside accelerate as a DataLoaderShard over the same dataset), a small
conv net on the CPU over image-like uint8 samples, and its own clock's samples/s over its steady steps.

    python tests/examples/accelerate_train_small.py --workers 2
"""

import argparse
import time

import torch
from accelerate import Accelerator
from torch.utils.data import DataLoader, Dataset


class Images(Dataset):
    """``n`` uint8 3x48x48 images held in memory; a random 40 crop, a flip and the conversion to float a sample."""

    def __init__(self, n: int, seed: int = 0):
        g = torch.Generator().manual_seed(seed)
        self.images = torch.randint(0, 256, (n, 3, 48, 48), dtype=torch.uint8, generator=g)
        self.labels = torch.randint(0, 10, (n,), generator=g)

    def __len__(self):
        return len(self.images)

    def __getitem__(self, i):
        top, left = torch.randint(0, 9, (2,)).tolist()
        img = self.images[i, :, top : top + 40, left : left + 40]
        img = img.flip(-1) if torch.rand(()) < 0.5 else img
        return img.float().div(255).sub(0.5), self.labels[i]


class Clock:
    """The script's own samples/s over its steady steps, the steps the watch's windows time: from batch ``warm``
    reaching the loop to batch ``last`` reaching it, the samples of the batches after ``warm``. Accelerate's
    DataLoaderShard fetches one batch ahead (batch k reaches the loop as the loader hands over batch k+1), so the
    workers' prefetch is one batch fewer here than the loader's, and the last batch reaches the loop only after
    the loader has run out and shut its workers down: not a step."""

    def __init__(self, warm: int, last: int):
        self.warm, self.last, self.n, self.seen, self.t0, self.t = warm, last, 0, 0, None, None

    def batch(self, samples: int) -> None:
        self.n += 1
        if self.n == self.warm:
            self.t0 = time.perf_counter()
        elif self.warm < self.n <= self.last:
            self.seen, self.t = self.seen + samples, time.perf_counter()

    def rate(self) -> float:
        return self.seen / (self.t - self.t0)


parser = argparse.ArgumentParser()
parser.add_argument("--workers", type=int, default=2, help="DataLoader num_workers")
parser.add_argument("--batch-size", type=int, default=16)
parser.add_argument("--images", type=int, default=640)

if __name__ == "__main__":
    args = parser.parse_args()
    torch.set_num_threads(1)  # the step on one core: on a 2-core machine the two workers share the other
    accelerator = Accelerator(cpu=True)
    model = torch.nn.Sequential(
        torch.nn.Conv2d(3, 64, 3, padding=1),
        torch.nn.ReLU(),
        torch.nn.MaxPool2d(2),
        torch.nn.Conv2d(64, 128, 3, padding=1),
        torch.nn.ReLU(),
        torch.nn.AdaptiveAvgPool2d(1),
        torch.nn.Flatten(),
        torch.nn.Linear(128, 10),
    )
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    loader = DataLoader(Images(args.images), batch_size=args.batch_size, shuffle=True, num_workers=args.workers)
    model, opt, loader = accelerator.prepare(model, opt, loader)
    # the workers' prefetch depth (prefetch_factor 2) and 2 more, one fewer for the batch the shard holds
    clock = Clock(warm=args.workers * 2 + 1, last=len(loader) - 1)
    for images, labels in loader:
        clock.batch(images.shape[0])
        loss = torch.nn.functional.cross_entropy(model(images), labels)
        opt.zero_grad()
        accelerator.backward(loss)
        opt.step()
    print(f"own clock: {clock.rate():.2f} samples/s", flush=True)
