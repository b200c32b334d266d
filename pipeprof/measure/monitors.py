"""Background sampler: a timeline of CPU, process, disk and GPU load.

A ``Monitor`` runs one daemon thread that takes a row every ``1/hz`` seconds.
Rows carry ``t_s`` from ``time.perf_counter()`` (the clock the rest of
pipeprof stamps batches with) plus the current ``trial_id``/``phase``, so a
trial's measured windows can be cut out of the timeline afterwards
(:func:`summarize`).

Design choices, and why:

* **No process-list scans in the loop.**  ``psutil.process_iter`` walks all
  of ``/proc`` and NVML process queries take the driver lock that the training
  process also needs; both distort what is being measured.  Worker PIDs are
  handed in explicitly with :meth:`Monitor.track_workers`.
* **Only cheap NVML calls** (utilisation, memory, temperature, power, SM
  clock, clock-event reasons); each is a few microseconds.  No NVML → GPU
  columns are simply absent and :attr:`Monitor.gpu_error` says why.
* **The monitor never takes the run down.**  A field the board does not
  report is None; any other NVML failure mid-run (a lost GPU, a driver
  reload) is logged once and recorded in :attr:`Monitor.gpu_error`, the GPU
  columns are empty from then on, and sampling and measuring go on.  A
  sample that fails in any other way is skipped, also said once.
* **Absolute deadlines** (``next += period``) so the rate does not drift by
  the cost of sampling; missed slots are skipped rather than burst.
  ``threading.Event.wait`` makes :meth:`Monitor.stop` prompt.
* **The sampler measures itself**: ``sample_cost_ms`` per row is the time
  spent collecting it, so the monitor's overhead is in the data.
* **Noise is measured, not guessed**: each row has the hypervisor's CPU steal
  and ``foreign_cores``, CPU used on the run's CPUs (:attr:`Monitor.cpus`) by
  processes outside the run, so a trial's spread can be traced to its cause.

Units: ``*_pct`` percent (process CPU may exceed 100: one core = 100;
``cpu_steal_pct`` is a share of all CPUs' time), ``*_cores`` CPU cores busy
(1.0 = one core fully used), ``*_cpus``/``usable_cores`` a count of CPUs,
``*_mb`` memory in MiB (2**20 bytes), ``*_mb_s`` data rates in MB/s (10**6 bytes, as the
storage trials' ``read_mb_s``), ``*_w`` watts, ``*_mhz`` MHz,
``*_c`` degrees Celsius, ``*_ms`` milliseconds, ``t_s`` seconds.
"""

from __future__ import annotations

import bisect
import logging
import math
import os
import threading
import time
from typing import Optional

import pandas as pd
import psutil

from pipeprof.stats import mean_ci95

_MIB = 2**20
log = logging.getLogger(__name__)
# NVML errors that mean "this board (or driver) does not report that field", not a failure of NVML
_FIELD_NOT_REPORTED = ("NVMLError_NotSupported", "NVMLError_NoPermission", "NVMLError_FunctionNotFound")
BASE_COLUMNS = [
    "t_s",
    "trial_id",
    "phase",
    "sample_cost_ms",
    "cpu_util_pct",
    "main_cpu_pct",
    "main_rss_mb",
    "workers_cpu_pct",
    "workers_rss_mb",
    "n_workers_alive",
    "disk_read_mb_s",
    "cpu_steal_pct",
    "usable_cpus",
    "usable_busy_cores",
    "run_cores",
    "foreign_cores",
]
GPU_FIELDS = ["util_pct", "mem_used_mb", "temp_c", "power_w", "sm_clock_mhz", "throttle_reasons"]

# NVML clock-event ("throttle") reason bits counted as throttling by summarize():
#   0x04 SW power cap, 0x08 HW slowdown, 0x10 sync boost, 0x20 SW thermal,
#   0x40 HW thermal, 0x80 HW power brake.
# Ignored: 0x01 GPU idle, 0x02 applications/user-defined clocks setting,
#   0x100 display clock setting -- these are not a performance limit on load.
THROTTLE_MASK = 0x04 | 0x08 | 0x10 | 0x20 | 0x40 | 0x80


