"""The training process's share of the pipeline when ``augment.device`` is cuda: each batch of bytes is
decoded (``augment.gpu_decoder``: ``data.gpu_decode``) and augmented on the step's device, and timed there.

Two ways to place it beside the step (``augment.overlap``):

* **serial** (:class:`Serial`, overlap off): the training thread decodes and augments each batch on the step's
  stream right before its step. The decode calls return only when done, so the step of batch k and the
  pipeline of batch k+1 never run at once: a batch costs the step plus the pipeline's own device time.
* **overlapped** (:class:`Overlapped`, overlap on, the default): a producer thread takes batches from the
  loader and decodes and augments them on a stream of its own, ``ahead`` batches ahead; the training thread's
  stream waits on each batch's ready event and the batch's memory is kept for it (``record_stream``). A second
  stream alone does not overlap (the decode calls block the thread that issues them: the issue's probe); a
  thread does, because nvJPEG and the v2 ops release the GIL.
* **step-first** (overlapped, ``step_first``): the same, with the training thread's step on a stream of the
  device's high priority (:func:`step_stream`). CUDA's block scheduler then dispatches the step's pending
  blocks before the pipeline's, so the pipeline runs in what the step leaves of the SMs instead of slowing it;
  whether that is faster end to end (the pipeline may then fall behind) is what the setting measures.
* **staged** (overlapped, ``staged``): the producer split in two threads, each on a stream of its own: one takes the
  bytes and decodes, the other augments what the first decoded. A decode call blocks its thread until done, and
  beside the step it spans several times its time alone (its small per-image kernels wait for the SMs the step
  holds): one producer then spent more host time a batch on decode + augment than the step took (docs/measured.md,
  "The GPU pipeline beside the step: where its time goes"), so it could not keep ahead. Staged, a batch's cycle is
  the longer of the two stages, not their sum; the augment still draws its randomness batch by batch in the loader's
  order (one thread), so the batches are the serial ones.

Device clock marks (CUDA events on a GPU, read after the window's sync) bracket the decode and the
augmentation on the stream that runs them; the host's own time in the call is kept too, since nvJPEG does
part of its work (the Huffman decoding of some backends) on the calling thread. With the step's marks on its
own stream they give the overlap achieved (:func:`overlap_ms`): the pipeline's device time that ran while the
step's did.

A stand-in for the step (``stand_in_s``) keeps the device busy for the step's own time before each batch,
as the step does end to end, and the marks bracket the pipeline's own device time, not the host's (serially,
a decoder that writes from a stream of its own first waits for the stand-in: :func:`gpu_decode.settle`, outside
the host's clock). Without it (the pipeline alone) the
device waits for the host inside the marks, and its time alone overstates what it adds end to end
(docs/measured.md, "The GPU pipeline").
"""

from __future__ import annotations

import queue
import threading
import time
from contextlib import nullcontext
from typing import NamedTuple, Optional

import numpy as np
import torch

from pipeprof.data import gpu_decode
from pipeprof.data.encoded import unpacked
from pipeprof.data.gpu_augment import for_preset
from pipeprof.measure.step import DeviceClock
from pipeprof.schema import DEFAULT_GPU_DECODER

AHEAD = 2  # batches the producer prepares ahead of the step: one in the step's hands, one more to absorb jitter
_STEP_STREAMS: dict = {}  # device index -> the high-priority stream steps run on (step-first), one per process
_ON_STEP_STREAM = threading.local()  # this thread's open step-first feeds ("depth") and its stream before them


def step_stream(device: torch.device) -> "torch.cuda.Stream":
    """The stream a step-first trial's step runs on: the device's high priority (a lower number is a higher
    priority; the default stream's 0 is the lowest). One per device and process: the caching allocator keeps a
    stream's freed blocks for that stream, so a stream a trial would leave behind would hold its memory."""
    if device.index not in _STEP_STREAMS:
        _STEP_STREAMS[device.index] = torch.cuda.Stream(device, priority=-1)
    return _STEP_STREAMS[device.index]


