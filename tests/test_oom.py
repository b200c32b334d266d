"""Out of memory: a trial that runs out is an `oom` row with its batch size and the memory held, and the sweep
goes on; `loader.batch_size: auto` finds the largest batch that fits (the search, on a known threshold and on a
real step), and on a CPU device is the CPU default, said in run.json."""

import gc
import json

import psutil
import pytest
import torch
from torch import nn

import pipeprof
from pipeprof import config as C
from pipeprof.checks.calibrate import BurnDataset
from pipeprof.measure.monitors import Monitor
from pipeprof.orchestrate.batchsize import HEADROOM, MOST, auto_batch_size, confirm, largest_batch, step_fits
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
        self.frozen: list[int] = []  # objects set aside from the collector at each forward (gc.get_freeze_count)

    def forward(self, x):
        self.frozen.append(gc.get_freeze_count())
        if x.shape[0] > self.most:
            raise torch.cuda.OutOfMemoryError(f"CUDA out of memory. Tried to allocate {x.shape[0] * 3} MiB")
        return self.fc(x.float().mean((2, 3)))


def test_an_oom_trial_is_a_row_with_its_batch_and_memory_and_the_sweep_goes_on(tmp_path):
    run = pipeprof.profile(
        BurnDataset(64, 0.0, side=8),
        model=FitsUpTo(40),
        batch_size=[64, 8],
        trials=["gpu_ceiling"],
        device="cpu",
        threads=1,
        out_dir=str(tmp_path),
        log=lambda *a: None,
        config={"model": {"num_classes": 10}},
        measure={"warmup_s": 0.1, "window_s": 0.2, "windows": 2, "max_windows": 2, "cpu_reference_s": 0, "redraws": 10},
    )
    rows = run.trials.set_index("batch_size")
    big, small = rows.loc[64], rows.loc[8]
    assert big["status"] == "oom" and big["error"].startswith(
        "OutOfMemoryError: CUDA out of memory. Tried to allocate 192 MiB"
    )
    # the memory held then: this process's RSS on a CPU device (torch alone takes more than 100 MiB)
    assert 100 < big["oom_rss_mb"] < 2 * psutil.Process().memory_info().rss / 2**20
    assert big["error"].endswith(f"(memory then: rss_mb {big['oom_rss_mb']:,.0f})")
    assert small["status"] == "ok" and small["samples_per_s"] > 0 and run.meta["status"] == "complete"
    assert run.meta["analysis"]["failed_trials"] == 1


def test_oom_is_told_from_other_failures_by_type_and_allocator_message():
    assert is_oom(torch.cuda.OutOfMemoryError("CUDA out of memory")) and is_oom(MemoryError())
    assert is_oom(
        RuntimeError(
            "[enforce fail at alloc_cpu.cpp:117] DefaultCPUAllocator: can't allocate memory: "
            "you tried to allocate 1099511627776 bytes"
        )
    )
    assert not is_oom(RuntimeError("mat1 and mat2 shapes cannot be multiplied")) and not is_oom(OSError("full"))


@pytest.mark.parametrize(
    "threshold, sizes, best",
    [
        (100, [32, 64, 128, 96, 112, 104], 96),  # doubles to the first that fails, then bisects to an eighth
        (20, [32, 16, 24], 16),  # below the start: halves, then one step of 8
        (5000, [32, 64, 128, 256, 512, 1024, 2048, 4096], 4096),  # everything fits: the most is the answer
        (0, [32, 16, 8, 4, 2, 1], 0),  # nothing fits
    ],
)
def test_the_search_finds_the_largest_multiple_of_8_within_an_eighth_below_a_known_threshold(threshold, sizes, best):
    found, tried = largest_batch(lambda b: (b <= threshold, 2.0 * b))  # no budget: only running out counts
    assert found == best and [t["batch_size"] for t in tried] == sizes
    assert all(t["fits"] == (t["batch_size"] <= threshold) and t["peak_mb"] == 2.0 * t["batch_size"] for t in tried)
    assert all(t["why"] == (None if t["fits"] else "out of memory") for t in tried)


