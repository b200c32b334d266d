"""A standard ImageNet-style training script, written as users write one: what ``pipeprof watch`` is
checked on, on a GPU box. Not pipeprof's pipeline: torchvision's ImageFolder, RandomResizedCrop(224),
RandomHorizontalFlip, ToTensor, Normalize, a ResNet-50 trained with SGD under automatic mixed precision
(bf16 where the GPU has it, else fp16 with a grad scaler), channels_last, cudnn.benchmark.

    python3 tests/examples/imagenet_train.py --data DIR --workers 8 --steps 300

``--steps`` stops after that many optimiser steps (epochs repeat until then); it prints the loss every
50 steps, as training scripts do, and nothing about its speed unless ``--clock`` asks it to time itself
(its rate and its share of time waiting for a batch, after 20 warm-up steps: the figure a user would
set beside pipeprof's). ``--uint8`` and ``--gpu-decode`` are the changes ``pipeprof watch --tune``
proposes for this script, written as its snippets say (applied by hand, to check the predicted gain).
"""

import argparse
import time

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
    p.add_argument("--clock", action="store_true", help="print samples/s and the data wait after 20 warm-up steps")
    p.add_argument("--uint8", action="store_true", help="uint8 batches, converted and normalised on the device")
    p.add_argument("--gpu-decode", action="store_true", help="workers read bytes; decode and augment on the GPU")
    return p.parse_args()


def loader_and_prep(args, normalize, device):
    """The dataset, its DataLoader and the batch's preparation on the device, as each option writes them."""
    crop = [transforms.RandomResizedCrop(224), transforms.RandomHorizontalFlip()]
    tail = [transforms.PILToTensor()] if args.uint8 else [transforms.ToTensor(), normalize]
    train_set = datasets.ImageFolder(args.data, transforms.Compose(crop + tail))
    kwargs = dict(batch_size=args.batch_size, shuffle=True, num_workers=args.workers, pin_memory=True, drop_last=True)
    kwargs["persistent_workers"] = args.workers > 0
    prep = lambda images: images.to(device, non_blocking=True)  # noqa: E731
    if args.uint8:
        mean = torch.tensor(normalize.mean, device=device).view(1, -1, 1, 1) * 255
        std = torch.tensor(normalize.std, device=device).view(1, -1, 1, 1) * 255
        prep = lambda images: images.to(device, non_blocking=True).float().sub_(mean).div_(std)  # noqa: E731
    if args.gpu_decode:
        from pipeprof.data.user_gpu_pipeline import gpu_pipeline

        variant = gpu_pipeline(
            datasets.ImageFolder(args.data, transforms.Compose(crop + [transforms.ToTensor(), normalize]))
        )
        return (
            train_set,
            DataLoader(variant.dataset, collate_fn=variant.collate, **kwargs),
            (lambda encoded: variant.on_device(encoded, device)),
        )
    return train_set, DataLoader(train_set, **kwargs), prep


def main():
    args = arguments()
    device = "cuda" if torch.cuda.is_available() else "cpu"
    torch.backends.cudnn.benchmark = True
    normalize = transforms.Normalize(mean=[0.485, 0.456, 0.406], std=[0.229, 0.224, 0.225])
    train_set, train_loader, prep = loader_and_prep(args, normalize, device)
    model = torchvision.models.resnet50(num_classes=len(train_set.classes))
    model = model.to(device, memory_format=torch.channels_last)
    optimizer = torch.optim.SGD(model.parameters(), lr=args.lr, momentum=0.9, weight_decay=1e-4)
    dtype = torch.bfloat16 if device == "cpu" or torch.cuda.is_bf16_supported() else torch.float16
    scaler = torch.amp.GradScaler(device, enabled=dtype == torch.float16)
    step, waited, t_wait = 0, 0.0, time.perf_counter()
    while step < args.steps:
        model.train()
        for images, labels in train_loader:
            if step >= 20:
                waited += time.perf_counter() - t_wait
            if step == 20:
                t0, waited = time.perf_counter(), 0.0
            images = prep(images).contiguous(memory_format=torch.channels_last)
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
            t_wait = time.perf_counter()  # the wait is the host's time in next(), as a script clocks it
    if args.clock and step > 20:
        if device == "cuda":
            torch.cuda.synchronize()
        wall = time.perf_counter() - t0
        rate = (step - 20) * args.batch_size / wall
        print(f"clock: {rate:.1f} samples/s over {step - 20} steps, data wait {waited / wall:.1%}", flush=True)


if __name__ == "__main__":
    main()