class DeviceSide:
    """``side(batch, measuring) -> batch`` with ``"image"`` decoded and augmented on ``device`` (serially, on
    the current stream); :meth:`prepare` is the same work without the bookkeeping, for a producer thread."""

    def __init__(
        self,
        preset: str,
        size: Optional[int],
        device: torch.device,
        seed: int = 0,
        stand_in_s: float = 0.0,
        decoder: str = DEFAULT_GPU_DECODER,
    ):
        self.pipe = for_preset(preset, size, device, seed)
        self.decoder = decoder
        self.decode = gpu_decode.decoder(decoder, device)  # refuses a backend that cannot run here, with why
        self.clock = DeviceClock(device)
        self.marks: list[tuple] = []
        self.host_s: list[float] = []
        self.stand_in = StandIn(device, stand_in_s) if stand_in_s > 0 else None
        from pipeprof.data import gpu_kernels  # Triton's import: only where a GPU pipeline is built

        self.kernels_before = gpu_kernels.launches()  # the row names the kernels this side's trial launched

    def prepare(self, batch: dict) -> tuple[dict, tuple, float]:
        """(the batch with its images on the device, the three marks around decode and augment, host seconds)."""
        images, (m0, m1), decode_s = self.decode_part(batch)
        out, (_, m2), augment_s = self.augment_part(images, start=m1)
        return {**batch, "image": out}, (m0, m1, m2), decode_s + augment_s

    def decode_part(self, batch: dict) -> tuple:
        """(the batch's images decoded on the device, the marks around the decode, host seconds in it)."""
        gpu_decode.settle(self.pipe.device)  # no decoder waits for the stream's queued work itself (see there)
        t0 = time.perf_counter()  # after the wait: the host's own time in the decode call
        m0 = self.clock.mark()
        images = self.decode(unpacked(batch))
        return images, (m0, self.clock.mark()), time.perf_counter() - t0

    def augment_part(self, images, start=None) -> tuple:
        """(the images augmented, the marks around the augment, host seconds in it); ``start``: a mark already
        recorded where the augment begins on this stream (the decode's end, serially)."""
        t0 = time.perf_counter()
        m1 = self.clock.mark() if start is None else start
        out = self.pipe.augment(images)
        return out, (m1, self.clock.mark()), time.perf_counter() - t0

    def __call__(self, batch: dict, measuring: bool) -> dict:
        if self.stand_in is not None:
            self.stand_in()  # queued ahead of the marks: the pipeline's own device time stays inside them
        out, marks, host_s = self.prepare(batch)
        self.keep(marks, host_s, measuring)
        return out

    def keep(self, marks: tuple, host_s: float, measuring: bool) -> None:
        if measuring:
            self.marks.append(marks)
            self.host_s.append(host_s)

    def sync(self) -> None:
        self.clock.sync()

    def columns(self, measured_s: float) -> dict:
        """Per batch: device ms in decode and in augment, host ms in the call; the device's share of the
        measured time (``device_pipeline_frac``). Read after the last window's sync."""
        from pipeprof.data import gpu_kernels

        named = {"gpu_decoder": self.decoder, "gpu_kernels": gpu_kernels.launched(self.kernels_before)}
        if not self.marks:
            return named
        spans = [stages(m) for m in self.marks]
        decode = np.array([self.clock.elapsed_ms(a, b) for (a, b), _ in spans])
        augment = np.array([self.clock.elapsed_ms(c, d) for _, (c, d) in spans])
        return (
            named
            | {
                "device_decode_ms_mean": float(decode.mean()),
                "device_augment_ms_mean": float(augment.mean()),
                "device_pipeline_host_ms_mean": float(np.mean(self.host_s) * 1e3),
                "device_pipeline_frac": float((decode.sum() + augment.sum()) / 1e3 / measured_s)
                if measured_s > 0
                else None,
            }
            | (self.stand_in.columns() if self.stand_in is not None else {})
        )


