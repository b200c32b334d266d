"""``--tune`` inside the watched process: the loop paused at a step boundary, the loader measured alone.

The hook calls :func:`serve` from the user's ``next()`` when the parent asks, handing it its own rule
for the samples in a batch (``hook.count``: this module imports nothing of the hook, which imports this
one when a pause begins). It stops the workers the user's loaders have running (persistent workers, or
those of the pass the loop was in: they would take cores and fill their queues while the copies are timed),
says it has paused, with what ``data.user_pipeline`` can change in the loader's dataset, then answers the
parent's commands:

- ``measure``: a new DataLoader built from the arguments the user's loader was built with (the same
  dataset object, sampler, collate function, pin_memory, worker_init_fn; only ``num_workers``, and what 0
  workers forbids, changed), timed alone with pipeprof's steady-state windows (``measure.windows.
  steady_state``: warm-up past the prefetched batches, windows of whole worker rounds, median and 95%
  interval), as a ``cpu_pipeline`` trial does;
- ``handoff``: the same loader over one real sample built once and returned for every index (the
  ``handoff`` trial's method): what the loader's hand-off alone passes, the limit no worker count raises;
- ``side``: the loader, or a changed copy of it (an action's variant), timed alone with the training
  process's work on each batch (``pause_actions``);
- ``resume`` ends the pause.

The user's loader, its iterator and its workers are never changed (its workers only stopped and continued);
the random states a new loader draws from (torch's, Python's, numpy's, the sampler's and the loader's
generators) are put back as they were, so the user's data order does not change.
"""

from __future__ import annotations

import inspect
import random
import statistics
import sys
import time
from types import SimpleNamespace

import torch
from torch.utils.data import DataLoader

from pipeprof.measure.loader import Pause, collect_before_fork
from pipeprof.measure.windows import steady_state

WAIT_S = 600.0  # the parent answers within the pause; past this the loop resumes on its own


def rebuild(loader, workers: int, **changes) -> DataLoader:
    """A DataLoader like ``loader`` (its constructor's arguments as the user passed them) at ``workers``, with
    ``changes`` (DataLoader keywords: another dataset, collate_fn, pin_memory ...)."""
    args, kwargs = loader._pipeprof_args
    bound = inspect.signature(DataLoader.__init__).bind(None, *args, **kwargs)
    given = dict(bound.arguments)
    given.pop("self")
    extra = given.pop("kwargs", {})  # DataLoader keywords a newer torch adds, passed through by name
    given |= extra | changes
    given["num_workers"] = workers
    if workers == 0:  # torch refuses these without workers
        given["prefetch_factor"], given["persistent_workers"] = None, False
    return DataLoader(**given)


class RandomStates:
    """Every random state a new loader may draw from, saved and put back."""

    def __init__(self, loader):
        gens = [
            getattr(loader, "generator", None),
            getattr(loader.sampler, "generator", None),
            getattr(getattr(loader, "batch_sampler", None), "generator", None),
        ]
        self.gens = [(g, g.get_state()) for g in gens if isinstance(g, torch.Generator)]
        self.torch, self.python = torch.get_rng_state(), random.getstate()
        np = sys.modules.get("numpy")
        self.numpy = (np, np.random.get_state()) if np is not None else None

    def restore(self) -> None:
        for g, state in self.gens:
            g.set_state(state)
        torch.set_rng_state(self.torch)
        random.setstate(self.python)
        if self.numpy is not None:
            self.numpy[0].random.set_state(self.numpy[1])


