"""Benchmarks of pipeprof itself: commands that print figures, not timed tests.

``pipeprof bench sweep-speed``: the adaptive search against the exhaustive grid on the same
machine and dataset, run in alternation (A E, then E A, ...) so the machine's drift does not
favour one. Per run it prints the wall time to the full answer (preparation, CPU reference,
trials and analysis: what a user waits for), the trials run, the recommended num_workers, the
end-to-end rate measured there, the verdict there and the two overheads pipeprof measures on
itself (monitor, stage clocks) with their intervals; then per pair the time ratio and the rate
difference at the two recommendations.

``pipeprof bench repeat [CONFIG] --times N``: the same config N times back to back, as a user who
asks twice would. Per run: wall time, the num_workers range its re-drawn windows allow, the side and
resource, the rate at the recommendation and the answer's confidence; then whether the runs agree
(same side, same resource, overlapping num_workers ranges). An answer that changes when asked again
is a wrong answer: this is the check.

``pipeprof bench soak``: repeated small sweeps in one process, workers up to the core count, for
``--minutes``; after each sweep the process's RSS, its open file descriptors, /dev/shm in use and
the processes alive under it. Over a long soak these must stay flat: growth is a leak (memory,
descriptors, shared-memory segments of DataLoader batches, worker processes).

``pipeprof bench gpu-augment --preset P --batch N``: the GPU pipeline (``augment.device: cuda``) on one batch of
the synthetic dataset's JPEGs (ImageNet-like sizes), its per-sample forms against its batch forms, alternating
(per-sample then batched, batched then per-sample, ...) with one seed, so both draw the same parameters. Per
batch: decode and augment milliseconds between CUDA synchronisations (the first batches of each, warm-up, left
out), the augment call's own host time before its synchronisation (what launching costs the training
process), and images/s over decode + augment; per form, the median and range over the repeats.

``pipeprof bench watch-overhead SCRIPT``: in ``checks.watch_overhead``.
"""

from __future__ import annotations

import os
import shutil
import tempfile
import time
from pathlib import Path
from typing import Callable, Optional

import pandas as pd
import psutil

from pipeprof import config as cfgmod
from pipeprof.answer import Answer, Confidence
from pipeprof.data.sources.base import Source
from pipeprof.env import usable_cores
from pipeprof.orchestrate.runner import execute, prepare
from pipeprof.report.summary import group_answers, group_label
from pipeprof.schema import GPU_DECODERS, overlap_settings


def sweep_speed(
    config: Optional[str],
    overrides: list[str],
    repeats: int = 1,
    out_dir: str = "out/bench",
    log: Callable[[str], None] = print,
) -> pd.DataFrame:
    """One row per run: ``repeats`` pairs of (adaptive, exhaustive), the order alternating per pair."""
    base = [*overrides, f"out_dir={out_dir}"]
    if cfgmod.load(config, base).loader.num_workers is not None:
        raise cfgmod.ConfigError(
            "loader.num_workers must be unset for sweep-speed: the adaptive sweep searches "
            "it and the exhaustive one takes the machine's default grid"
        )
    prepare(cfgmod.load(config, base), log=lambda *a: None)  # the dataset is made once, outside the timing
    rows = []
    for i in range(repeats):
        for sweep in ("adaptive", "exhaustive") if i % 2 == 0 else ("exhaustive", "adaptive"):
            # pipeprof's own costs (monitor, stage clocks) are measured once, in the first run: per pair
            # they cost about a minute each and the benchmark outgrew a 10-minute call (docs/measured.md)
            checks = f"overhead_checks={str(not rows).lower()}"
            cfg = cfgmod.load(config, [*base, checks, f"sweep={sweep}", f"name=bench-{sweep}"])
            log(f"pair {i + 1}/{repeats}: {sweep} sweep")
            t0 = time.perf_counter()
            run = execute(cfg, log=lambda *a: None)
            rows += [_row(run, sweep, i, time.perf_counter() - t0, a) for a in group_answers(run)]
    return pd.DataFrame(rows)


