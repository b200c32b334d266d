"""Inside every watched Python process: time each wait for a batch, record each DataLoader as built.

Installed by ``boot/sitecustomize.py`` when ``PIPEPROF_WATCH_SOCKET`` is set. Nothing happens until
the process imports ``torch.utils.data.dataloader`` (a meta-path finder patches that module right
after it has run, so a process that never loads data never imports torch because of us). Then:

* ``DataLoader.__init__`` records the loader's settings and the file:line of the user's code that
  built it (the first frame outside torch and outside the loader's own ``__init__`` chain); loaders
  are told apart by that site (``train.py:41``; a second loader of other settings from the same
  site is ``train.py:41#2``).
* ``_BaseDataLoaderIter.__next__`` takes the host clock (``time.perf_counter``, the parent's clock
  too) at its call and its return: the wait is the difference, the step the time from the previous
  return of the same loader to this call. On CUDA an event is also recorded on the current stream at
  the return and at the next call; their elapsed time (the device's time for the step) is read later
  with ``query()``, never by synchronising the loop. Samples are the first tensor's length.
* Records are buffered and sent every :data:`FLUSH_S` from a step boundary, where commands from the
  parent are read too: ``off`` restores the original methods; ``tune`` pauses the loop there (see
  ``pause``). DataLoader worker processes are never timed.

Stdlib only at import: this module is loaded by file path in processes that may not have pipeprof's
dependencies until the pause imports them.
"""

from __future__ import annotations

import atexit
import functools
import importlib
import importlib.machinery
import importlib.util
import os
import sys
import time
import traceback
import weakref
from collections import deque

try:
    from . import channel, sites
except ImportError:  # loaded by file path in a watched process (boot/sitecustomize.py)
    import _pipeprof_watch_channel as channel

    _spec = importlib.util.spec_from_file_location(
        "_pipeprof_watch_sites", os.path.join(os.path.dirname(__file__), "sites.py")
    )
    sites = importlib.util.module_from_spec(_spec)
    _spec.loader.exec_module(sites)

TARGET = "torch.utils.data.dataloader"
FLUSH_S = 0.25  # records leave the process about four times a second: one sendall each
HOLD_S = 2.0  # a batch whose CUDA step has not been read after this long is sent without it
PENDING = -1.0  # its CUDA step is not read yet
clock = time.perf_counter
_STATE = None  # the process's Watch, once installed


class _PostImport:
    """A meta-path finder: ``torch.utils.data.dataloader`` imports as usual, then ``on_import(module)``."""

    def __init__(self, on_import):
        self.on_import = on_import

    def find_spec(self, name, path, target=None):
        if name != TARGET:
            return None
        spec = importlib.machinery.PathFinder.find_spec(name, path)
        if spec is None or not hasattr(spec.loader, "exec_module"):
            return None
        run = spec.loader.exec_module

        def exec_module(module):
            run(module)
            self.on_import(module)

        spec.loader.exec_module = exec_module
        return spec


def count(batch, depth: int = 0):
    """Samples in a batch: the first tensor's (or array's) length, depth first; None when there is none."""
    shape = getattr(batch, "shape", None)
    if shape is not None and len(shape) > 0:
        return int(shape[0])
    if depth < 4:
        items = batch.values() if isinstance(batch, dict) else batch if isinstance(batch, (list, tuple)) else ()
        for item in items:
            n = count(item, depth + 1)
            if n is not None:
                return n
    return None


class LoaderInfo:
    """What the hook keeps per loader label in this process."""

    def __init__(self, label: str):
        self.label, self.passes, self.prev = label, 0, None  # prev: (record, CUDA event at its return)
        self.workers: set[int] = set()