def measure(loader, workers: int, policy: dict, on_workers, count, changes=None, work=None, sync=None) -> dict:
    """The loader alone at ``workers``: steady-state windows over ``next()`` (a pass that ends starts
    again, counted as ``loader_restarts``), samples by ``count``, then its workers shut down. ``changes``:
    DataLoader keywords to change (another dataset of the same length, a collate, a knob); ``work(batch)``:
    the training process's own work on each batch before its step (``pause_actions``), inside the windows,
    which ``sync`` closes (the device's queue drained)."""
    clone = rebuild(loader, workers, **(changes or {}))
    collect_before_fork()  # the pause's own imports leave a full collection due that each child would run
    state = SimpleNamespace(it=iter(clone), restarts=0, starts=[], passes=[], in_pass=0, receive_cpu_s=0.0, received=0)
    on_workers([w.pid for w in getattr(state.it, "_workers", [])])

    def samples(batch) -> int:  # the hook's rule, with the watch's fallback (``records``: the batch size)
        n = work(batch) if work is not None else count(batch) or clone.batch_size or 1
        state.in_pass += n
        return n

    def step() -> int:
        try:
            # this thread's CPU in next(): the batch received (unpickled, its tensors mapped from shared memory),
            # not the wait for it, which takes none: the hand-off's share on the loop's own thread
            cpu = time.thread_time()
            batch = next(state.it)
            state.receive_cpu_s += time.thread_time() - cpu
            n = samples(batch)
            state.received += n
            return n
        except StopIteration:  # a pass ended: its samples, and the next one's start (iter() to its first batch)
            state.restarts += 1
            state.passes.append(state.in_pass)
            state.in_pass = 0
            t = time.perf_counter()
            state.it = iter(clone)
            batch = next(state.it)
            state.starts.append(time.perf_counter() - t)
            on_workers([w.pid for w in getattr(state.it, "_workers", [])])
            return samples(batch)

    depth = workers * (clone.prefetch_factor or 0)
    try:
        m = steady_state(
            step,
            SimpleNamespace(**policy),
            min_warmup_batches=depth + policy["warmup_batches"],
            batch_multiple=window_batches(_passes(clone), workers),
            sync=sync or (lambda: None),
            on_phase=getattr(work, "on_phase", lambda phase: None),
        )
    finally:
        shutdown = getattr(state.it, "_shutdown_workers", None)
        if shutdown is not None:
            shutdown()
    # added to the step's time in the model (watch.tune.receive_bound) where the step is the host's: on a GPU the
    # watched step is the device's time, which the receiving overlaps unless the loop waits for the GPU each step
    # (not yet measured there), so a CUDA job's is left unset
    host_step = not torch.cuda.is_initialized()
    receive = state.receive_cpu_s / state.received * 1e6 if state.received and workers and host_step else None
    return (
        m.stats()
        | {"loader_restarts": state.restarts, "receive_us_per_sample": receive}
        | pass_columns(state.starts, state.passes)
    )


def pass_columns(starts: list[float], passes: list[int]) -> dict:
    """A loader's passes as the pause saw them: the median time from ``iter()`` to a pass's first batch
    (``pass_start_s``: the workers started, where they are not persistent, and the first batch made; the step
    has nothing to do meanwhile) and the median samples of a pass. None where no pass ended (a pass longer
    than the trial)."""
    return {
        "pass_start_s": statistics.median(starts) if starts else None,
        "samples_per_pass": statistics.median(passes) if passes else None,
    }


def serve(loader, client, first: dict, count) -> dict:
    """The pause: answer ``measure`` commands until ``resume`` (or silence for WAIT_S), which it returns (it may
    ask the loop's next steps at other intra-op threads: the hook's ``ThreadsTrial``); ``count(batch)``: the
    samples in a batch, by the hook's rule."""
    from .pause_actions import user_workers

    if torch.cuda.is_initialized():
        torch.cuda.synchronize()  # the step in flight finishes before the loader is timed alone
    states = RandomStates(loader)
    quiet = Pause(pids=user_workers())
    quiet.stop()
    t0 = time.perf_counter()
    client.send(
        {
            "k": "tune_paused",
            "loader": first.get("loader"),
            "t": t0,
            "user": _inspect(loader),
            "stopped": quiet.stopped,
            "batches_per_pass": _passes(loader),
            # a CPU step's intra-op threads share the cores with the workers (watch.tune.step_threads)
            "threads": torch.get_num_threads(),
        }
    )
    client.flush()
    resume: dict = {}
    try:
        while True:
            cmds = client.commands(wait_s=WAIT_S)
            resume = next((c for c in cmds if c.get("cmd") == "resume"), {})
            if not cmds or resume:
                break
            for cmd in cmds:
                if cmd.get("cmd") in COMMANDS:
                    COMMANDS[cmd["cmd"]](loader, client, cmd, count)
    finally:
        quiet.resume()
        states.restore()
        client.send({"k": "tune_resumed", "t": time.perf_counter(), "paused_s": time.perf_counter() - t0})
        client.flush()
    return resume