H200_MIB = 143_771  # the lent H200's memory, where a search to one sample ran out of memory in the trial after it


def device_of(fixed_mb: float, per_sample_mb: float, curve: float = 0.0):
    """``fits(batch)`` of a device of H200_MIB whose step at ``batch`` holds fixed + per sample × batch
    (+ curve × batch²) MiB at its peak, and runs out of memory past the device's size."""

    def fits(batch: int):
        peak = fixed_mb + per_sample_mb * batch + curve * batch**2
        return (True, peak) if peak <= H200_MIB else (False, None)

    return fits, lambda b: fixed_mb + per_sample_mb * b + curve * b**2


def test_with_a_known_memory_model_the_search_leaves_headroom_and_takes_four_sizes():
    fits, peak = device_of(2_000, 42)  # resnet50 bf16-like: 3,375 would fill the device
    budget = HEADROOM * H200_MIB
    found, tried = largest_batch(fits, budget_mb=budget)
    # 32 and 64 give the line; its edge (3,033) rounded down to 8 fits; an eighth more does not
    assert [(t["batch_size"], t["fits"]) for t in tried] == [(32, True), (64, True), (3032, True), (3408, False)]
    assert found == 3032 and peak(3032) <= budget < peak(3032 + 8) and tried[-1]["why"] == "out of memory"


