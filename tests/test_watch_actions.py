"""``pipeprof watch --tune`` tries changes to the user's own pipeline: a real ImageFolder training script, run as a
real process, whose transform ends in ToTensor + a Normalize of known cost, so the uint8 action's gain is known
from its costs before it is measured.

The script's own transform burns AUGMENT_S of CPU per sample (a step of the user's with no GPU counterpart), and
its Normalize (a subclass of torchvision's) NORM_S more. Handing over uint8 images and normalising in the training
process takes NORM_S and the float conversion out of the workers: per sample the workers spend about
AUGMENT_S + NORM_S + o instead of AUGMENT_S + o', o the decode, crop and collate of a 32 px image (well under
OVERHEAD_S here), so the loader alone gains NORM_S / (AUGMENT_S + o) - 1 + 1, between NORM_S / (AUGMENT_S +
OVERHEAD_S) and NORM_S / AUGMENT_S.
"""

from __future__ import annotations

import sys

import pytest

from conftest import measured_once, watch_job, watch_run_folder

AUGMENT_S, NORM_S, OVERHEAD_S = 0.004, 0.004, 0.003

SCRIPT = f"""
import sys
import time

import torch
from torch import nn
from torch.utils.data import DataLoader
from torchvision import datasets, transforms

from pipeprof.checks.calibrate import FixedStepModel


def burn(seconds):
    end = time.thread_time() + seconds
    while time.thread_time() < end:
        pass


class Augment:  # the user's own step: {AUGMENT_S} s of CPU, no GPU counterpart
    def __call__(self, img):
        burn({AUGMENT_S})
        return img


class CostlyNormalize(transforms.Normalize):  # torchvision's Normalize and {NORM_S} s of CPU
    def forward(self, tensor):
        burn({NORM_S})
        return super().forward(tensor)


torch.set_num_threads(1)
tail = [transforms.ToTensor(), CostlyNormalize([0.485, 0.456, 0.406], [0.229, 0.224, 0.225])]
train_set = datasets.ImageFolder(sys.argv[1], transforms.Compose([Augment(), transforms.CenterCrop(32)] + tail))
loader = DataLoader(train_set, batch_size=8, shuffle=True, num_workers=1, persistent_workers=True)
model = FixedStepModel(step_s=0.002, num_classes=2)
for epoch in range(10000):
    for images, labels in loader:
        nn.functional.cross_entropy(model(images), labels).backward()
"""


@pytest.fixture(scope="module")
def tuned_actions(tmp_path_factory):
    def make(tmp):
        from pipeprof.data.synthetic import make_dataset

        make_dataset(tmp / "ds", images=96, classes=2, seed=4, workers=1)
        (tmp / "train.py").write_text(SCRIPT)
        args = ["--seconds", "4", "--tune", "--tune-max-s", "30", "--stop", "--window-s", "0.3"]
        watch_job(tmp, args, [sys.executable, "train.py", str(tmp / "ds")])
        return watch_run_folder(tmp), (tmp / "watch.log").read_text()

    return measured_once("tuned_actions", make, tmp_path_factory)


def _actions(run) -> dict:
    return {a["id"]: a for a in run.meta["tune"]["actions"]}


@pytest.mark.alone
@pytest.mark.slow
def test_the_uint8_action_gains_what_its_known_costs_give(tuned_actions):
    run, log = tuned_actions
    u8 = _actions(run)["uint8"]
    assert u8.get("measured"), (u8, log)
    low, high = NORM_S / (AUGMENT_S + OVERHEAD_S), NORM_S / AUGMENT_S
    assert low - 0.15 <= u8["action_gain_frac"] <= high + 0.15, (u8["action_gain_frac"], low, high)
    assert u8["verified"] and u8["action_gain_ci95_low"] > 0
    # the step is tiny: the loop would run at the loader's rate, so the end-to-end gain is the loader's
    assert abs(u8["predicted_e2e_gain_frac"] - u8["action_gain_frac"]) < 0.05
    assert run.meta["tune"]["best_action"] == "uint8"
    assert "drop the float conversion and Normalize" in u8["snippet"] and "[0.485, 0.456, 0.406]" in u8["snippet"]
    assert "best measured change: hand over uint8 images" in log


def test_what_the_pause_could_not_try_is_named_with_why(tuned_actions):
    run, log = tuned_actions
    acts = _actions(run)
    # no CUDA here, and the user's own transform has no GPU counterpart: the first reason found is the transform
    assert acts["gpu_pipeline"]["why_not"].startswith("transform `Augment` has no GPU counterpart")
    assert "storage and decoding are its own" in acts["memory"]["why_not"]
    assert "persistent_workers" not in acts  # the loader's own setting already: not a change
    tune = run.meta["tune"]
    # the hand-off was measured in the pause at the count the actions ran at, and the cores answer rests on it
    handoff = run.trials[run.trials["kind"] == "handoff"]
    assert len(handoff) == 1 and handoff.iloc[0]["num_workers"] == tune["actions_at_workers"]
    assert tune["cores_needed"]["handoff_limit"] == pytest.approx(handoff.iloc[0]["samples_per_s_ci95_high"])
    assert tune["paused_s"] < 30 + 25  # the budget, and at most one side past it (its cap) with its start