def stages(marks: tuple) -> tuple:
    """((decode start, decode end), (augment start, augment end)) of a batch's marks: three where one stream ran
    both (the augment starts where the decode ended), four where each stage had its own (``staged``)."""
    return ((marks[0], marks[1]), (marks[1], marks[2])) if len(marks) == 3 else ((marks[0], marks[1]), marks[2:4])


class Fed(NamedTuple):
    batch: dict
    wait_s: float  # how long the training thread waited for it on the loader (its data wait)


class Plain:
    """The CPU pipeline's batches: the loader's, as they come (nothing for the training process to do)."""

    side = None
    held = 0  # batches taken from the loader ahead of the step (a producer thread's queue and hands)

    def take(self, it, measuring: bool) -> Fed:
        t0 = time.perf_counter()
        batch = next(it)
        return Fed(batch, time.perf_counter() - t0)

    def close(self) -> None:
        pass

    def turn(self, on: bool) -> None:
        """An action trial's side gets (True) or gives up (False) its turn: only a producer thread cares."""


class Serial(Plain):
    """The GPU pipeline on the training thread's stream, after the wait for the batch's bytes and before its
    step (overlap off)."""

    def __init__(self, side: DeviceSide):
        self.side = side

    def take(self, it, measuring: bool) -> Fed:
        fed = super().take(it, measuring)
        return Fed(self.side(fed.batch, measuring), fed.wait_s)


class _Failed(NamedTuple):
    exc: BaseException