def _row(run, sweep: str, pair: int, wall_s: float, answer: Answer) -> dict:
    """One run's answer for one group, read from its stored analysis (``num_workers``: the recommended count)."""
    a = run.meta["analysis"]
    monitor, clocks = a.get("monitor_overhead") or [], a.get("stage_timing_overhead") or []
    return {
        "pair": pair + 1,
        "sweep": sweep,
        "group": group_label(answer.key),
        "wall_s": wall_s,
        "trials": a["trials"],
        "num_workers": answer.workers,
        "samples_per_s": answer.samples_per_s,
        "verdict": answer.verdict,
        "run": str(run.path),
        **_cost("monitor", monitor),
        **_cost("clocks", clocks),
    }


def _cost(name: str, overheads: list[dict]) -> dict:
    """An overhead's cost and 95% interval (each a share of the rate), None where not measured; one is
    stored per preset, and the benchmark's run has one preset."""
    overhead = overheads[0] if overheads else {}
    return {
        f"{name}_cost": overhead.get("overhead_frac"),
        f"{name}_low": overhead.get("overhead_ci95_low"),
        f"{name}_high": overhead.get("overhead_ci95_high"),
    }


def pairs(df: pd.DataFrame) -> pd.DataFrame:
    """Per pair and group: exhaustive/adaptive wall time, the two recommendations and the rate
    difference at them (adaptive's rate at its pick relative to the exhaustive one's at its pick)."""
    out = []
    for (pair, group), g in df.groupby(["pair", "group"], sort=False):
        a, e = (g[g["sweep"] == s].iloc[0] if (g["sweep"] == s).any() else None for s in ("adaptive", "exhaustive"))
        if a is None or e is None:
            continue
        diff = a["samples_per_s"] / e["samples_per_s"] - 1 if a["samples_per_s"] and e["samples_per_s"] else None
        out.append(
            {
                "pair": pair,
                "group": group,
                "adaptive_s": a["wall_s"],
                "exhaustive_s": e["wall_s"],
                "time_ratio": e["wall_s"] / a["wall_s"],
                "adaptive_trials": a["trials"],
                "exhaustive_trials": e["trials"],
                "adaptive_workers": a["num_workers"],
                "exhaustive_workers": e["num_workers"],
                "rate_diff": diff,
                "adaptive_verdict": a["verdict"],
                "exhaustive_verdict": e["verdict"],
            }
        )
    return pd.DataFrame(out)


def render_sweep_speed(df: pd.DataFrame) -> str:
    """Markdown: the runs, then the pairs."""

    def pct(v, lo=None, hi=None) -> str:
        if v is None or v != v:
            return "–"
        return f"{v:+.1%}" + ("" if lo is None or lo != lo else f" ({lo:+.1%}…{hi:+.1%})")

    lines = [
        "| pair | sweep | group | wall s | trials | num_workers | samples/s | verdict | monitor cost | clock cost |",
        "|" + "---|" * 10,
    ]
    for r in df.itertuples():
        rate = "–" if r.samples_per_s is None or r.samples_per_s != r.samples_per_s else f"{r.samples_per_s:,.1f}"
        lines.append(
            f"| {r.pair} | {r.sweep} | {r.group} | {r.wall_s:.0f} | {r.trials} | {r.num_workers} | "
            f"{rate} | {r.verdict} | {pct(r.monitor_cost, r.monitor_low, r.monitor_high)} | "
            f"{pct(r.clocks_cost, r.clocks_low, r.clocks_high)} |"
        )
    p = pairs(df)
    lines += [
        "",
        "| pair | group | exhaustive / adaptive time | num_workers (adaptive, exhaustive) | "
        "rate at adaptive's pick vs exhaustive's | verdicts |",
        "|" + "---|" * 6,
    ]
    for r in p.itertuples():
        lines.append(
            f"| {r.pair} | {r.group} | {r.exhaustive_s:.0f} s / {r.adaptive_s:.0f} s = {r.time_ratio:.1f}x | "
            f"{r.adaptive_workers}, {r.exhaustive_workers} | {pct(r.rate_diff)} | "
            f"{r.adaptive_verdict}, {r.exhaustive_verdict} |"
        )
    return "\n".join(lines) + "\n"


# ---- repeat ----------------------------------------------------------------------------------------