class ThreadsTrial:
    """The loop's next steps at ``threads`` intra-op threads, asked at the pause's end for a CPU step that the
    recommended count leaves fewer cores (``watch.tune.step_threads``): each step's time (return to the next
    call, as the watch reads steps) and samples, the first ``WARM`` left out (the new thread pool's start); the
    user's count is set back after ``steps``."""

    WARM = 3

    def __init__(self, torch, label: str, threads: int, steps: int):
        self.torch, self.label, self.steps = torch, label, steps
        self.restore, self.threads = torch.get_num_threads(), threads
        self.times: list[float] = []
        self.samples: list[int] = []
        self.seen = 0
        torch.set_num_threads(threads)

    def step(self, seconds: float, samples: int) -> bool:
        """One step's time and samples; True when the trial is over (the user's threads set back)."""
        self.seen += 1
        if self.seen > self.WARM:
            self.times.append(seconds)
            self.samples.append(samples)
        if self.seen < self.WARM + self.steps:
            return False
        self.torch.set_num_threads(self.restore)
        return True

    def message(self) -> dict:
        return {
            "k": "tune_step_threads",
            "label": self.label,
            "threads": self.threads,
            "step_s": self.times,
            "samples": self.samples,
            "t": clock(),
        }


def _qualname(obj) -> str | None:
    if obj is None:
        return None
    kind = obj if isinstance(obj, type) else type(obj)
    if callable(obj) and not isinstance(obj, type) and hasattr(obj, "__qualname__"):
        kind = obj  # a function (collate_fn): its own name, not 'function'
    return f"{getattr(kind, '__module__', '?')}.{getattr(kind, '__qualname__', kind)}"


def settings(loader) -> dict:
    """A DataLoader's settings as the run folder records them."""
    batch = loader.batch_size
    if batch is None:
        batch = getattr(loader.batch_sampler, "batch_size", None)
    try:
        length = len(loader.dataset)
    except TypeError:  # an IterableDataset without __len__
        length = None
    return {
        "num_workers": loader.num_workers,
        "batch_size": batch,
        "pin_memory": bool(loader.pin_memory),
        "prefetch_factor": loader.prefetch_factor,
        "persistent_workers": bool(loader.persistent_workers),
        "in_order": bool(getattr(loader, "in_order", True)),
        "drop_last": bool(loader.drop_last),
        "dataset": _qualname(loader.dataset),
        "dataset_len": length,
        "sampler": _qualname(loader.sampler),
        "batch_sampler": _qualname(loader.batch_sampler) if loader.batch_size is None else None,
        "collate_fn": _qualname(loader.collate_fn),
        "worker_init_fn": _qualname(loader.worker_init_fn),
        "loader_class": _qualname(loader),
        # a subclass's own __iter__ may build batches without the base iterator, whose __next__ is what is timed
        "own_iter": _own_iter(type(loader)),
    }


def _own_iter(cls) -> bool:
    """True where ``cls`` (a DataLoader subclass) defines its own ``__iter__`` instead of DataLoader's."""
    base = next((c for c in cls.__mro__ if c.__name__ == "DataLoader" and c.__module__.startswith("torch.")), None)
    return base is not None and cls.__iter__ is not base.__iter__


def user_site(loader, torch_dir: str) -> dict:
    """Where the user's code built ``loader`` (``sites.describe``): the first frame of the user's own code
    (outside installed packages, the standard library, pipeprof, torch and the loader's own ``__init__`` chain),
    the library frame beside it (timm's ``create_loader``, Lightning's re-creation), the knob as written, and a
    short stack."""

    def skip(frame):
        file = frame.f_code.co_filename
        return file.startswith(torch_dir) or file == __file__ or frame.f_locals.get("self") is loader

    frame, library = sites.user_frame(sys._getframe(2), skip)
    if frame is None:
        frame, library = library, None  # all library frames: the innermost is the best we have
    if frame is None:
        return {"path": "?", "line": 0, "library_site": None, "knob": None, "option": None, "stack": []}
    found = sites.describe(frame, library)
    found["stack"] = [f"{f.filename}:{f.lineno} in {f.name}" for f in traceback.extract_stack(frame, limit=3)][::-1]
    return found