class Overlapped(Plain):
    """The GPU pipeline in a producer thread on a stream of its own, ``ahead`` batches ahead of the step.

    The producer starts at the first :meth:`take` (on the loader iterator it is handed) and stops at
    :meth:`close`, which must come before the loader shuts down. A failure in the producer (a bad JPEG, the
    loader's own error) is raised at the next :meth:`take`. Which batches count as measured is decided when the
    training thread takes them, so a batch prepared during warm-up but taken in a window counts in the window."""

    def __init__(
        self, side: DeviceSide, device: torch.device, ahead: int = AHEAD, step_first: bool = False, staged: bool = False
    ):
        self.side, self.ahead, self.staged = side, ahead, bool(staged)
        self.held = ahead + 1 + (2 if self.staged else 0)  # staged: one more decoded, one more in the decoder's hands
        self.device = torch.device(device)
        if self.device.type == "cuda" and self.device.index is None:  # streams and set_device need the index
            self.device = torch.device("cuda", torch.cuda.current_device())
        # the producer's stream at the default priority: at the device's highest, its decode still spanned the
        # step beside it and the rate did not move (docs/measured.md, "The GPU pipeline beside the step: where its
        # time goes")
        self.stream = torch.cuda.Stream(self.device) if self.device.type == "cuda" else None
        # staged: the decoding thread's stream (the augmenting thread keeps ``stream``), and the one decoded batch
        # between them: the decoder runs at most one batch ahead of the augment
        self.decode_stream = torch.cuda.Stream(self.device) if self.staged and self.stream is not None else None
        self.decoded: queue.Queue = queue.Queue(maxsize=1)
        self.step_first = bool(step_first) and self.stream is not None
        self.switched = 0  # the id of the thread whose steps this feed moved to the high-priority stream
        self.ready: queue.Queue = queue.Queue(maxsize=ahead)
        self.stopping = threading.Event()
        self.gate = threading.Event()  # set: the producer may take the next batch (cleared out of its side's turn)
        self.gate.set()
        self.threads: list[threading.Thread] = []  # the producer's (two staged), started at the first take
        self.it = None
        self.pipeline_wait_s: list[float] = []  # measured batches: the training thread's wait beyond the loader's

    def take(self, it, measuring: bool) -> Fed:
        if not self.threads:
            if self.step_first:
                self._to_step_stream()
            self.it = it
            loops = [self._decode_loop, self._augment_loop] if self.staged else [self._produce]
            self.threads = [
                threading.Thread(target=f, name=f"pipeprof-gpu-pipeline-{i}", daemon=True) for i, f in enumerate(loops)
            ]
            for t in self.threads:
                t.start()
        t0 = time.perf_counter()
        item = self.ready.get()
        wait = time.perf_counter() - t0
        if isinstance(item, _Failed):
            raise item.exc
        _, batch, marks, host_s, done, loader_s = item  # the batch as the loader gave it, then as prepared
        # the data wait is the part of the training thread's wait the loader accounts for: at most what the
        # producer itself waited for this batch's bytes; the rest it waited on the GPU pipeline (decoding and
        # augmenting, slowed where the step holds the SMs), which is the step's side of the device, not input
        data_wait = min(wait, loader_s)
        if measuring:
            self.pipeline_wait_s.append(wait - data_wait)
        if self.stream is not None:
            here = torch.cuda.current_stream(self.device)
            here.wait_event(done)  # the step's kernels start after the pipeline's last one for this batch
            for v in batch.values():
                if isinstance(v, torch.Tensor) and v.is_cuda:
                    v.record_stream(here)  # freed by the producer's stream, reused only after the step's use
        if self.side.stand_in is not None:
            self.side.stand_in()  # on the training thread's stream, where the step would run
        self.side.keep(marks, host_s, measuring)
        return Fed(batch, data_wait)

    def _produce(self) -> None:
        """One producer thread (overlap on): each batch decoded and augmented on the producer's stream."""
        self._take_loop(self.stream, self.side.prepare, self.ready)

    def _decode_loop(self) -> None:
        """Staged, the first thread: each batch decoded on its own stream, handed on to the augmenting thread."""
        self._take_loop(self.decode_stream, self.side.decode_part, self.decoded)

    def _take_loop(self, stream, work, to: queue.Queue) -> None:
        """Take the loader's batches in turn (the gate), ``work`` each on ``stream``, and hand ``to`` on (the batch,
        work's result, the event after it, the seconds the loader took); a failure goes the same way."""
        try:
            if self.stream is not None:
                torch.cuda.set_device(self.device)
            with torch.cuda.stream(stream) if stream is not None else nullcontext():
                while not self.stopping.is_set():
                    if not self.gate.wait(0.1) or self.stopping.is_set():
                        continue
                    t0 = time.perf_counter()
                    batch = next(self.it)
                    loader_s = time.perf_counter() - t0
                    result = work(batch)
                    done = torch.cuda.Event() if stream is not None else None
                    if done is not None:
                        done.record(stream)
                    self._put((batch, *result, done, loader_s), to)
        except BaseException as exc:  # noqa: BLE001 - handed to the training thread, which raises it
            self._put(_Failed(exc), to)

    def _augment_loop(self) -> None:
        """Staged, second thread: each decoded batch augmented on the producer's stream after its decode, in the
        order the loader gave them (the augment's random draws follow the batches as serially)."""
        try:
            if self.stream is not None:
                torch.cuda.set_device(self.device)
            with torch.cuda.stream(self.stream) if self.stream is not None else nullcontext():
                while not self.stopping.is_set():
                    try:
                        item = self.decoded.get(timeout=0.1)
                    except queue.Empty:
                        continue
                    if isinstance(item, _Failed):
                        self._put(item)
                        return
                    batch, images, (m0, m1), decode_s, decoded, loader_s = item
                    if decoded is not None:
                        self.stream.wait_event(decoded)  # the augment's kernels after the decode's last
                        for t in images if isinstance(images, (list, tuple)) else [images]:
                            if isinstance(t, torch.Tensor) and t.is_cuda:
                                t.record_stream(self.stream)  # the decoder's stream freed it: reused after ours
                    out, (m2, m3), augment_s = self.side.augment_part(images)
                    done = torch.cuda.Event() if self.stream is not None else None
                    if done is not None:
                        done.record(self.stream)
                    self._put((batch, {**batch, "image": out}, (m0, m1, m2, m3), decode_s + augment_s, done, loader_s))
        except BaseException as exc:  # noqa: BLE001 - handed to the training thread, which raises it
            self._put(_Failed(exc))

    def _put(self, item, to: Optional[queue.Queue] = None) -> None:
        to = self.ready if to is None else to
        while not self.stopping.is_set():
            try:
                to.put(item, timeout=0.1)
                return
            except queue.Full:
                continue

    def turn(self, on: bool) -> None:
        (self.gate.set if on else self.gate.clear)()

    def _to_step_stream(self) -> None:
        """The training thread's steps from now on its device's high-priority stream, after what its stream had
        queued (the model's weights, the optimiser's state); the last of this thread's step-first feeds to close
        hands its stream back (an action trial holds one feed per side open at once, all on this thread)."""
        state = _ON_STEP_STREAM
        if getattr(state, "depth", 0) == 0:
            state.before = torch.cuda.current_stream(self.device)
            hi = step_stream(self.device)
            hi.wait_stream(state.before)
            torch.cuda.set_stream(hi)
        state.depth = getattr(state, "depth", 0) + 1
        self.switched = threading.get_ident()  # the thread whose stream moved: only it hands it back

    def _from_step_stream(self) -> None:
        owner, self.switched = self.switched, False
        state = _ON_STEP_STREAM
        if not owner or owner != threading.get_ident() or getattr(state, "depth", 0) == 0:
            return  # not switched, or closed on another thread: that thread's stream is not ours to move
        state.depth -= 1
        if state.depth == 0:  # the thread's stream after the steps the high-priority one ran
            state.before.wait_stream(torch.cuda.current_stream(self.device))
            torch.cuda.set_stream(state.before)
            state.before = None

    def close(self) -> None:
        """Stop the producer (it finishes the batch it is on) and wait for it: before the loader closes, and with
        the loader's workers running (a producer inside ``next`` waits for their batch). A producer that does not
        stop is an error: the loader would shut down under it. Called on the thread that took the batches."""
        try:
            self._stop()
        finally:
            self._from_step_stream()

    def _stop(self) -> None:
        self.stopping.set()
        for t in self.threads:
            t.join(timeout=60)
            if t.is_alive():
                raise RuntimeError(
                    f"the GPU pipeline's producer thread {t.name} did not stop within 60 s (inside the loader's "
                    "next(), a decode or an augment call): its loader is left open"
                )
        for q in (self.ready, self.decoded):
            while not q.empty():
                q.get_nowait()
        for stream in (self.decode_stream, self.stream):
            if stream is not None:
                stream.synchronize()