def window_batches(per_pass, workers: int) -> int:
    """The batches a window holds a whole multiple of: a worker round, or a whole pass where a pass is short
    (at most 4 rounds). A pass's last round keeps only some workers busy until the loop starts the next pass
    (``watch.tune.pass_efficiency``): with windows of one round, one window holds that idle tail and the next
    does not, and the same loader read a third apart within one pause (docs/measured.md). A window of whole
    passes holds each pass's tail once."""
    rounds = max(workers, 1)
    return per_pass if per_pass and per_pass % rounds and per_pass <= 4 * rounds else rounds


def _passes(loader):
    """Batches in one pass of the loader (None where its dataset has no length)."""
    try:
        return len(loader)
    except TypeError:
        return None


def _inspect(loader) -> dict:
    """What ``data.user_actions`` can change in the loader's dataset (per action), or why it cannot look."""
    try:
        from pipeprof.data.user_actions import inspect as look

        return look(loader.dataset, torch.cuda.is_available(), loader.collate_fn)  # its collate: uint8 batches?
    except Exception as exc:  # noqa: BLE001 - a dataset we cannot read is a reason, not a failed pause
        return {"error": f"{type(exc).__name__}: {exc}"}


def _handoff(loader, client, cmd: dict, count) -> None:
    """The hand-off trial's method on the user's loader: one real sample, built once, for every index (for an
    IterableDataset, its first item, yielded without end)."""
    from torch.utils.data import IterableDataset

    from pipeprof.data.dataset import PrebuiltDataset, PrebuiltStream

    w, ds = int(cmd["workers"]), loader.dataset
    try:
        # outside any timer; a copy of its random draws is put back with the rest
        if isinstance(ds, IterableDataset):
            prebuilt = PrebuiltStream(next(iter(ds)))
        else:
            prebuilt = PrebuiltDataset(ds[0], len(ds))
        stats = measure(loader, w, cmd["policy"], lambda pids: None, count, {"dataset": prebuilt})
        client.send({"k": "tune_handoff", "workers": w, "t": time.perf_counter(), "stats": stats})
    except Exception as exc:  # noqa: BLE001 - an unsized dataset, a sample that cannot be built: a reason
        client.send({"k": "tune_handoff", "workers": w, "error": f"{type(exc).__name__}: {exc}"})
    client.flush()


def _side(loader, client, cmd: dict, count) -> None:
    """One side of the actions: the user's loader (``action`` None) or an action's variant of it, timed alone
    with the training process's work on each batch (``pause_actions.side_stats``)."""
    from .pause_actions import side_stats

    def on_workers(pids):  # the job's processes too, for the monitor (not the curve's points)
        client.send({"k": "tune_side_workers", "action": cmd.get("action"), "pids": pids})
        client.flush()

    try:
        stats = side_stats(loader, cmd, count, measure, on_workers)
        client.send({"k": "tune_side", "action": cmd.get("action"), "t": time.perf_counter(), "stats": stats})
    except Exception as exc:  # noqa: BLE001 - a variant that cannot run is a row with its error
        client.send({"k": "tune_side", "action": cmd.get("action"), "error": f"{type(exc).__name__}: {exc}"})
    client.flush()


def _measure_one(loader, client, cmd: dict, count) -> None:
    w = int(cmd["workers"])

    def on_workers(pids):
        client.send({"k": "tune_workers", "workers": w, "pids": pids})
        client.flush()

    client.send({"k": "tune_start", "workers": w, "t": time.perf_counter()})
    client.flush()
    try:
        stats = measure(loader, w, cmd["policy"], on_workers, count)
        client.send({"k": "tune_point", "workers": w, "t": time.perf_counter(), "stats": stats})
    except Exception as exc:  # a count that cannot run (memory, a worker that dies) is a row, not a crash
        client.send(
            {"k": "tune_point", "workers": w, "t": time.perf_counter(), "error": f"{type(exc).__name__}: {exc}"}
        )
    client.flush()


COMMANDS = {"measure": _measure_one, "handoff": _handoff, "side": _side}
