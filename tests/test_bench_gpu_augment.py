"""`pipeprof bench gpu-augment`: the GPU pipeline's per-sample and batch forms timed on one batch, alternating;
run here on CPU tensors with a tiny batch (the figures mean something on a GPU only)."""

import pandas as pd

from pipeprof.checks.bench import gpu_augment, render_gpu_augment


def test_both_forms_alternate_and_warm_up_is_left_out():
    seen = []
    df = gpu_augment("standard", batch=3, repeats=3, warmup=1, device="cpu", size=64, log=seen.append)
    assert list(df["form"]) == ["per-sample", "batched", "batched", "per-sample", "per-sample", "batched"]
    assert (df[["decode_ms", "augment_ms", "augment_host_ms", "images_per_s"]] > 0).all().all()
    assert "1 warm-up batches of each form, then 3 of each" in seen[0]


def test_the_table_gives_median_and_range_per_form_and_the_ratio():
    rows = [
        {
            "form": f,
            "repeat": i,
            "decode_ms": 10.0,
            "augment_ms": a * i,
            "augment_host_ms": 1.0,
            "images_per_s": 256 / (10 + a * i) * 1e3,
        }
        for i in (1, 2, 3)
        for f, a in (("per-sample", 80.0), ("batched", 4.0))
    ]
    text = render_gpu_augment(pd.DataFrame(rows))
    assert "| per-sample | 3 | 10.0 (10.0–10.0) | 160.0 (80.0–240.0) |" in text
    assert "| batched | 3 | 10.0 (10.0–10.0) | 8.0 (4.0–12.0) |" in text
    assert "augment ms 0.05x" in text


def test_the_decoders_are_set_against_the_h200_anchor_only_on_an_h200():
    from pipeprof.checks.bench import NVJPEG_ANCHOR_IMAGES_S, render_decoders

    rate = NVJPEG_ANCHOR_IMAGES_S / 2
    df = pd.DataFrame(
        [{"backend": "nvjpeg", "status": "ok", "decode_ms": 256 / rate * 1e3, "images_per_s": rate}] * 3
        + [{"backend": "nvimgcodec", "status": "skipped", "reason": "not installed"}]
    )
    on = render_decoders(df, "NVIDIA H200")
    assert "| 50% |" in on and "| nvimgcodec | skipped | not installed |" in on
    off = render_decoders(df, "NVIDIA A100-SXM4-80GB")
    assert "| – |" in off and "50%" not in off and "not set beside a NVIDIA A100" in off


def test_each_step_of_the_pipeline_is_timed_on_its_own_in_the_presets_order(tiny_dataset):
    """The per-op table: decode, then each op of the preset as the pipeline runs them, one row per timed batch and
    step; a step of known cost (an op made to sleep 30 ms) reads its cost, the others theirs."""
    import time

    import torch

    from pipeprof.checks.bench import ops_alone, render_ops
    from pipeprof.data import gpu_augment as G
    from pipeprof.data.augment import load_preset, stage_names
    from pipeprof.data.sources import source_class

    src = source_class("files")(tiny_dataset)
    encoded = [torch.frombuffer(bytearray(src.read(i)), dtype=torch.uint8) for i in range(4)]
    slow = G.TORCHVISION["HorizontalFlip"]

    def sleepy(p):
        op = slow(p)
        return op._replace(batch=lambda x, g: (time.sleep(0.03), op.batch(x, g))[1])

    G.TORCHVISION["HorizontalFlip"] = sleepy
    try:
        df = ops_alone("standard", encoded, torch.device("cpu"), repeats=2, warmup=1, size=64)
    finally:
        G.TORCHVISION["HorizontalFlip"] = slow
    steps = ["decode", *stage_names(load_preset("standard"))]
    assert list(df["step"]) == steps * 2 and list(df["repeat"]) == [1] * len(steps) + [2] * len(steps)
    flip = df[df["step"] == "HorizontalFlip"]
    assert (flip["device_ms"] >= 30).all() and (flip["host_ms"] >= 30).all()
    assert (df["device_ms"] >= 0).all()
    assert render_ops(df).splitlines()[2].startswith("| decode |")


def test_the_resize_forms_alternate_and_their_table_reads_the_ratio_and_the_gap(tiny_dataset):
    """On a CPU without Triton's interpreter only roi_align runs (one row a timed call); the table of two forms of
    known cost reads each form's median and range, the kernel's share of roi_align's time and the outputs' gap."""
    import torch

    from pipeprof.checks.bench import render_resize, resize_forms
    from pipeprof.data.sources import source_class

    src = source_class("files")(tiny_dataset)
    encoded = [torch.frombuffer(bytearray(src.read(i)), dtype=torch.uint8) for i in range(3)]
    df = resize_forms(encoded, torch.device("cpu"), repeats=3, warmup=1, size=32)
    assert list(df["form"]) == ["roi_align"] * 3 and list(df["repeat"]) == [1, 2, 3] and (df["device_ms"] > 0).all()
    rows = [
        {"form": f, "repeat": i, "device_ms": ms * i, "host_ms": 0.5, "gap": 1}
        for i in (1, 2, 3)
        for f, ms in (("roi_align", 6.0), ("kernel", 0.5))
    ]
    text = render_resize(pd.DataFrame(rows))
    assert "| roi_align | 12.00 (6.00–18.00) | 0.50 |" in text and "| kernel | 1.00 (0.50–1.50) | 0.50 |" in text
    assert "the kernel takes 0.08x roi_align's device time" in text and "outputs: 1 grey level(s)" in text