def pipeline_wait_columns(fed, measured_s: float) -> dict:
    """An overlapped GPU pipeline's share of the measured time the training thread waited for it, beyond its
    data wait (the loader's): ``gpu_pipeline_wait_frac`` ({} for the other feeds)."""
    waits = getattr(fed, "pipeline_wait_s", None)
    if not waits or measured_s <= 0:
        return {}
    return {"gpu_pipeline_wait_frac": float(sum(waits) / measured_s)}


def _merged(iv: np.ndarray) -> list:
    """[start, end] intervals joined where they touch or overlap, in order."""
    out: list = []
    for a, b in sorted(map(tuple, iv)):
        if out and a <= out[-1][1]:
            out[-1][1] = max(out[-1][1], b)
        else:
            out.append([a, b])
    return out


def overlap_ms(step: np.ndarray, pipe: np.ndarray) -> float:
    """Milliseconds in which the step and the pipeline both had work on the device: ``step`` and ``pipe`` are
    (n, 2) arrays of [start, end] intervals on one clock. Each set is merged first (its own intervals may touch
    or overlap), then their intersection is summed."""
    s, p = _merged(step), _merged(pipe)
    i = j = 0
    total = 0.0
    while i < len(s) and j < len(p):
        total += max(0.0, min(s[i][1], p[j][1]) - max(s[i][0], p[j][0]))
        if s[i][1] < p[j][1]:
            i += 1
        else:
            j += 1
    return total


