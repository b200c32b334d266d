"""What each CPU decoder costs on this run's own files: the basis of the decoder action's prediction.

The workers' stage clocks time only the configured decoder, so the other one's cost is not in the
sweep. Predicting it from a fixed factor ("a 2x faster decoder") was an assumption; instead both
decoders decode the same samples of the run's source here, in this one process, alternating sample by
sample so that the machine's drift falls on both alike. The prediction then scales the workers'
measured decode time by the ratio of the two (``analysis.advice``), and the action trial checks it.
"""
from __future__ import annotations

import time

from pipeprof.data.decode import DECODERS, DecodeError, get_decoder

#: What is timed, recorded in run.json beside the figures.
TIMED_REGION = ("each CPU decoder on the same samples of the run's first source, alternating sample by sample (the "
                "order swapped every sample) in the main process before the sweep (bytes read outside the clock); us per sample = summed "
                "perf_counter time / samples")


def decode_costs(source, samples: int = 24, decoders=DECODERS) -> dict | None:
    """``{"us_per_sample": {decoder: us}, "samples": n}`` over ``samples`` evenly spread samples of ``source``
    (None without a source or when none decodes); its timed region, :data:`TIMED_REGION`, is in run.json's
    ``timed_regions``."""
    if source is None or not len(source):
        return None
    source = getattr(source, "inner", source)  # an emulated slow link: its bytes are the same, its delay not timed
    step = max(len(source) // samples, 1)
    blobs = [b for i in range(0, len(source), step) if (b := _read(source, i)) is not None][:samples]
    if not blobs:
        return None
    fns = {name: get_decoder(name) for name in decoders}
    total, n = dict.fromkeys(fns, 0.0), 0
    for i, data in enumerate([blobs[0], *blobs]):  # the first pass untimed: libraries load code on first use
        order = list(fns) if i % 2 else list(fns)[::-1]  # A B, B A: neither decoder always finds the caches warm
        try:
            spent = {name: _timed(fns[name], data) for name in order}
        except DecodeError:  # a bad sample is the sweep's to report, not this probe's
            continue
        if i:
            total, n = {k: total[k] + spent[k] for k in total}, n + 1
    if not n:
        return None
    return {"us_per_sample": {k: v / n * 1e6 for k, v in total.items()}, "samples": n}


def _read(source, index: int) -> bytes | None:
    """Sample ``index``'s bytes, or None for one that cannot be read (a dangling link, a FIFO): a bad sample
    is the sweep's to report, not this probe's."""
    try:
        return source.read(index)
    except OSError:  # SourceError is one
        return None


def _timed(fn, data: bytes) -> float:
    t0 = time.perf_counter()
    fn(data)
    return time.perf_counter() - t0
