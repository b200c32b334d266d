"""A Hugging Face Trainer script: `HfArgumentParser` over `TrainingArguments` (so the loader's workers come from
`--dataloader_num_workers`, argparse underneath), a torch Dataset of image-like uint8 samples, a small conv net
that returns its loss, `trainer.train()` on the CPU (the Trainer builds the DataLoader itself and Accelerate
re-creates it), and its own clock's samples/s over its steady steps (a TrainerCallback).

    python tests/examples/hf_trainer_train_small.py --dataloader_num_workers 2
"""

import time

import torch
from torch.utils.data import Dataset
from transformers import HfArgumentParser, Trainer, TrainerCallback, TrainingArguments


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
        return {"pixel_values": img.float().div(255).sub(0.5), "labels": self.labels[i]}


class Net(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.net = torch.nn.Sequential(
            torch.nn.Conv2d(3, 64, 3, padding=1),
            torch.nn.ReLU(),
            torch.nn.MaxPool2d(2),
            torch.nn.Conv2d(64, 128, 3, padding=1),
            torch.nn.ReLU(),
            torch.nn.AdaptiveAvgPool2d(1),
            torch.nn.Flatten(),
            torch.nn.Linear(128, 10),
        )

    def forward(self, pixel_values, labels=None):
        logits = self.net(pixel_values)
        return {"loss": torch.nn.functional.cross_entropy(logits, labels), "logits": logits}


class Clock(TrainerCallback):
    """The script's own samples/s over its steady steps, the steps the watch's windows time: from batch ``warm``
    reaching the step (``on_step_begin``: the Trainer has the batch) to the last but one, a batch's samples the
    per-device batch (the dataset divides into whole batches). The Trainer's loader is Accelerate's
    DataLoaderShard, which fetches one batch ahead (batch k reaches the step as the loader hands over batch k+1):
    the workers' prefetch is one batch fewer here than the loader's, and the last batch reaches the step only
    after the loader has run out and shut its workers down, not a step."""

    def __init__(self, warm: int):
        self.warm, self.n, self.seen, self.t0, self.t = warm, 0, 0, None, None

    def on_step_begin(self, args, state, control, **kwargs):
        self.n += 1
        if self.n == self.warm:
            self.t0 = time.perf_counter()
        elif self.warm < self.n < state.max_steps:  # one epoch: a step a batch
            self.seen, self.t = self.seen + args.per_device_train_batch_size, time.perf_counter()

    def on_train_end(self, args, state, control, **kwargs):
        print(f"own clock: {self.seen / (self.t - self.t0):.2f} samples/s", flush=True)


parser = HfArgumentParser(TrainingArguments)
parser.set_defaults(
    output_dir="hf_trainer_out",
    use_cpu=True,
    num_train_epochs=1,
    per_device_train_batch_size=16,
    dataloader_num_workers=2,
    save_strategy="no",
    report_to="none",
    disable_tqdm=True,
)

if __name__ == "__main__":
    (args,) = parser.parse_args_into_dataclasses()
    torch.set_num_threads(1)  # the step on one core: on a 2-core machine the two workers share the other
    clock = Clock(warm=args.dataloader_num_workers * 2 + 1)  # the workers' prefetch (2 each) and 2 more, less 1
    trainer = Trainer(model=Net(), args=args, train_dataset=Images(768), callbacks=[clock])
    trainer.train()
