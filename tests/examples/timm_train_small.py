"""A short script on timm train.py's data path: argparse `-j/--workers`, `create_dataset` over an image folder,
`create_loader` with timm's own transforms, a small model, and its own clock's samples/s over its steps."""

import argparse
import time

import timm
import torch
from timm.data import create_dataset, create_loader

parser = argparse.ArgumentParser()
parser.add_argument("data_dir")
parser.add_argument("-j", "--workers", type=int, default=1)
parser.add_argument("-b", "--batch-size", type=int, default=8)
parser.add_argument("--steps", type=int, default=30)

if __name__ == "__main__":
    args = parser.parse_args()
    dataset = create_dataset("", root=args.data_dir, split="train", is_training=True)
    loader = create_loader(
        dataset,
        input_size=(3, 64, 64),
        batch_size=args.batch_size,
        is_training=True,
        use_prefetcher=False,
        num_workers=args.workers,
    )
    model = timm.create_model("resnet18", num_classes=2)
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    step, t0, seen = 0, None, 0
    while step < args.steps:
        for images, labels in loader:
            loss = torch.nn.functional.cross_entropy(model(images), labels)
            opt.zero_grad()
            loss.backward()
            opt.step()
            step += 1
            if step == 5:  # the script's own clock starts after warm-up
                t0, seen = time.perf_counter(), 0
            elif t0 is not None:
                seen += images.shape[0]
            if step >= args.steps:
                break
    print(f"own clock: {seen / (time.perf_counter() - t0):.2f} samples/s", flush=True)