def repeat(
    config: Optional[str],
    overrides: list[str],
    times: int = 3,
    out_dir: str = "out/bench",
    log: Callable[[str], None] = print,
) -> pd.DataFrame:
    """One row per run and group: the same config ``times`` times back to back (dataset made once, first)."""
    base = [*overrides, f"out_dir={out_dir}"]
    prepare(cfgmod.load(config, base), log=lambda *a: None)
    rows = []
    for i in range(times):
        log(f"run {i + 1}/{times}")
        t0, answered = time.perf_counter(), []
        run = execute(
            cfgmod.load(config, [*base, f"name=repeat-{i + 1}"]),
            log=lambda *a: None,
            on_answer=lambda _: answered.append(time.perf_counter()),  # noqa: B023 called inside this iteration
        )  # before any action trial
        got = [
            _answer_row(run, i + 1, time.perf_counter() - t0, a)
            | {"answer_s": (answered or [None])[0] and answered[0] - t0}
            for a in group_answers(run)
        ]
        for r in got:  # as it goes: a run cut short by a time limit still shows the runs before it
            log(
                f"run {i + 1}: {r['wall_s']:.0f} s (answer at {r['answer_s'] or 0:.0f} s), {r['trials']} trials, "
                f"num_workers {r['num_workers']} "
                f"({r['workers_low']}-{r['workers_high']}), {r['side']} side, {r['resource']}, "
                f"{r['samples_per_s']:,.1f} samples/s, confidence {r['answer_share']}"
            )
        rows += got
    return pd.DataFrame(rows)


def _answer_row(run, i: int, wall_s: float, a: Answer) -> dict:
    """One run's answer for one group (``num_workers``: the recommended count; ``workers_low``/``high``: the
    counts the pair trial allows (the one it set, or both where within the machine's drift), else the range its
    re-drawn windows allow, None where none were drawn)."""
    sure = a.confidence or Confidence()
    low, high = sure.workers_low, sure.workers_high
    if a.pair:  # the pick against its rival in alternation: the count it set, or both where within the drift
        low, high = (a.workers, a.workers) if a.pair["separated"] else sorted((a.pair["first"], a.pair["second"]))
    return {
        "run": i,
        "group": group_label(a.key),
        "wall_s": wall_s,
        "trials": run.meta["analysis"]["trials"],
        "num_workers": a.workers,
        "workers_low": low,
        "workers_high": high,
        "side": a.side,
        "resource": a.resource,
        "also": ", ".join(a.also or []),
        "samples_per_s": a.samples_per_s,
        "answer_share": sure.answer_share,
        "holds": sure.holds,
        "folder": str(run.path),
    }


def agreement(df: pd.DataFrame) -> list[dict]:
    """Per group: whether every run named the same side and resource, and whether their num_workers
    ranges (the pair trial's, else the re-drawn windows'; the pick itself where absent) share a count."""
    out = []
    for group, g in df.groupby("group", sort=False):
        low = g["workers_low"].fillna(g["num_workers"]).max()
        high = g["workers_high"].fillna(g["num_workers"]).min()
        out.append(
            {
                "group": group,
                "runs": len(g),
                "same_side": g["side"].nunique(dropna=False) == 1,
                "same_resource": g["resource"].nunique(dropna=False) == 1,
                "ranges_overlap": bool(low <= high),
                "common_workers": f"{int(low)}-{int(high)}" if low <= high else None,
                "wall_s_max": float(g["wall_s"].max()),
            }
        )
    return out