class Watch:
    """The hook's state in one process: loaders seen, records not yet sent, CUDA events not yet read."""

    def __init__(self, client):
        self.client, self.active, self.torch, self.orig = client, True, None, {}
        self.labels: dict[tuple, str] = {}  # (site, dataset type, batch, workers) -> label
        self.sites: dict[str, int] = {}
        self.by_dataset: dict[int, tuple] = {}  # id(dataset) -> (weakref to it, label of the loader built over it)
        self.infos: dict[str, LoaderInfo] = {}
        self.latest: dict[str, weakref.ref] = {}  # label -> the last loader built there (for the pause)
        self.threads_trial: ThreadsTrial | None = None  # the steps after a pause at other intra-op threads
        self.rows: deque = deque()  # [label, pass, t_call, t_ret, samples, grad enabled, CUDA step s]
        self.pending: deque = deque()  # (record, event at its return, event at the next call)
        self.pool: list = []
        self.last_flush, self.hello = clock(), False

    # -- patching -------------------------------------------------------------------------------
    def patch(self, module) -> None:
        if self.orig:  # patched once: a second patch would wrap our own wrappers
            return
        self.torch = sys.modules["torch"]
        base, loader = module._BaseDataLoaderIter, module.DataLoader
        self.orig = {
            "next": base.__next__,
            "iter_init": base.__init__,
            "loader_init": loader.__init__,
            "base": base,
            "loader": loader,
        }
        base.__next__ = functools.wraps(base.__next__)(_next)
        base.__init__ = functools.wraps(base.__init__)(_iter_init)
        loader.__init__ = functools.wraps(loader.__init__)(_loader_init)

    def unpatch(self) -> None:
        """The original methods back: after the watched window the loop runs untouched."""
        if self.orig:
            self.orig["base"].__next__ = self.orig["next"]
            self.orig["base"].__init__ = self.orig["iter_init"]
            self.orig["loader"].__init__ = self.orig["loader_init"]
        self.active = False

    def in_worker(self) -> bool:
        return self.torch.utils.data.get_worker_info() is not None

    def _hello(self) -> None:
        if not self.hello:
            self.hello = True
            env = os.environ
            self.client.send(
                {
                    "k": "hello",
                    "pid": os.getpid(),
                    "ppid": os.getppid(),
                    "argv": sys.argv[:8],
                    "rank": int(env.get("RANK", 0)),
                    "local_rank": int(env.get("LOCAL_RANK", 0)),
                    "world": int(env.get("WORLD_SIZE", 1)),
                    "t": clock(),
                    "unix": time.time(),
                    "torch": getattr(self.torch, "__version__", None),
                }
            )

    # -- loaders ----------------------------------------------------------------------------------
    def built(self, loader, args: tuple, kwargs: dict) -> None:
        """A DataLoader was built: give it a label (its user's site) and say so once per label. A loader a
        framework re-creates from inside itself (Lightning adding its sampler, Accelerate's ``prepare``) over the
        same dataset object as one the user built is that loader's row: it takes over the label, and the pause
        copies it (the framework's sampler kept)."""
        found = settings(loader)
        where = user_site(loader, os.path.dirname(self.torch.__file__))
        ds = id(loader.dataset)
        user = self.by_dataset.get(ds)
        if where["library_site"] is not None and user is not None and user[0]() is loader.dataset:
            label = user[1]
            self.client.send(
                {
                    "k": "loader_rebuilt",
                    "label": label,
                    "library_site": where["library_site"],
                    "site": f"{where['path']}:{where['line']}",  # the user's line that led to it (prepare, train)
                    "settings": found,
                    "t": clock(),
                }
            )
        else:
            file, line = where["path"], where["line"]
            site = f"{os.path.basename(file)}:{line}"
            key = (site, found["dataset"], found["batch_size"], found["num_workers"])
            label = self.labels.get(key)
            if label is None:
                n = self.sites[site] = self.sites.get(site, 0) + 1
                label = self.labels[key] = site if n == 1 else f"{site}#{n}"
                self.infos[label] = LoaderInfo(label)
                self._hello()
                self.client.send(
                    {"k": "loader", "label": label, "site": site, **where, "settings": found, "t": clock()}
                )
            try:
                self.by_dataset[ds] = (weakref.ref(loader.dataset), label)
            except TypeError:  # a dataset that takes no weak reference is never joined
                pass
        loader._pipeprof_label = label
        loader._pipeprof_args = (args, kwargs)  # the pause re-creates the loader from them
        self.latest[label] = weakref.ref(loader)

    # -- batches ----------------------------------------------------------------------------------
    def call(self, it, info: LoaderInfo, t: float) -> None:
        """At the call of ``next()``: the step since the previous return ends here."""
        first = it._num_yielded == 0
        if first:  # a new pass: the time since the last pass's last batch is not a step of this loader
            info.passes += 1
            self._drop_prev(info)
            workers = [w.pid for w in getattr(it, "_workers", [])]
            if set(workers) - info.workers:
                info.workers |= set(workers)
                self.client.send({"k": "workers", "label": info.label, "pids": workers})
        elif info.prev is not None:
            rec, ev_ret = info.prev
            if self.threads_trial is not None and self.threads_trial.label == info.label:
                if self.threads_trial.step(t - rec[3], rec[4]):
                    self.client.send(self.threads_trial.message())
                    self.threads_trial = None
            info.prev = None
            if ev_ret is not None:
                ev_call = self._event()
                ev_call.record()
                self.pending.append((rec, ev_ret, ev_call))
        if t - self.last_flush >= FLUSH_S:
            self.boundary(t)

    def returned(self, info: LoaderInfo, t_call: float, t_ret: float, batch) -> None:
        rec = [info.label, info.passes, t_call, t_ret, count(batch), self.torch.is_grad_enabled(), None]
        ev = None
        if self.torch.cuda.is_initialized():  # never initialise CUDA ourselves
            ev = self._event()
            ev.record()
            rec[6] = PENDING
        info.prev = (rec, ev)
        self.rows.append(rec)

    def _event(self):
        return self.pool.pop() if self.pool else self.torch.cuda.Event(enable_timing=True)

    def _drop_prev(self, info: LoaderInfo) -> None:
        if info.prev is not None:
            rec, ev = info.prev
            rec[6] = None
            if ev is not None:
                self.pool.append(ev)
        info.prev = None

    def resolve(self, wait: bool = False) -> None:
        """Read the CUDA steps whose events have completed (all of them, waiting, when ``wait``)."""
        while self.pending and (wait or self.pending[0][2].query()):
            rec, a, b = self.pending.popleft()
            if wait:
                b.synchronize()
            rec[6] = a.elapsed_time(b) / 1e3
            self.pool += [a, b]

    def boundary(self, t: float) -> None:
        """Every FLUSH_S, at a step boundary: send the records that are complete, obey the parent."""
        self.last_flush = t
        self.send_rows(t)
        self.client.flush()
        cmds = self.client.commands()
        if any(c.get("cmd") == "resume" for c in cmds):  # the parent gave up on a pause before it began
            cmds = [c for c in cmds if c.get("cmd") not in ("tune", "resume")]
        for cmd in cmds:
            self.obey(cmd)

    def send_rows(self, t: float, final: bool = False) -> None:
        self.resolve()
        ready = []
        while self.rows and (final or self.rows[0][6] != PENDING or t - self.rows[0][3] > HOLD_S):
            rec = self.rows.popleft()
            ready.append(rec[:6] + [None if rec[6] == PENDING else rec[6]])
        if ready:
            self._hello()
            self.client.send({"k": "b", "d": ready})

    def obey(self, cmd: dict) -> None:
        if cmd.get("cmd") == "off":
            self.send_rows(clock(), final=True)
            self.unpatch()
            self.client.send({"k": "off", "t": clock()})
            self.client.flush()
        elif cmd.get("cmd") == "tune":
            self.pause(cmd)

    def pause(self, cmd: dict) -> None:
        """``--tune``: the loop stops here, at a step boundary, while ``pause.serve`` measures copies of the
        loader; this process's own loaders are not watched meanwhile."""
        ref = self.latest.get(cmd.get("loader"))
        loader = ref() if ref is not None else None
        self.active = False
        try:
            if loader is None:
                raise LookupError(f"loader {cmd.get('loader')} is no longer alive in process {os.getpid()}")
            root = os.environ.get(channel.ENV_ROOT)
            if root and root not in sys.path:
                sys.path.append(root)  # last: an installed pipeprof wins; the pause needs its package
            # the pause counts samples by this module's rule, handed over: it never imports the hook
            resume = importlib.import_module("pipeprof.watch.pause").serve(loader, self.client, cmd, count)
            if resume.get("step_threads"):
                self.threads_trial = ThreadsTrial(self.torch, cmd["loader"], resume["step_threads"], resume["steps"])
        except Exception as exc:  # the user's job must go on whatever the pause met
            self.client.send({"k": "tune_error", "error": f"{type(exc).__name__}: {exc}", "t": clock()})
            self.client.flush()
        finally:
            self.active = True
            for info in self.infos.values():
                self._drop_prev(info)  # the pause is not a step

    def at_exit(self) -> None:
        if self.hello:
            if self.torch is not None and self.pending:
                self.resolve(wait=True)
            self.send_rows(clock(), final=True)
            self.client.send({"k": "end", "t": clock()})
            self.client.flush()

    def exception(self, kind, value, tb) -> None:
        """An uncaught exception: what and where, so the run folder can say why the job ended early."""
        if self.hello:
            frames = [(f.filename, f.lineno) for f in traceback.extract_tb(tb)] if tb is not None else []
            # the user's frame, type and whole message (sites.exception_facts), never pipeprof's hook frame
            facts = sites.exception_facts(kind.__name__, str(value), frames)
            self.client.send({"k": "exc", "t": clock(), **facts})
            self.send_rows(clock(), final=True)
            self.client.flush()