# --------------------------------------------------------------------------- #
# GPU sampling (NVML)
# --------------------------------------------------------------------------- #
class _Nvml:
    """NVML handles plus a cheap per-device sample; init errors are kept, not raised."""

    def __init__(self):
        self.nv = None
        self.handles: list = []
        self.error: str | None = None
        try:
            import pynvml as nv

            nv.nvmlInit()
        except Exception as exc:  # ImportError or pynvml.NVMLError (no driver)
            self.error = f"{type(exc).__name__}: {exc}"
            return
        self.nv = nv
        try:
            self.handles = [nv.nvmlDeviceGetHandleByIndex(i) for i in range(nv.nvmlDeviceGetCount())]
        except nv.NVMLError as exc:
            self.error = f"{type(exc).__name__}: {exc}"
        self._reasons = getattr(nv, "nvmlDeviceGetCurrentClocksEventReasons", None) or getattr(
            nv, "nvmlDeviceGetCurrentClocksThrottleReasons", None
        )

    def _call(self, fn, *args):
        try:
            return fn(*args)
        except Exception as exc:
            if type(exc).__name__ in _FIELD_NOT_REPORTED:  # a field this board does not report
                return None
            raise  # NVML itself failed: Monitor stops sampling the GPUs

    @staticmethod
    def blank(row: dict, count: int) -> None:
        """The GPU columns of ``count`` devices, empty."""
        for i in range(count):
            row.update({f"gpu{i}_{f}": None for f in GPU_FIELDS})

    def sample(self, row: dict) -> None:
        nv = self.nv
        for i, h in enumerate(self.handles):
            util = self._call(nv.nvmlDeviceGetUtilizationRates, h)
            mem = self._call(nv.nvmlDeviceGetMemoryInfo, h)
            power = self._call(nv.nvmlDeviceGetPowerUsage, h)
            row[f"gpu{i}_util_pct"] = None if util is None else util.gpu
            row[f"gpu{i}_mem_used_mb"] = None if mem is None else mem.used / _MIB
            row[f"gpu{i}_temp_c"] = self._call(nv.nvmlDeviceGetTemperature, h, nv.NVML_TEMPERATURE_GPU)
            row[f"gpu{i}_power_w"] = None if power is None else power / 1000.0
            row[f"gpu{i}_sm_clock_mhz"] = self._call(nv.nvmlDeviceGetClockInfo, h, nv.NVML_CLOCK_SM)
            row[f"gpu{i}_throttle_reasons"] = self._call(self._reasons, h) if self._reasons else None

    def shutdown(self) -> None:
        if self.nv is not None:
            try:
                self.nv.nvmlShutdown()
            except Exception:  # noqa: BLE001 - a failed NVML may not shut down either; nothing is left to do
                pass
            self.nv, self.handles = None, []


# --------------------------------------------------------------------------- #
# process sampling
# --------------------------------------------------------------------------- #
def _proc_sample(proc: psutil.Process) -> tuple[float, float] | None:
    """(cpu %, RSS MiB) of one process, or None if it is gone or a zombie."""
    try:
        with proc.oneshot():
            if proc.status() == psutil.STATUS_ZOMBIE:
                return None
            return proc.cpu_percent(), proc.memory_info().rss / _MIB
    except (psutil.NoSuchProcess, psutil.AccessDenied):
        return None


def pss_mb(pid: int) -> float | None:
    """Proportional set size of one process (shared pages split among their users), MiB.

    Summed over the main process and its workers this is the RAM they really
    take together, unlike an RSS sum. ``smaps_rollup`` walks the page tables
    (milliseconds for a big process), so it is sampled at a lower rate.
    """
    try:
        with open(f"/proc/{pid}/smaps_rollup") as f:
            for line in f:
                if line.startswith("Pss:"):
                    return int(line.split()[1]) / 1024
    except (OSError, ValueError, IndexError):
        return None
    return None


def total_pss_mb(pids) -> float | None:
    """Sum of PSS over ``pids`` (None if the first, the main process, cannot be read)."""
    parts = [pss_mb(p) for p in pids]
    return None if not parts or parts[0] is None else sum(x for x in parts if x is not None)


