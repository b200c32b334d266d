"""The machine's own CPU speed, measured with fixed work at the start and end of a run.

A CPU-bound trial can only be as repeatable as the cores under it. On shared or
virtual machines they are not: the same fixed work, a minute apart or on two
cores at the same moment, can run tens of percent apart (docs/measured.md). A
profiler that compares two runs without knowing that would blame the pipeline for
the machine.

So each run decodes one fixed JPEG (pipeprof's own synthetic image, so the work
resembles the pipeline's) in 1 process and in one process per usable core, for a
set time, before the first trial and after the last. The change between the two
is the drift of the machine during the run; the spread across processes shows
cores of unequal speed. Two runs whose CPU-bound rates differ by no more than
the machine moved cannot tell a change in the pipeline from a change in the
machine. (It is a snapshot of a few seconds, and pipeline rates have repeated
closely while the reference read far apart, so it bounds the doubt; it does not
correct the rates.)
"""

from __future__ import annotations

import io
import multiprocessing as mp
import time

from PIL import Image

from pipeprof.data.synthetic import encode_image

#: What is timed, recorded in run.json beside the figures.
TIMED_REGION = (
    "Pillow decode (open + convert RGB + load) of one fixed synthetic JPEG (seed 0, image 3), "
    "repeated for a set time in each of N forked processes released together; "
    "rate = decodes / elapsed per process, summed"
)


def _decode_for(data: bytes, seconds: float, start, results) -> None:
    start.wait()
    n, t0 = 0, time.perf_counter()
    while True:
        Image.open(io.BytesIO(data)).convert("RGB").load()
        n += 1
        elapsed = time.perf_counter() - t0
        if elapsed >= seconds:
            break
    results.put(n / elapsed)


def decode_rate(processes: int, seconds: float = 1.0, data: bytes | None = None) -> dict:
    """Decodes/s of ``processes`` processes decoding the same JPEG at once for ``seconds``."""
    if processes < 1 or seconds <= 0:
        raise ValueError(f"processes must be >= 1 and seconds > 0, got {processes}, {seconds}")
    data = data or encode_image(0, 3)
    ctx = mp.get_context("fork")  # no re-import per process: start-up stays outside the timed part
    start, results = ctx.Event(), ctx.Queue()
    procs = [
        ctx.Process(target=_decode_for, args=(data, seconds, start, results), daemon=True) for _ in range(processes)
    ]
    for p in procs:
        p.start()
    start.set()
    rates = sorted(results.get(timeout=seconds + 60) for _ in procs)
    for p in procs:
        p.join()
    return {
        "processes": processes,
        "decodes_per_s": sum(rates),
        "per_process_mean": sum(rates) / processes,
        "per_process_min": rates[0],
        "per_process_max": rates[-1],
    }


def measure(cores: int, seconds: float = 1.0, rounds: int = 3) -> dict:
    """One core and all ``cores``, alternated for ``rounds`` rounds of ``seconds / rounds`` each.

    Each point is the median over its rounds, with the range: on a VM the rate of a
    short probe moves between back-to-back rounds (docs/measured.md), so one round
    would report that as drift.
    """
    if rounds < 1:
        raise ValueError(f"rounds must be >= 1, got {rounds}")
    data = encode_image(0, 3)
    counts = [1] + ([cores] if cores > 1 else [])
    each = seconds / rounds
    samples: dict[int, list] = {k: [] for k in counts}
    for _ in range(rounds):  # alternate, so a slow spell of the machine hits both points alike
        for k in counts:
            samples[k].append(decode_rate(k, each, data))
    points = []
    for runs in samples.values():
        runs = sorted(runs, key=lambda r: r["decodes_per_s"])
        mid = runs[len(runs) // 2]
        points.append(
            mid
            | {
                "rounds": len(runs),
                "decodes_per_s_min": runs[0]["decodes_per_s"],
                "decodes_per_s_max": runs[-1]["decodes_per_s"],
            }
        )
    return {"time_unix_s": time.time(), "points": points}


def drift(start: dict, end: dict) -> dict:
    """Relative change end vs start of each point (same process counts), and the largest in size."""
    changes = {
        p["processes"]: q["decodes_per_s"] / p["decodes_per_s"] - 1
        for p, q in zip(start["points"], end["points"])
        if p["processes"] == q["processes"]
    }
    worst = max(changes.values(), key=abs) if changes else None
    return {"by_processes": changes, "largest_frac": worst}