def _next(self):
    st = _STATE
    info = st.infos.get(getattr(self, "_pipeprof_label", None)) if st.active else None
    if info is None:
        return st.orig["next"](self)
    st.call(self, info, clock())
    t_call = clock()  # after the boundary's work (and a pause): neither is the loader's
    batch = st.orig["next"](self)
    st.returned(info, t_call, clock(), batch)
    return batch


def _iter_init(self, loader, *args, **kwargs):
    _STATE.orig["iter_init"](self, loader, *args, **kwargs)
    label = getattr(loader, "_pipeprof_label", None)
    if label is not None and _STATE.active:
        self._pipeprof_label = label


def _loader_init(self, *args, **kwargs):
    st = _STATE
    st.orig["loader_init"](self, *args, **kwargs)
    if st.active and getattr(self, "_pipeprof_label", None) is None and not st.in_worker():
        try:
            st.built(self, args, kwargs)
        except Exception:  # noqa: BLE001 - recording must never break the user's loader
            pass


def install() -> None:
    """Set up the hook in this process when ``pipeprof watch`` started it (its socket in the environment)."""
    global _STATE
    path = os.environ.get(channel.ENV_SOCKET)
    if not path or _STATE is not None:
        return
    _STATE = Watch(channel.Client(path))
    if TARGET in sys.modules:
        _STATE.patch(sys.modules[TARGET])
    else:
        sys.meta_path.insert(0, _PostImport(_STATE.patch))
    atexit.register(_STATE.at_exit)
    previous = sys.excepthook

    def excepthook(kind, value, tb):
        try:
            _STATE.exception(kind, value, tb)
        finally:
            previous(kind, value, tb)

    sys.excepthook = excepthook
