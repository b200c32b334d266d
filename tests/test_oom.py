"""Out of memory: a trial that runs out is an `oom` row with its batch size and the memory held, and the sweep
goes on; `loader.batch_size: auto` finds the largest batch that fits (the search, on a known threshold and on a
real step), and on a CPU device is the CPU default, said in run.json."""
import json

import psutil
import pytest
import torch
from torch import nn

import pipeprof
from pipeprof import config as C
from pipeprof.orchestrate.batchsize import auto_batch_size, largest_batch, step_fits
from pipeprof.checks.calibrate import BurnDataset
from pipeprof.orchestrate.runner import prepare
from pipeprof.trials import TrialContext, TrialSpec
from pipeprof.trials.columns import is_oom


class FitsUpTo(nn.Module):
    """A model whose forward runs out of device memory for batches above ``most``, as a real one does past
    the size its activations fit in (the exception CUDA's allocator raises, raised by the model itself)."""

    def __init__(self, most: int):
        super().__init__()
        self.most = most
        self.fc = nn.Linear(3, 10)

    def forward(self, x):
        if x.shape[0] > self.most:
            raise torch.cuda.OutOfMemoryError(f"CUDA out of memory. Tried to allocate {x.shape[0] * 3} MiB")
        return self.fc(x.float().mean((2, 3)))


def test_an_oom_trial_is_a_row_with_its_batch_and_memory_and_the_sweep_goes_on(tmp_path):
    run = pipeprof.profile(BurnDataset(64, 0.0, side=8), model=FitsUpTo(40), batch_size=[64, 8], trials=["gpu_ceiling"],
                           device="cpu", threads=1, out_dir=str(tmp_path), log=lambda *a: None,
                           config={"model": {"num_classes": 10}},
                           measure={"warmup_s": 0.1, "window_s": 0.2, "windows": 2, "max_windows": 2,
                                    "cpu_reference_s": 0})
    rows = run.trials.set_index("batch_size")
    big, small = rows.loc[64], rows.loc[8]
    assert big["status"] == "oom" and big["error"].startswith("OutOfMemoryError: CUDA out of memory. Tried to "
                                                              "allocate 192 MiB")
    # the memory held then: this process's RSS on a CPU device (torch alone takes more than 100 MiB)
    assert 100 < big["oom_rss_mb"] < 2 * psutil.Process().memory_info().rss / 2 ** 20
    assert big["error"].endswith(f"(memory then: rss_mb {big['oom_rss_mb']:,.0f})")
    assert small["status"] == "ok" and small["samples_per_s"] > 0 and run.meta["status"] == "complete"
    assert run.meta["analysis"]["failed_trials"] == 1


def test_oom_is_told_from_other_failures_by_type_and_allocator_message():
    assert is_oom(torch.cuda.OutOfMemoryError("CUDA out of memory")) and is_oom(MemoryError())
    assert is_oom(RuntimeError("[enforce fail at alloc_cpu.cpp:117] DefaultCPUAllocator: can't allocate memory: "
                               "you tried to allocate 1099511627776 bytes"))
    assert not is_oom(RuntimeError("mat1 and mat2 shapes cannot be multiplied")) and not is_oom(OSError("full"))


@pytest.mark.parametrize("threshold, sizes", [
    (100, [32, 64, 128, 96, 112, 104, 100, 102, 101]),  # doubles to the first that fails, then bisects
    (20, [32, 16, 24, 20, 22, 21]),  # below the start: bisects from nothing
    (5000, [32, 64, 128, 256, 512, 1024, 2048, 4096]),  # everything fits: the most is the answer
    (0, [32, 16, 8, 4, 2, 1]),  # nothing fits
])
def test_the_search_finds_the_largest_batch_below_a_known_threshold(threshold, sizes):
    best, tried = largest_batch(lambda b: (b <= threshold, 2.0 * b))
    assert best == min(threshold, 4096) and [t["batch_size"] for t in tried] == sizes
    assert all(t["fits"] == (t["batch_size"] <= threshold) and t["peak_mb"] == 2.0 * t["batch_size"] for t in tried)


def test_the_search_on_a_real_step_picks_the_largest_batch_that_fits_and_records_each_size():
    ctx = TrialContext(torch.device("cpu"), None, C.MeasureConfig(), None, num_classes=10,
                       models={"user:FitsUpTo": lambda: FitsUpTo(40)})
    spec = TrialSpec("gpu_ceiling", model="user:FitsUpTo", precision="fp32", mode="train", image_size=8,
                     input_dtype="uint8")
    best, tried = largest_batch(step_fits(ctx, spec))
    assert best == 40 and [(t["batch_size"], t["fits"]) for t in tried] == [
        (32, True), (64, False), (48, False), (40, True), (44, False), (42, False), (41, False)]
    assert all(t["peak_mb"] > 100 for t in tried)  # RSS on a CPU device
    cfg = C.resolve(C.build({"device": "cpu", "model": {"name": "user:FitsUpTo", "num_classes": 10}}), False,
                    False, 2)
    chosen, record = auto_batch_size(ctx, cfg, lambda preset, size: ("uint8", 8), True, lambda text: None)
    assert chosen == 40 and record["chosen"] == 40 and record["searches"][0]["largest"] == 40
    assert [t["batch_size"] for t in record["searches"][0]["tried"]] == [32, 64, 48, 40, 44, 42, 41]


def test_auto_on_a_cpu_device_is_the_cpu_default_and_says_so(tmp_path):
    cfg = C.build({"device": "cpu", "loader": {"batch_size": "auto"}, "out_dir": str(tmp_path),
                   "trials": ["gpu_ceiling"]})
    plan = prepare(cfg, BurnDataset(64, 0.0, side=8), log=lambda *a: None)
    assert plan.cfg.loader.batch_size == [16] and {s.batch_size for s in plan.specs} == {16}
    search = plan.meta["batch_size_search"]
    assert search["policy"] == "auto" and search["chosen"] == 16 and "CPU device" in search["note"]
    json.dumps(plan.meta)  # run.json can hold it