def render_repeat(df: pd.DataFrame) -> str:
    """Markdown: the runs, then per group whether they agree."""
    lines = [
        "| run | group | wall s (answer at) | trials | num_workers (range) | side | resource (also) | samples/s | "
        "confidence |",
        "|" + "---|" * 9,
    ]
    for r in df.itertuples():
        rng = (
            ""
            if r.workers_low is None or r.workers_low != r.workers_low
            else f" ({int(r.workers_low)}-{int(r.workers_high)})"
        )
        share = (
            "–"
            if r.answer_share is None or r.answer_share != r.answer_share
            else f"{r.answer_share:.0%}{'' if r.holds else ' (does not hold)'}"
        )
        also = f" (also {r.also})" if r.also else ""
        at = "" if r.answer_s is None or r.answer_s != r.answer_s else f" ({r.answer_s:.0f})"
        lines.append(
            f"| {r.run} | {r.group} | {r.wall_s:.0f}{at} | {r.trials} | {r.num_workers}{rng} | {r.side} "
            f"| {r.resource}{also} | {r.samples_per_s:,.1f} | {share} |"
        )
    for a in agreement(df):
        verdict = "agree" if a["same_side"] and a["same_resource"] and a["ranges_overlap"] else "DISAGREE"
        lines.append(
            f"\n{a['group']}: {a['runs']} runs {verdict}: side {'same' if a['same_side'] else 'differs'}, "
            f"resource {'same' if a['same_resource'] else 'differs'}, num_workers ranges "
            f"{'share ' + a['common_workers'] if a['ranges_overlap'] else 'do not overlap'}; "
            f"longest run {a['wall_s_max']:.0f} s"
        )
    return "\n".join(lines) + "\n"


# ---- soak ----------------------------------------------------------------------------------------


def leak_state() -> dict:
    """What would grow with a leak: RSS (MiB), open fds, /dev/shm in use (MiB), live processes."""
    me = psutil.Process()
    alive = [p for p in me.children(recursive=True) if p.status() != psutil.STATUS_ZOMBIE]
    shm = shutil.disk_usage("/dev/shm").used / 2**20 if os.path.isdir("/dev/shm") else float("nan")
    return {"rss_mb": me.memory_info().rss / 2**20, "fds": me.num_fds(), "shm_mb": shm, "procs": 1 + len(alive)}


def _soak_sweep(out: Path, workers: list[int]) -> float:
    """One small sweep (cpu_pipeline and end_to_end at every worker count); its wall seconds."""
    t0 = time.perf_counter()
    sets = [
        f"out_dir={out}/runs",
        f"data.cache_dir={out}/datasets",
        "data.images=64",
        "data.classes=4",
        f"loader.num_workers={workers}",
        "loader.batch_size=8",
        "augment.preset=light",
        "name=soak",
        "trials=[cpu_pipeline,end_to_end]",
        "model.name=mobilenet_v3_small",
        "measure.window_s=0.3",
        "measure.windows=2",
        "measure.max_windows=2",
        "measure.cpu_reference_s=0",
        "stage_timing=false",
    ]
    execute(cfgmod.load(None, sets), log=lambda *a, **k: None)
    return time.perf_counter() - t0


def soak(minutes: float, out: Optional[str], log: Callable[[str], None] = print) -> list[dict]:
    """Sweeps for ``minutes``; a :func:`leak_state` row (with its time and sweep seconds) after each."""
    folder = Path(out) if out else Path(tempfile.mkdtemp(prefix="pipeprof-soak-"))
    workers = cfgmod.default_workers(int(usable_cores()["usable"]))
    log(f"soak: sweeps over workers {workers} for {minutes:g} min in {folder}")
    log(f"{'t_s':>7} {'sweep':>5} {'sweep_s':>7} {'rss_mb':>8} {'fds':>5} {'shm_mb':>8} {'procs':>5}")
    t0, end, seen = time.monotonic(), time.monotonic() + minutes * 60, []
    while time.monotonic() < end:
        took = _soak_sweep(folder, workers)
        shutil.rmtree(folder / "runs", ignore_errors=True)  # the runs' files are not what is watched
        seen.append(leak_state() | {"t_s": time.monotonic() - t0, "sweep_s": took})
        now = seen[-1]
        log(
            f"{now['t_s']:7.0f} {len(seen):5d} {took:7.1f} {now['rss_mb']:8.1f} {now['fds']:5d} "
            f"{now['shm_mb']:8.1f} {now['procs']:5d}"
        )
    # from the end of the first sweep: it loads torch, the model and the dataset once, which is not a leak
    log(
        "change from the first sweep to the last: "
        + ", ".join(f"{k} {seen[-1][k] - seen[0][k]:+.1f}" for k in ("rss_mb", "fds", "shm_mb", "procs"))
        if len(seen) > 1
        else "fewer than two sweeps finished: give it more minutes"
    )
    if not out:
        shutil.rmtree(folder, ignore_errors=True)
    return seen