def overlap_columns(clock: DeviceClock, step_marks: list, pipe_marks: list) -> dict:
    """The overlap achieved over the measured batches: the share of the pipeline's device time that ran while
    the step ran (``gpu_overlap_frac``), and both busy times. ``step_marks``: (start, end) of each step's compute;
    ``pipe_marks``: the pipeline's (decode start, decode end, augment end), or staged (decode start, decode end,
    augment start, augment end). Read after the last window's sync,
    on the clock of the first pipeline mark (CUDA events of one device compare across streams)."""
    if not step_marks or not pipe_marks:
        return {}
    ref = pipe_marks[0][0]
    at = np.vectorize(lambda m: clock.elapsed_ms(ref, m), otypes=[float])
    step = np.column_stack([at([m[0] for m in step_marks]), at([m[1] for m in step_marks])])
    # one span a batch where one stream ran decode and augment back to back; staged, each stage's own (the
    # batch may wait between them, which is not the pipeline's device time)
    spans = [[(m[0], m[-1])] if len(m) == 3 else list(stages(m)) for m in pipe_marks]
    flat = [span for batch in spans for span in batch]
    pipe = np.column_stack([at([a for a, _ in flat]), at([b for _, b in flat])])
    busy = float(sum(b - a for a, b in _merged(pipe)))  # staged, a batch's decode and another's augment run at once
    both = overlap_ms(step, pipe)
    return {
        "gpu_overlap_frac": both / busy if busy > 0 else None,
        "gpu_overlap_ms_per_batch": both / len(pipe_marks),
    }


def feed(ctx, spec) -> Plain:
    """How a trial's batches reach its step: :class:`Plain` for the CPU pipeline, :class:`Serial` or
    :class:`Overlapped` for the GPU's (``spec.augment_overlap``)."""
    side = device_side(ctx, spec)
    return Plain() if side is None else gpu_feed(side, ctx.device, spec)


def gpu_feed(side: DeviceSide, device, spec) -> Plain:
    """The GPU pipeline's feed as ``spec`` places it beside the step: overlapped (step-first or not) or serial."""
    if spec.augment_overlap:
        return Overlapped(side, device, step_first=bool(spec.step_first), staged=bool(spec.staged))
    return Serial(side)


class StandIn:
    """``stand_in()`` occupies the device for ``seconds``, as a step of that length would: on a GPU a spin
    kernel queued on the current stream (``torch.cuda._sleep``, in clock cycles counted once against CUDA
    events), so the host goes on at once; on the CPU, where the step runs on the calling thread, a sleep."""

    def __init__(self, device: torch.device, seconds: float):
        self.seconds, self.cuda = seconds, device.type == "cuda"
        self.cycles = round(seconds * _cycles_per_s()) if self.cuda else 0
        self.marks: list[tuple] = []

    def __call__(self) -> None:
        if not self.cuda:
            time.sleep(self.seconds)
            return
        if len(self.marks) < 8:  # its length on the device, for the record: a few suffice (read after a sync)
            start = torch.cuda.Event(enable_timing=True)
            start.record()
            torch.cuda._sleep(self.cycles)
            end = torch.cuda.Event(enable_timing=True)
            end.record()
            self.marks.append((start, end))
        else:
            torch.cuda._sleep(self.cycles)

    def columns(self) -> dict:
        done = [a.elapsed_time(b) for a, b in self.marks if b.query()] if self.cuda else []
        return {
            "stand_in_step_ms": self.seconds * 1e3,
            "stand_in_step_device_ms": float(np.median(done)) if done else None,
        }


def _cycles_per_s() -> float:
    """The spin kernel's clock cycles per second on the current device, timed by CUDA events: 20 ms worth at
    a nominal 2 GHz, twice, the second read (the first carries the kernel's load)."""
    cycles = 40_000_000
    for _ in range(2):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        torch.cuda._sleep(cycles)
        end.record()
        end.synchronize()
    return cycles / (start.elapsed_time(end) / 1e3)


def device_side(ctx, spec) -> Optional[DeviceSide]:
    """The DeviceSide of a trial whose workers only read bytes (``spec.augment_device`` set), else None."""
    if spec.augment_device in (None, "cpu") or ctx.user_dataset is not None or ctx.user_loader is not None:
        return None
    decoder = spec.gpu_decoder or DEFAULT_GPU_DECODER
    return DeviceSide(spec.preset, spec.image_size, ctx.device, ctx.seed, ctx.stand_in_step_s, decoder)