def _new_proc(pid: int) -> psutil.Process | None:
    try:
        proc = psutil.Process(int(pid))
        proc.cpu_percent()  # prime: the next call reports usage since now
        return proc
    except (psutil.NoSuchProcess, psutil.AccessDenied, ValueError):
        return None


def _run_cpus() -> list[int]:
    """The CPUs this process may run on (its affinity), or all CPUs where that is unknown."""
    try:
        return sorted(os.sched_getaffinity(0))
    except (AttributeError, OSError):  # no sched_getaffinity (macOS, Windows)
        return list(range(psutil.cpu_count() or 1))


class Monitor:
    """Background sampler; see the module docstring.

    ``workers_rss_mb`` is the plain sum of the workers' RSS: forked DataLoader
    workers share copy-on-write pages with the main process, so this
    double-counts shared memory (an upper bound).  The honest total, PSS, costs
    tens of milliseconds per process to read, so trials take it once, after their
    timed windows (:func:`total_pss_mb`), rather than this thread at 10 Hz.

    :attr:`cpus` (set by :meth:`start`) are the CPUs the process may run on;
    DataLoader workers inherit that affinity, so the run lives on exactly these.
    Per row, ``usable_busy_cores`` is how many of them were busy (whoever used
    them), ``run_cores`` what the main process and tracked workers used, and
    ``foreign_cores`` the rest: load from processes outside the run.
    """

    def __init__(self, hz: float = 10.0, gpu: bool = True, clock=time.perf_counter):
        if not hz > 0:
            raise ValueError(f"hz must be > 0, got {hz}")
        self.hz = float(hz)
        self._period = 1.0 / self.hz
        self._want_gpu = gpu
        self._clock = clock
        self._rows: list[dict] = []
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._trial: tuple[str | None, str | None] = (None, None)
        self._workers: dict[int, psutil.Process] = {}
        self._main = psutil.Process()
        self._nvml: _Nvml | None = None
        self._gpu_error: str | None = None if gpu else "disabled"
        self._gpu_count = 0
        self._disk_prev: tuple[float, int] | None = None
        self._paused = False
        self._sample_failed = False  # said once: a sample raised and was skipped
        self.cpus: list[int] = _run_cpus()  # re-read by start()

    # -- public API --------------------------------------------------------- #
    @property
    def gpu_error(self) -> str | None:
        return self._gpu_error

    @property
    def gpu_count(self) -> int:
        """GPUs sampled by the last start() (kept after stop())."""
        return self._gpu_count

    def start(self) -> "Monitor":
        if self._thread is not None and self._thread.is_alive():
            return self
        self.cpus = _run_cpus()
        if self._want_gpu:
            self._nvml = _Nvml()
            self._gpu_error = self._nvml.error
            self._gpu_count = len(self._nvml.handles)
        self._stop.clear()
        self._thread = threading.Thread(target=self._run, name="pipeprof-monitor", daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
            self._thread = None
        if self._nvml is not None:
            self._nvml.shutdown()

    def __enter__(self) -> "Monitor":
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()

    def pause(self, paused: bool) -> None:
        """Stop (True) or resume (False) taking samples; the thread keeps its grid. For measuring
        what sampling itself costs the run (the ``monitor_overhead`` trial)."""
        self._paused = paused

    def set_trial(self, trial_id: str | None, phase: str | None = None) -> None:
        self._trial = (trial_id, phase)  # one tuple: the sampler never sees a torn pair

    def track_workers(self, pids) -> None:
        """Replace the tracked worker set (``[]`` clears); unknown PIDs are ignored."""
        with self._lock:
            old = self._workers
            new = {}
            for pid in pids:
                proc = old.get(int(pid)) or _new_proc(pid)
                if proc is not None:
                    new[int(pid)] = proc
            self._workers = new

    def timeline(self, since: Optional[float] = None) -> pd.DataFrame:
        """The rows so far (``since``: only those at or after that ``t_s``, found by bisection, so a live view
        every few seconds does not copy the whole history each time)."""
        with self._lock:
            start = 0 if since is None else bisect.bisect_left(self._rows, since, key=lambda r: r["t_s"])
            rows = self._rows[start:]
        if not rows:
            return pd.DataFrame(columns=BASE_COLUMNS)
        return pd.DataFrame(rows)

    # -- sampling ----------------------------------------------------------- #
    def _prime(self) -> None:
        """First readings; psutil's CPU percentages are 'since the previous call'."""
        psutil.cpu_percent(interval=None)
        psutil.cpu_percent(interval=None, percpu=True)
        psutil.cpu_times_percent(interval=None)  # its own 'last' state, separate from cpu_percent's
        self._main.cpu_percent()
        self._disk_prev = self._disk_read_bytes()

    def _run(self) -> None:
        self._prime()
        deadline = self._clock()
        while True:
            deadline += self._period
            delay = deadline - self._clock()
            if delay < 0:  # fell behind: skip the missed slots, keep the grid
                deadline += self._period * math.ceil(-delay / self._period)
                delay = deadline - self._clock()
            if self._stop.wait(max(0.0, delay)):
                return
            if not self._paused:
                self._append_sample()

    def _append_sample(self) -> None:
        try:
            row = self._sample()
        except Exception as exc:  # never let a sample end the thread (and the timeline): skip it, say so once
            if not self._sample_failed:
                log.warning("pipeprof monitor: a sample failed and was skipped (%s: %s)", type(exc).__name__, exc)
            self._sample_failed = True
            return
        self._append(row)

    def _append(self, row: dict) -> None:
        with self._lock:
            self._rows.append(row)

    def _sample(self) -> dict:
        t0 = time.perf_counter()
        # Read the caller-set state *before* stamping t_s: a row stamped before a
        # set_trial()/track_workers() call then never reflects that call.
        trial_id, phase = self._trial
        with self._lock:
            workers = dict(self._workers)
        row = {"t_s": self._clock(), "trial_id": trial_id, "phase": phase, "sample_cost_ms": None}
        self._sample_cpu(row)
        self._sample_processes(row, workers)
        self._foreign_load(row)
        row["disk_read_mb_s"] = self._disk_rate()
        self._sample_gpus(row)
        row["sample_cost_ms"] = (time.perf_counter() - t0) * 1000.0
        return row

    def _sample_gpus(self, row: dict) -> None:
        if self._nvml is not None and self._nvml.handles:
            try:
                self._nvml.sample(row)
                return
            except Exception as exc:  # NVML failed mid-run: no GPU figures from now on, the run goes on
                self._gpu_error = (
                    f"NVML failed mid-run at t={row['t_s']:.1f} s (trial {row['trial_id']}): "
                    f"{type(exc).__name__}: {exc}; GPU columns are empty from then on"
                )
                log.warning("pipeprof monitor: %s", self._gpu_error)
                self._nvml.shutdown()
        if self._gpu_failed_mid_run:
            _Nvml.blank(row, self._gpu_count)

    @property
    def _gpu_failed_mid_run(self) -> bool:
        return self._gpu_count > 0 and self._nvml is not None and not self._nvml.handles

    def _sample_cpu(self, row: dict) -> None:
        row["cpu_util_pct"] = psutil.cpu_percent(interval=None)
        percpu = psutil.cpu_percent(interval=None, percpu=True)
        for i, pct in enumerate(percpu):
            row[f"cpu{i}_util_pct"] = pct
        # Stolen by the hypervisor since the previous sample, as a share of all CPUs' time
        # (Linux only: other platforms have no steal field).
        row["cpu_steal_pct"] = getattr(psutil.cpu_times_percent(interval=None), "steal", None)
        cpus = self.cpus
        row["usable_cpus"] = len(cpus)
        row["usable_busy_cores"] = sum(percpu[i] for i in cpus if i < len(percpu)) / 100.0

    @staticmethod
    def _foreign_load(row: dict) -> None:
        main, workers = row.get("main_cpu_pct"), row.get("workers_cpu_pct")
        run = None if main is None else (main + (workers or 0.0)) / 100.0
        row["run_cores"] = run
        # The per-process cpu_percent() deltas and the per-CPU ones are taken at slightly
        # different instants (and tick-quantised), so busy - run can come out a little
        # negative when nothing else runs: clip those to 0.
        busy = row.get("usable_busy_cores")
        row["foreign_cores"] = None if run is None or busy is None else max(0.0, busy - run)

    def _sample_processes(self, row: dict, workers: dict[int, psutil.Process]) -> None:
        main = _proc_sample(self._main)
        row["main_cpu_pct"], row["main_rss_mb"] = main if main else (None, None)
        alive = {pid: s for pid, p in workers.items() if (s := _proc_sample(p)) is not None}
        if len(alive) != len(workers):
            self._drop_dead(set(workers) - set(alive))
        row["workers_cpu_pct"] = sum(s[0] for s in alive.values())
        row["workers_rss_mb"] = sum(s[1] for s in alive.values())
        row["n_workers_alive"] = len(alive)

    def _drop_dead(self, pids: set[int]) -> None:
        with self._lock:
            self._workers = {pid: p for pid, p in self._workers.items() if pid not in pids}

    @staticmethod
    def _disk_read_bytes() -> tuple[float, int] | None:
        try:
            io = psutil.disk_io_counters()
        except Exception:  # noqa: BLE001 - no /proc/diskstats in some containers
            return None
        return None if io is None else (time.perf_counter(), io.read_bytes)

    def _disk_rate(self) -> float | None:
        prev, cur = self._disk_prev, self._disk_read_bytes()
        self._disk_prev = cur
        if prev is None or cur is None or cur[0] <= prev[0]:
            return None
        return (cur[1] - prev[1]) / 1e6 / (cur[0] - prev[0])


# --------------------------------------------------------------------------- #
# summary
# --------------------------------------------------------------------------- #
def gpu_mean(df: pd.DataFrame, field: str) -> float | None:
    """Mean of one GPU field (e.g. ``util_pct``) over every GPU and row of ``df``; None without NVML figures."""
    return _stat(_values(df, _gpu_cols(df, field)), "mean")


def _gpu_cols(df: pd.DataFrame, field: str) -> list[str]:
    return [
        c for c in df.columns if c.startswith("gpu") and c.endswith("_" + field) and c[3 : -len(field) - 1].isdigit()
    ]


def _values(df: pd.DataFrame, cols: list[str]) -> pd.Series:
    """All non-missing numeric values of ``cols`` as one flat Series."""
    if not cols or df.empty:
        return pd.Series(dtype=float)
    flat = pd.concat([pd.to_numeric(df[c], errors="coerce") for c in cols], ignore_index=True)
    return flat.dropna()


INTERVALS = ("usable_busy_cores", "workers_cpu_pct", "main_cpu_pct")  # the verdict's figures: with intervals
BLOCKS = 5  # consecutive blocks of a trial's samples: 10 Hz samples are correlated, block means much less


def block_interval(df: pd.DataFrame, name: str) -> dict:
    """``{name}_ci95_low/high``: the 95% interval of the mean of ``name`` over the trial's windows, from
    the means of BLOCKS consecutive blocks of samples (None with fewer than two samples per block)."""
    values = pd.to_numeric(df[name], errors="coerce").dropna().to_numpy() if name in df.columns else []
    size = len(values) // BLOCKS
    lo, hi = (
        mean_ci95([float(values[i * size : (i + 1) * size].mean()) for i in range(BLOCKS)])
        if size >= 2
        else (None, None)
    )
    return {f"{name}_ci95_low": lo, f"{name}_ci95_high": hi}


def _stat(values: pd.Series, how: str) -> float | None:
    if values.empty:
        return None
    out = float(values.mean() if how == "mean" else values.max())
    return out if math.isfinite(out) else None


def _throttled_frac(df: pd.DataFrame) -> float | None:
    cols = _gpu_cols(df, "throttle_reasons")
    if not cols or df.empty:
        return None
    bits = df[cols].apply(pd.to_numeric, errors="coerce")
    known = bits.notna().any(axis=1)
    if not known.any():
        return None
    throttled = bits.fillna(0).astype("int64").apply(lambda s: (s & THROTTLE_MASK) != 0).any(axis=1)
    return float(throttled[known].mean())


def _select(timeline: pd.DataFrame, trial_id, t_start, t_end) -> pd.DataFrame:
    if timeline.empty or "trial_id" not in timeline.columns:
        return timeline.iloc[0:0]
    df = timeline[timeline["trial_id"] == trial_id]
    if t_start is not None:
        df = df[df["t_s"] >= t_start]
    if t_end is not None:
        df = df[df["t_s"] <= t_end]
    return df


def windows_cpu(timeline: pd.DataFrame, trial_id: str, spans) -> dict:
    """The training process's and its workers' mean CPU (percent of a core) over the monitor's rows inside
    ``spans`` (``(t_start, t_end)`` on the monitor's clock): one side of a paired trial, whose windows alternate
    with the other side's. None for a figure no row inside them has."""
    df = _select(timeline, trial_id, None, None)
    inside = pd.Series(False, index=df.index)
    for a, b in spans:
        inside |= df["t_s"].between(a, b)
    rows = df[inside]
    return {
        k: _stat(_values(rows, [k] if k in rows.columns else []), "mean") for k in ("workers_cpu_pct", "main_cpu_pct")
    }


def _total_rss_max(df: pd.DataFrame) -> float | None:
    """Peak of main + workers RSS at the same instant (an upper bound: shared pages count twice)."""
    if df.empty or "main_rss_mb" not in df:
        return None
    total = df["main_rss_mb"].astype(float) + df.get("workers_rss_mb", 0).fillna(0).astype(float)
    return _stat(total.dropna(), "max")


def _usable_cores(df: pd.DataFrame) -> int | None:
    """CPUs the rows were taken on (the largest count if a monitor was restarted with another affinity)."""
    n = _stat(_values(df, [c for c in ["usable_cpus"] if c in df.columns]), "max")
    return None if n is None else int(n)


def summarize(timeline: pd.DataFrame, trial_id: str, t_start: float | None = None, t_end: float | None = None) -> dict:
    """Aggregate one trial's rows (optionally within ``[t_start, t_end]``).

    GPU means/maxima pool all devices and rows (``gpu_mem_used_mb_max`` is the
    peak of any single device).  ``gpu_throttled_frac`` is the fraction of
    rows (with known reasons) where any device has a :data:`THROTTLE_MASK`
    bit set.  Missing data gives ``None``, never NaN, so the dict is JSON-safe.
    Memory peaks cover the whole trial, warm-up included: RAM must fit those too.
    The noise columns (``cpu_steal_pct_mean``, ``foreign_cores_mean``, and
    ``run_cores_mean``/``usable_busy_cores_mean`` out of ``usable_cores``) say
    why a trial's windows vary on a shared machine.
    """
    df = _select(timeline, trial_id, t_start, t_end)
    whole = _select(timeline, trial_id, None, None)

    def col(name, how):
        return _stat(_values(df, [name] if name in df.columns else []), how)

    def gpu(field, how):
        return _stat(_values(df, _gpu_cols(df, field)), how)

    return {
        "gpu_util_pct_mean": gpu("util_pct", "mean"),
        "gpu_mem_used_mb_max": gpu("mem_used_mb", "max"),
        "gpu_power_w_mean": gpu("power_w", "mean"),
        "gpu_sm_clock_mhz_mean": gpu("sm_clock_mhz", "mean"),
        "gpu_throttled_frac": _throttled_frac(df),
        "cpu_util_pct_mean": col("cpu_util_pct", "mean"),
        "workers_cpu_pct_mean": col("workers_cpu_pct", "mean"),
        "main_cpu_pct_mean": col("main_cpu_pct", "mean"),
        "main_rss_mb_max": _stat(_values(whole, [c for c in ["main_rss_mb"] if c in whole]), "max"),
        "workers_rss_mb_max": _stat(_values(whole, [c for c in ["workers_rss_mb"] if c in whole]), "max"),
        "rss_mb_max": _total_rss_max(whole),
        "disk_read_mb_s_mean": col("disk_read_mb_s", "mean"),
        "sample_cost_ms_mean": col("sample_cost_ms", "mean"),
        "cpu_steal_pct_mean": col("cpu_steal_pct", "mean"),
        "foreign_cores_mean": col("foreign_cores", "mean"),
        "run_cores_mean": col("run_cores", "mean"),
        "usable_busy_cores_mean": col("usable_busy_cores", "mean"),
        **{k: v for c in INTERVALS for k, v in block_interval(df, c).items()},
        "usable_cores": _usable_cores(df),
        "monitor_samples": int(len(df)),
    }