# ---- gpu-augment ----------------------------------------------------------------------------------


def _jpegs(count: int, distinct: int = 64) -> list:
    """``count`` JPEGs (uint8 byte tensors) of the synthetic dataset, ``distinct`` of them rendered and repeated."""
    from concurrent.futures import ThreadPoolExecutor

    import torch

    from pipeprof.data.synthetic import encode_image

    with ThreadPoolExecutor(max(1, min(16, int(usable_cores()["usable"])))) as pool:
        made = list(pool.map(lambda i: encode_image(0, i), range(min(count, distinct))))
    return [torch.frombuffer(bytearray(made[i % len(made)]), dtype=torch.uint8) for i in range(count)]


def _pipeline_batch(pipe, encoded: list, device) -> dict:
    """One batch through ``pipe``: decode and augment ms between synchronisations, and the augment call's host ms."""
    import torch

    sync = torch.cuda.synchronize if device.type == "cuda" else (lambda: None)
    sync()
    t0 = time.perf_counter()
    images = pipe.decode(encoded)
    sync()
    t1 = time.perf_counter()
    pipe.augment(images)
    t2 = time.perf_counter()
    sync()
    t3 = time.perf_counter()
    return {
        "decode_ms": (t1 - t0) * 1e3,
        "augment_ms": (t3 - t1) * 1e3,
        "augment_host_ms": (t2 - t1) * 1e3,
        "images_per_s": len(encoded) / (t3 - t0),
    }


def gpu_augment(
    preset: str = "standard",
    batch: int = 256,
    repeats: int = 10,
    warmup: int = 2,
    device: Optional[str] = None,
    size: int = 224,
    log: Callable[[str], None] = print,
    encoded: Optional[list] = None,
) -> pd.DataFrame:
    """One row per timed batch (form, repeat, the :func:`_pipeline_batch` figures): the preset's GPU pipeline with
    its per-sample forms and with its batch forms, alternating, ``warmup`` batches of each first and not kept;
    ``encoded``: the batch's JPEG bytes (default: ``batch`` of the bench's own)."""
    import torch

    from pipeprof.data.gpu_augment import for_preset

    dev = torch.device(device or ("cuda" if torch.cuda.is_available() else "cpu"))
    encoded = encoded if encoded is not None else _jpegs(batch)
    pipes = {
        form: for_preset(preset, size, dev, seed=0, batched=form == "batched") for form in ("per-sample", "batched")
    }
    log(
        f"gpu-augment: preset {preset} at {size}, batches of {batch} JPEGs ({min(batch, 64)} distinct, ImageNet-like "
        f"sizes) on {torch.cuda.get_device_name(dev) if dev.type == 'cuda' else 'the CPU'}; {warmup} warm-up batches "
        f"of each form, then {repeats} of each, alternating"
    )
    for pipe in pipes.values():
        for _ in range(warmup):
            _pipeline_batch(pipe, encoded, dev)
    rows = []
    for i in range(repeats):
        for form in ("per-sample", "batched") if i % 2 == 0 else ("batched", "per-sample"):
            rows.append({"form": form, "repeat": i + 1} | _pipeline_batch(pipes[form], encoded, dev))
    return pd.DataFrame(rows)


def render_gpu_augment(df: pd.DataFrame) -> str:
    """Markdown: per form the median (range) of each figure over the repeats, then the batch forms' speed-up."""
    cols = ["decode_ms", "augment_ms", "augment_host_ms", "images_per_s"]
    lines = ["| form | batches | decode ms | augment ms | augment host ms | images/s |", "|" + "---|" * 6]
    for form, g in df.groupby("form", sort=False):
        cells = [f"{g[c].median():,.1f} ({g[c].min():,.1f}–{g[c].max():,.1f})" for c in cols]
        lines.append(f"| {form} | {len(g)} | " + " | ".join(cells) + " |")
    med = df.groupby("form")[["augment_ms", "images_per_s"]].median()
    if {"per-sample", "batched"} <= set(med.index):
        lines += [
            "",
            "batched against per-sample (medians): augment ms "
            f"{med.loc['batched', 'augment_ms'] / med.loc['per-sample', 'augment_ms']:.2f}x, images/s over "
            f"decode + augment {med.loc['batched', 'images_per_s'] / med.loc['per-sample', 'images_per_s']:.2f}x",
        ]
    return "\n".join(lines) + "\n"


