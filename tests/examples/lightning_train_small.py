"""A Lightning script: a LightningDataModule whose train_dataloader builds the DataLoader, Trainer.fit on the CPU,
and its own clock's samples/s over the steps after warm-up (a callback)."""

import sys
import time

import lightning as L
import torch
from torch.utils.data import DataLoader, TensorDataset


class Data(L.LightningDataModule):
    def setup(self, stage=None):
        self.ds = TensorDataset(torch.randn(512, 32), torch.randint(0, 4, (512,)))

    def train_dataloader(self):
        return DataLoader(self.ds, batch_size=16, shuffle=True, num_workers=1)


class Model(L.LightningModule):
    def __init__(self):
        super().__init__()
        self.net = torch.nn.Sequential(*[torch.nn.Linear(32, 32) for _ in range(8)], torch.nn.Linear(32, 4))

    def training_step(self, batch, i):
        x, y = batch
        return torch.nn.functional.cross_entropy(self.net(x), y)

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.01)


class Clock(L.Callback):
    def on_train_batch_start(self, trainer, module, batch, i):
        if trainer.global_step == 5:
            self.t0, self.seen = time.perf_counter(), 0
        elif trainer.global_step > 5:
            self.seen += batch[0].shape[0]

    def on_train_end(self, trainer, module):
        print(f"own clock: {self.seen / (time.perf_counter() - self.t0):.2f} samples/s", flush=True)


if __name__ == "__main__":
    steps = int(sys.argv[1]) if len(sys.argv) > 1 else 60
    trainer = L.Trainer(
        max_steps=steps,
        accelerator="cpu",
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        callbacks=[Clock()],
    )
    trainer.fit(Model(), datamodule=Data())