@pytest.mark.parametrize(
    "fixed, per, curve", [(2_000, 42, 0), (6_000, 95, 0), (2_000, 30, 0.004), (1_000, 1, 0), (40_000, 500, 0.01)]
)
def test_every_answer_is_a_multiple_of_8_under_the_headroom_within_an_eighth(fixed, per, curve):
    fits, peak = device_of(fixed, per, curve)
    budget = HEADROOM * H200_MIB
    found, tried = largest_batch(fits, budget_mb=budget)
    failed = [t["batch_size"] for t in tried if not t["fits"]]
    assert found % 8 == 0 and peak(found) <= budget and len(tried) <= 9
    assert found == MOST or min(failed) - found <= max(8, found // 8)  # an eighth: no finer
    over = [t for t in tried if not t["fits"] and t["peak_mb"] is not None]  # ran, but above the headroom
    assert all(t["why"].startswith(f"peak {t['peak_mb']:,.0f} MiB above the headroom's") for t in over)


def test_the_search_on_a_real_step_picks_the_largest_batch_that_fits_and_records_each_size():
    models = []  # each try's model, built by the step

    def build():
        models.append(FitsUpTo(40))
        return models[-1]

    ctx = TrialContext(
        torch.device("cpu"), None, C.MeasureConfig(), None, num_classes=10, models={"user:FitsUpTo": build}
    )
    spec = TrialSpec(
        "gpu_ceiling", model="user:FitsUpTo", precision="fp32", mode="train", image_size=8, input_dtype="uint8"
    )
    before = gc.get_freeze_count()
    best, tried = largest_batch(step_fits(ctx, spec))
    assert best == 40 and [(t["batch_size"], t["fits"]) for t in tried] == [
        (32, True),
        (64, False),
        (48, False),
        (40, True),
    ]
    assert all(t["peak_mb"] > 100 for t in tried)  # RSS on a CPU device
    # each try ran with the heap set aside, so its release walked only what the try made (a full collection took
    # 0.45 s a try in a test worker here), and the heap was given back after
    assert len(models) == 4 and all(f > 0 for m in models for f in m.frozen) and gc.get_freeze_count() == before
    cfg = C.resolve(C.build({"device": "cpu", "model": {"name": "user:FitsUpTo", "num_classes": 10}}), False, False, 2)
    lines: list = []
    chosen, record = auto_batch_size(ctx, cfg, lambda preset, size: ("uint8", 8), True, lines.append)
    assert chosen == 40 and record["chosen"] == 40 and record["searches"][0]["largest"] == 40
    assert [t["batch_size"] for t in record["searches"][0]["tried"]] == [32, 64, 48, 40]
    assert lines[0].startswith("loader.batch_size auto: user:FitsUpTo fp32 train on cpu: 40 (4 sizes tried in ")
    assert lines[0].endswith("32, 64 ✗, 48 ✗, 40)")


def test_a_batch_the_trial_that_uses_it_cannot_hold_falls_back_an_eighth_saying_so():
    measure = C.MeasureConfig(
        warmup_s=0.1, window_s=0.2, window_batches=2, windows=2, max_windows=2, max_trial_s=20, cpu_reference_s=0
    )
    cfg = C.resolve(C.build({"device": "cpu", "model": {"name": "user:FitsUpTo", "num_classes": 10}}), False, False, 2)
    lines: list = []
    with Monitor(hz=10, gpu=False) as monitor:
        ctx = TrialContext(
            torch.device("cpu"),
            None,
            measure,
            monitor,
            num_classes=10,
            step_threads=1,
            models={"user:FitsUpTo": lambda: FitsUpTo(40)},
        )
        batch, attempts = confirm(ctx, cfg, lambda preset, size: ("uint8", 8), True, 48, lines.append)
    assert batch == 40 and [(a["batch_size"], a["status"]) for a in attempts] == [(48, "oom"), (40, "ok")]
    assert attempts[1]["samples_per_s"] > 0 and "CUDA out of memory" in attempts[0]["error"]
    assert lines == [
        "loader.batch_size auto: 48 ran out of memory in the trial that uses it "
        "(gpu_ceiling/user:FitsUpTo/fp32/uint8/bs48); falling back to 40"
    ]
    # a model that fits no size near the choice: after FALLBACKS steps down the run stops, naming the field
    with Monitor(hz=10, gpu=False) as monitor:
        ctx = TrialContext(
            torch.device("cpu"),
            None,
            measure,
            monitor,
            num_classes=10,
            step_threads=1,
            models={"user:FitsUpTo": lambda: FitsUpTo(8)},
        )
        with pytest.raises(C.ConfigError, match=r"auto: 24 still ran out of memory .* after 3 step\(s\) down from 48"):
            confirm(ctx, cfg, lambda preset, size: ("uint8", 8), True, 48, lambda s: None)


def test_auto_on_a_cpu_device_is_the_cpu_default_and_says_so(tmp_path):
    cfg = C.build(
        {"device": "cpu", "loader": {"batch_size": "auto"}, "out_dir": str(tmp_path), "trials": ["gpu_ceiling"]}
    )
    plan = prepare(cfg, BurnDataset(64, 0.0, side=8), log=lambda *a: None)
    assert plan.cfg.loader.batch_size == [16] and {s.batch_size for s in plan.specs} == {16}
    search = plan.meta["batch_size_search"]
    assert search["policy"] == "auto" and search["chosen"] == 16 and "CPU device" in search["note"]
    json.dumps(plan.meta)  # run.json can hold it


def test_memory_growing_faster_than_the_line_is_searched_in_eighths_not_creeping():
    # vgg16 fp32-like: past 400 samples the convolutions take a workspace that grows with the batch, so the
    # line through the last two sizes puts the edge just above the one that fits (the H200 search crept
    # 504, 512, 576, 680, 696, 776); each step up from a size that fits is at least an eighth of it
    def fits(batch):
        peak = 3_000 + 60 * batch + (150 * (batch - 400) if batch > 400 else 0)
        return (True, peak) if peak <= H200_MIB else (False, None)

    found, tried = largest_batch(fits, budget_mb=HEADROOM * H200_MIB)
    ok = [t["batch_size"] for t in tried if t["fits"]]
    assert [t["batch_size"] for t in tried] == [32, 64, 2104, 1080, 568, 824, 920]  # was ... 824, 880, 984
    assert found == 824 and all(b - a >= a // 8 // 8 * 8 for a, b in zip(ok[2:], ok[3:]))  # eighths, by construction
