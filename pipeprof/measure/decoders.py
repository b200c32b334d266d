"""What each CPU decoder costs on this run's own files: the basis of the decoder action's prediction.

The workers' stage clocks time only the configured decoder, so the other one's cost is not in the
sweep. Predicting it from a fixed factor ("a 2x faster decoder") was an assumption; instead both
decoders decode the same samples of the run's source here, and the prediction scales the workers'
measured decode time by the ratio of the two (``analysis.advice``); the action trial checks it.

A decode's cost depends on the process it runs in and on what runs beside it, not only on the bytes.
Pillow's buffers come from malloc and go back at each free, so how many page faults a decode pays
depends on the process's heap: one process that alternates the two decoders sample by sample pays
several times the page faults of a process running one decoder and then the preset's transforms, as a
DataLoader worker does, and Pillow's time per decode moves with its process. And a core's speed depends
on its neighbours': with the decoders in several processes at once, the two decoders do not slow alike.
Timed in one process, the probe overstated cv2's advantage over what the workers' own clocks read, and
the decoder action's gain with it (docs/measured.md). So each decoder is timed as the workers run it: in
processes forked from this one (as the DataLoader forks its workers), with the workers' thread policy,
each running one decoder and the preset after each decode (untimed), a few samples untimed and then
every sample timed; as many processes at once as there are usable cores, all of one decoder, in rounds
A B B A (the machine's drift falls on both decoders alike). So timed, the ratio has come within a
point of what the action trials' worker clocks read.
"""

from __future__ import annotations

import multiprocessing as mp
import os
import time
from typing import Callable, Optional

from pipeprof.data.decode import DECODERS, DecodeError, get_decoder

WARM = 8  # samples decoded (and transformed) untimed first in each process: its heap's first decodes
ROUNDS = 2  # rounds of each decoder (A B B A), each as many processes as usable cores

#: What is timed, recorded in run.json beside the figures.
TIMED_REGION = (
    "each CPU decoder on the same samples of the run's first source (bytes read outside the clock), in "
    "processes forked from the main process before the sweep: rounds A B B A of as many processes at "
    "once as usable cores, each round one decoder (the workers' thread policy; the first preset's "
    f"transforms after each decode, untimed), {WARM} samples untimed then every sample timed in each; "
    "us per sample = summed perf_counter time of the decode calls / decodes timed"
)


def decode_costs(
    source, samples: int = 24, decoders=DECODERS, transform: Optional[Callable] = None, cores: Optional[int] = None
) -> dict | None:
    """``{"us_per_sample": {decoder: us}, "samples": n, "processes": {decoder: count}}`` over
    ``samples`` evenly spread samples of ``source`` (None without a source or when none decodes);
    ``transform(image=...)``: what a worker does after decoding (the preset); ``cores``: the usable cores (how
    many processes of a decoder run at once; default: this process's CPUs). Its timed region,
    :data:`TIMED_REGION`, is in run.json's ``timed_regions``."""
    if source is None or not len(source):
        return None
    source = getattr(source, "inner", source)  # an emulated slow link: its bytes are the same, its delay not timed
    step = max(len(source) // samples, 1)
    blobs = [b for i in range(0, len(source), step) if (b := _read(source, i)) is not None][:samples]
    if not blobs:
        return None
    names = list(decoders)
    spent: dict[str, list] = {name: [] for name in names}
    width = max(1, cores or len(os.sched_getaffinity(0)))
    for r in range(ROUNDS):
        for name in names if r % 2 == 0 else names[::-1]:  # A B, B A: the drift falls on both alike
            spent[name] += [got for got in _side_by_side([name] * width, blobs, transform) if got is not None]
    if not all(spent.values()):
        return None
    us = {k: sum(s for s, _ in v) / sum(n for _, n in v) * 1e6 for k, v in spent.items()}
    return {"us_per_sample": us, "samples": len(blobs), "processes": {k: len(v) for k, v in spent.items()}}


def _side_by_side(names: list, blobs: list, transform) -> list:
    """(seconds, decodes) timed of each decoder in ``names``, each in a forked process, all at once; None for
    one that gave no figure. Where fork is not available, each distinct decoder once in this process: copies
    run one after the other would time the same thing again, not processes side by side."""
    if "fork" not in mp.get_all_start_methods():
        return [_timed_passes(name, blobs, transform, cap=False) for name in dict.fromkeys(names)]
    ctx = mp.get_context("fork")
    started = []
    for name in names:
        here, there = ctx.Pipe(duplex=False)
        proc = ctx.Process(target=_child, args=(name, blobs, transform, there), daemon=True)
        proc.start()
        there.close()
        started.append((proc, here))
    out = []
    for proc, here in started:
        try:
            out.append(here.recv() if here.poll(120) else None)
        except EOFError:  # the child died (a decoder that crashed its process): no figure
            out.append(None)
        proc.join(5)
        if proc.is_alive():
            proc.kill()
    return out


def _child(name: str, blobs: list, transform, conn) -> None:
    conn.send(_timed_passes(name, blobs, transform, cap=True))
    conn.close()


def _timed_passes(name: str, blobs: list, transform, cap: bool) -> Optional[tuple[float, int]]:
    if cap:
        from pipeprof.measure.confounders import cap_worker_threads

        cap_worker_threads()  # as in a worker: one thread
    fn, total, n = get_decoder(name), 0.0, 0
    for i, data in enumerate(blobs[:WARM] + blobs):
        t0 = time.perf_counter()
        try:
            image = fn(data)
        except DecodeError:  # a bad sample is the sweep's to report, not this probe's
            continue
        if i >= WARM:
            total, n = total + time.perf_counter() - t0, n + 1
        if transform is not None:
            transform(image=image)
    return (total, n) if n else None


def _read(source, index: int) -> bytes | None:
    """Sample ``index``'s bytes, or None for one that cannot be read (a dangling link, a FIFO): a bad sample
    is the sweep's to report, not this probe's."""
    try:
        return source.read(index)
    except OSError:  # SourceError is one
        return None
