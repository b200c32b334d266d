"""A training script whose data is already decoded: uint8 images held in memory (as after a
preprocessing pass saved them with numpy), a random crop and flip in the Dataset, the batch
normalised on the GPU, a ResNet-50 trained under automatic mixed precision. Its loader is cheap, so
the step binds: the case where anything added to each ``next(loader)`` (pipeprof watch's hook) would
show most. Written as users write one; it prints the loss every 50 steps and nothing about its speed.

    python3 tests/examples/tensor_train.py --workers 4 --steps 300
"""

import argparse

import torch
import torchvision
from torch import nn
from torch.utils.data import DataLoader, Dataset


class InMemoryImages(Dataset):
    """``n`` uint8 images of 3x256x256 in one tensor; a random 224 crop and a flip per sample."""

    def __init__(self, n: int, classes: int, seed: int = 0):
        g = torch.Generator().manual_seed(seed)
        self.images = torch.randint(0, 256, (n, 3, 256, 256), dtype=torch.uint8, generator=g)
        self.labels = torch.randint(0, classes, (n,), generator=g)

    def __len__(self):
        return len(self.images)

    def __getitem__(self, i):
        top, left = torch.randint(0, 33, (2,)).tolist()
        img = self.images[i, :, top : top + 224, left : left + 224]
        return (img.flip(-1) if torch.rand(()) < 0.5 else img).contiguous(), self.labels[i]


def arguments():
    p = argparse.ArgumentParser(description="ResNet-50 on in-memory uint8 images, mixed precision")
    p.add_argument("--images", type=int, default=2048)
    p.add_argument("--workers", type=int, default=4, help="DataLoader num_workers")
    p.add_argument("--batch-size", type=int, default=256)
    p.add_argument("--steps", type=int, default=300, help="stop after this many steps")
    return p.parse_args()


def main():
    args = arguments()
    device = "cuda" if torch.cuda.is_available() else "cpu"
    torch.backends.cudnn.benchmark = True
    train_set = InMemoryImages(args.images, 1000)
    train_loader = DataLoader(
        train_set,
        batch_size=args.batch_size,
        shuffle=True,
        num_workers=args.workers,
        pin_memory=device == "cuda",
        drop_last=True,
        persistent_workers=args.workers > 0,
    )
    mean = torch.tensor([0.485, 0.456, 0.406], device=device).view(1, 3, 1, 1) * 255
    std = torch.tensor([0.229, 0.224, 0.225], device=device).view(1, 3, 1, 1) * 255
    model = torchvision.models.resnet50().to(device, memory_format=torch.channels_last)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9, weight_decay=1e-4)
    dtype = torch.bfloat16 if device == "cpu" or torch.cuda.is_bf16_supported() else torch.float16
    scaler = torch.amp.GradScaler(device, enabled=dtype == torch.float16)
    step = 0
    while step < args.steps:
        for images, labels in train_loader:
            images = images.to(device, non_blocking=True).float().sub_(mean).div_(std)
            images = images.contiguous(memory_format=torch.channels_last)
            with torch.autocast(device_type=device, dtype=dtype):
                loss = nn.functional.cross_entropy(model(images), labels.to(device, non_blocking=True))
            optimizer.zero_grad(set_to_none=True)
            scaler.scale(loss).backward()
            scaler.step(optimizer)
            scaler.update()
            step += 1
            if step % 50 == 0:
                print(f"step {step} loss {loss.item():.3f}", flush=True)
            if step >= args.steps:
                break


if __name__ == "__main__":
    main()
