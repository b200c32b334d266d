"""A standard ImageNet-style training script, written as users write one: what ``pipeprof watch`` is
checked on, on a GPU box. Not pipeprof's pipeline: torchvision's ImageFolder, RandomResizedCrop(224),
RandomHorizontalFlip, ToTensor, Normalize, a ResNet-50 trained with SGD under automatic mixed precision
(bf16 where the GPU has it, else fp16 with a grad scaler), channels_last, cudnn.benchmark.

    python3 tests/examples/imagenet_train.py --data DIR --workers 8 --steps 300

``--steps`` stops after that many optimiser steps (epochs repeat until then); it prints the loss every
50 steps, as training scripts do, and nothing about its speed.
"""

import argparse

import torch
import torchvision
from torch import nn
from torch.utils.data import DataLoader
from torchvision import datasets, transforms


def arguments():
    p = argparse.ArgumentParser(description="ResNet-50 on an ImageFolder tree, mixed precision")
    p.add_argument("--data", required=True, help="ImageFolder root (class folders of JPEGs)")
    p.add_argument("--workers", type=int, default=4, help="DataLoader num_workers")
    p.add_argument("--batch-size", type=int, default=256)
    p.add_argument("--steps", type=int, default=300, help="stop after this many steps")
    p.add_argument("--lr", type=float, default=0.1)
    return p.parse_args()


def main():
    args = arguments()
    device = "cuda" if torch.cuda.is_available() else "cpu"
    torch.backends.cudnn.benchmark = True
    normalize = transforms.Normalize(mean=[0.485, 0.456, 0.406], std=[0.229, 0.224, 0.225])
    train_set = datasets.ImageFolder(
        args.data,
        transforms.Compose(
            [transforms.RandomResizedCrop(224), transforms.RandomHorizontalFlip(), transforms.ToTensor(), normalize]
        ),
    )
    train_loader = DataLoader(
        train_set,
        batch_size=args.batch_size,
        shuffle=True,
        num_workers=args.workers,
        pin_memory=True,
        drop_last=True,
        persistent_workers=args.workers > 0,
    )
    model = torchvision.models.resnet50(num_classes=len(train_set.classes))
    model = model.to(device, memory_format=torch.channels_last)
    optimizer = torch.optim.SGD(model.parameters(), lr=args.lr, momentum=0.9, weight_decay=1e-4)
    dtype = torch.bfloat16 if device == "cpu" or torch.cuda.is_bf16_supported() else torch.float16
    scaler = torch.amp.GradScaler(device, enabled=dtype == torch.float16)
    step = 0
    while step < args.steps:
        model.train()
        for images, labels in train_loader:
            images = images.to(device, non_blocking=True, memory_format=torch.channels_last)
            labels = labels.to(device, non_blocking=True)
            with torch.autocast(device_type=device, dtype=dtype):
                loss = nn.functional.cross_entropy(model(images), labels)
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