def ops_alone(preset: str, encoded: list, device, repeats: int = 10, warmup: int = 2, size: int = 224) -> pd.DataFrame:
    """One row per timed batch and step of the batched pipeline (decode, then each op in order): its device ms
    (between marks on the stream: CUDA events read after the batch's sync; the host clock on a CPU) and the host ms
    in its call. Each op alone, nothing beside it: where the pipeline's time goes before it meets the step."""
    from pipeprof.data.gpu_augment import for_preset
    from pipeprof.measure.step import DeviceClock

    pipe, clock = for_preset(preset, size, device, seed=0), DeviceClock(device)
    rows = []
    for i in range(warmup + repeats):
        marks: list = []

        def mark(name: str, marks: list = marks) -> None:
            marks.append((name, clock.mark(), time.perf_counter()))

        clock.sync()
        mark("start")
        images = pipe.decode(encoded)
        mark("decode")
        pipe.augment(images, after=mark)
        clock.sync()
        if i >= warmup:
            for (_, a, ha), (name, b, hb) in zip(marks, marks[1:]):
                rows.append({"repeat": i - warmup + 1, "step": name, "device_ms": clock.elapsed_ms(a, b)})
                rows[-1]["host_ms"] = (hb - ha) * 1e3
    return pd.DataFrame(rows)


def render_ops(df: pd.DataFrame) -> str:
    """Markdown: per step of the pipeline, in order, the median (range) device ms and the median host ms."""
    lines = ["| step | device ms | host ms in the call |", "|---|---|---|"]
    for name, g in df.groupby("step", sort=False):
        d = g["device_ms"]
        lines.append(f"| {name} | {d.median():,.2f} ({d.min():,.2f}–{d.max():,.2f}) | {g['host_ms'].median():,.2f} |")
    return "\n".join(lines) + "\n"


def resize_forms(encoded: list, device, repeats: int = 10, warmup: int = 2, size: int = 224) -> pd.DataFrame:
    """One row per timed call of RandomResizedCrop's resize on one decoded batch, its boxes drawn once: the Triton
    kernel (``data.gpu_kernels``, where it runs) and roi_align over the padded batch, alternating, each between
    marks on the stream (CUDA events read after a sync) with the host ms in its call; ``gap``: the largest
    difference between the two outputs in grey levels (float rounding: at most 1)."""
    import torch

    from pipeprof.data import gpu_kernels
    from pipeprof.data.gpu_augment import GpuPipeline, _sizes, _uniforms, resized_crops, rrc_boxes
    from pipeprof.measure.step import DeviceClock

    images = GpuPipeline([], device).decode(encoded)
    boxes = rrc_boxes(
        _sizes(images), (0.08, 1.0), (3 / 4, 4 / 3), _uniforms(torch.Generator().manual_seed(0), len(images), 22)
    )
    forms = {"roi_align": False} | ({"kernel": True} if gpu_kernels.usable(device) else {})
    clock, rows, outs = DeviceClock(device), [], {}
    for i in range(warmup + repeats):
        for form in forms if i % 2 == 0 else list(forms)[::-1]:
            clock.sync()
            m0, h0 = clock.mark(), time.perf_counter()
            outs[form] = resized_crops(images, boxes, [size, size], kernel=forms[form])
            m1, h1 = clock.mark(), time.perf_counter()
            clock.sync()
            if i >= warmup:
                rows.append({"form": form, "repeat": i - warmup + 1, "device_ms": clock.elapsed_ms(m0, m1)})
                rows[-1]["host_ms"] = (h1 - h0) * 1e3
    df = pd.DataFrame(rows)
    if len(outs) == 2:
        df["gap"] = int((outs["kernel"].int() - outs["roi_align"].int()).abs().max())
    return df


def render_resize(df: pd.DataFrame) -> str:
    """Markdown: per form of the resize the median (range) device ms and the median host ms, then their ratio."""
    lines = ["| RandomResizedCrop's resize | device ms | host ms in the call |", "|---|---|---|"]
    for form, g in df.groupby("form", sort=False):
        d = g["device_ms"]
        lines.append(f"| {form} | {d.median():,.2f} ({d.min():,.2f}–{d.max():,.2f}) | {g['host_ms'].median():,.2f} |")
    med = df.groupby("form")["device_ms"].median()
    if {"kernel", "roi_align"} <= set(med.index):
        lines += [
            "",
            f"the kernel takes {med['kernel'] / med['roi_align']:.2f}x roi_align's device time (medians); the largest "
            f"difference between their outputs: {int(df['gap'].iloc[0])} grey level(s)",
        ]
    return "\n".join(lines) + "\n"


# the reference figure (docs/measured.md, "The GPU pipeline"): nvJPEG's batched decode of these JPEGs on one H200
NVJPEG_ANCHOR_IMAGES_S = 16_022


def decoders_alone(
    encoded: list, device, repeats: int = 10, warmup: int = 2, log: Callable[[str], None] = print
) -> pd.DataFrame:
    """One row per timed batch of each decoder backend (``data.gpu_decode``) that runs here: decode ms between
    synchronisations and images/s; backends alternate, their warm-up batches are not kept. A backend that cannot
    run is one row with ``status`` 'skipped' and the reason."""
    import torch

    from pipeprof.data import gpu_decode

    sync = torch.cuda.synchronize if device.type == "cuda" else (lambda: None)
    ready, rows = {}, []
    for name in GPU_DECODERS:
        try:
            ready[name] = gpu_decode.decoder(name, device)
            for _ in range(warmup):
                ready[name](encoded)
        except Exception as exc:  # noqa: BLE001 - a backend's own failure is its row
            rows.append({"backend": name, "status": "skipped", "reason": str(exc)[:300]})
            ready.pop(name, None)
            log(f"decoder {name}: skipped: {str(exc)[:200]}")
    names = list(ready)
    for i in range(repeats):
        for name in names if i % 2 == 0 else names[::-1]:
            sync()
            t0 = time.perf_counter()
            ready[name](encoded)
            sync()
            dt = time.perf_counter() - t0
            rows.append({"backend": name, "status": "ok", "repeat": i + 1, "decode_ms": dt * 1e3})
    df = pd.DataFrame(rows)
    if "decode_ms" in df:
        df["images_per_s"] = len(encoded) / (df["decode_ms"] / 1e3)
    return df


class _HeldJpegs(Source):
    """The bench's JPEGs as a pipeprof Source held in memory (the gpu_shared trial reads its batch from one)."""

    kind = "memory"

    def __init__(self, encoded: list):
        self.data = [bytes(e.numpy()) for e in encoded]

    def __len__(self) -> int:
        return len(self.data)

    def read(self, index: int) -> bytes:
        return self.data[index]

    def label(self, index: int) -> int:
        return index % 10

    def nbytes(self, index: int) -> int:
        return len(self.data[index])


def beside_the_step(
    encoded: list,
    device,
    preset: str = "standard",
    model: str = "resnet50",
    precision: str = "bf16",
    size: int = 224,
    measure=None,
    models: Optional[dict] = None,
    log: Callable[[str], None] = print,
) -> pd.DataFrame:
    """The ``gpu_shared`` trial (``trials.kinds``) for each decoder backend, serial and overlapped: the step alone,
    the GPU pipeline alone and the two together, each with its rate, and the overlap achieved. One row per
    (backend, overlap); a backend that cannot run is its row's error."""

    from pipeprof import config as C
    from pipeprof.measure.monitors import Monitor
    from pipeprof.trials import TrialContext, TrialSpec, run_trial

    measure = measure or C.MeasureConfig(window_s=2.0, windows=4, max_windows=6, max_trial_s=60.0)
    source = _HeldJpegs(encoded)
    rows = []
    with Monitor(hz=10, gpu=device.type == "cuda") as mon:
        ctx = TrialContext(  # the step as a run sets it on a GPU (channels_last)
            device,
            source,
            measure,
            mon,
            num_classes=1000,
            sources={"held": source},
            models=models or {},
            channels_last=device.type == "cuda",
        )
        for name in GPU_DECODERS:
            # config augment.overlap's words; step-first (no faster than on, docs/measured.md) is left to a run's
            # config: with it the bench's time limit on the box cut the last backend's rows
            for mode in ("off", "on", "staged"):
                spec = TrialSpec(
                    "gpu_shared",
                    batch_size=len(encoded),
                    model=model,
                    precision=precision,
                    mode="train",
                    preset=preset,
                    image_size=size,
                    input_dtype="float32",
                    source="held",
                    augment_device="cuda",
                    **overlap_settings(mode),
                    gpu_decoder=name,
                )
                try:
                    row = run_trial(ctx, spec)
                    row |= {"status": "ok"}
                except Exception as exc:  # noqa: BLE001 - a backend that cannot run is its rows' reason
                    row = {"status": "skipped", "reason": str(exc)[:300]}
                rows.append({"backend": name, "overlap": mode} | row)
                log(
                    f"beside the step: {name}, overlap {mode}: "
                    + (
                        f"together {row['samples_per_s']:,.0f}, step alone {row['step_alone_samples_per_s']:,.0f}, "
                        f"pipeline alone {row['pipeline_alone_samples_per_s']:,.0f} samples/s"
                        if row["status"] == "ok"
                        else f"skipped: {row['reason'][:200]}"
                    )
                )
    return pd.DataFrame(rows)


def render_decoders(df: pd.DataFrame, device_name: str = "", anchor: float = NVJPEG_ANCHOR_IMAGES_S) -> str:
    """Markdown: per backend the median (range) decode ms and images/s, against the anchor where ``device_name`` is
    the anchor's GPU (an H200: on another the share would read its GPU against one it is not); skipped ones with
    why."""
    on_anchor = "H200" in device_name
    lines = [
        f"| decoder | batches | decode ms | images/s | vs the H200 anchor ({anchor:,.0f}: docs/measured.md)"
        + ("" if on_anchor else f", not set beside a {device_name or 'device'}")
        + " |",
        "|" + "---|" * 5,
    ]
    for name, g in df.groupby("backend", sort=False):
        ok = g[g["status"] == "ok"]
        if ok.empty:
            lines.append(f"| {name} | skipped | {g['reason'].iloc[0]} | | |")
            continue
        ms, rate = ok["decode_ms"], ok["images_per_s"]
        lines.append(
            f"| {name} | {len(ok)} | {ms.median():,.1f} ({ms.min():,.1f}–{ms.max():,.1f}) | "
            f"{rate.median():,.0f} ({rate.min():,.0f}–{rate.max():,.0f}) | "
            + (f"{rate.median() / anchor:.0%} |" if on_anchor else "– |")
        )
    return "\n".join(lines) + "\n"


def render_beside(df: pd.DataFrame) -> str:
    """Markdown: per backend and overlap the together rate with its interval, each alone, the serial model, the
    together rate as a share of the step alone, the overlap achieved and the device ms of decode and augment."""
    lines = [
        "| decoder | overlap | together samples/s (95% CI) | step alone | pipeline alone | serial model "
        "| of the step alone | overlap achieved | decode + augment ms |",
        "|" + "---|" * 9,
    ]
    for _, r in df.iterrows():
        if r.get("status") != "ok":
            lines.append(f"| {r['backend']} | {r['overlap']} | skipped: {str(r.get('reason'))[:160]} | | | | | | |")
            continue
        share, nan = r["samples_per_s"] / r["step_alone_samples_per_s"], float("nan")
        ov = r.get("gpu_overlap_frac")
        lines.append(
            f"| {r['backend']} | {r['overlap']} | {r['samples_per_s']:,.0f} ({r['samples_per_s_ci95_low']:,.0f}–"
            f"{r['samples_per_s_ci95_high']:,.0f}) | {r['step_alone_samples_per_s']:,.0f} | "
            f"{r['pipeline_alone_samples_per_s']:,.0f} | {r['serial_model_samples_per_s']:,.0f} | {share:.0%} | "
            f"{'' if ov is None or ov != ov else f'{ov:.0%}'} | "
            f"{r.get('device_decode_ms_mean', nan):.1f} + {r.get('device_augment_ms_mean', nan):.1f} |"
        )
    return "\n".join(lines) + "\n"
