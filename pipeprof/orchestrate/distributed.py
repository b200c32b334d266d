"""N-GPU trials: one process per GPU started by torch's own launcher, DDP, a loader per rank.

The sweep's process stays the parent. For an N-GPU trial (``gpus = N > 1``) it writes a job file
(the resolved config, the dataset folder), starts ``torch.distributed.run`` (torchrun: its elastic
agent, its rendezvous) with ``N / nnodes`` processes on this machine, hands the job the trial (a
file) and reads back one result file per local rank. The job stays for the next trials of its GPU
count and link setting (:class:`Job`, :func:`kept_jobs`): a job's start (torchrun, each rank's imports,
the rendezvous) costs several times a later trial (docs/measured.md). Each rank
(:func:`rank_main`):

- takes its slice of the usable CPUs (``os.sched_setaffinity``, recorded), so one rank's
  loader workers do not run on another's cores;
- joins the process group (NCCL on GPUs, gloo on CPUs) and rebuilds the trial's context from
  the config: the same pipeline, a ``DistributedSampler`` shard of the samples, the model in
  ``DistributedDataParallel``, ``num_workers`` workers of its own (the count is per rank);
- measures each trial handed to it with the sweep's own trial code, its context rebuilt per trial.
  The step kinds read rank 0's clock (broadcast over a gloo group at every read): DDP steps run
  in lockstep, and ranks deciding on one clock end their warm-up and windows after the same
  steps, so none is left waiting in an all-reduce.
  The loader-only kind (``cpu_pipeline``: every rank's loader at once on the shared cores)
  needs no lockstep: each rank times itself after a common start barrier.

NVLink multicast stays off (``NCCL_NVLS_ENABLE=0``) in every process pipeprof starts; with
``p2p`` off ``NCCL_P2P_DISABLE=1`` sends the all-reduce through host memory instead of the
direct link. GPU clocks and settings are never touched.

Several machines: every node runs ``pipeprof run`` with the same config and its
``distributed.node_rank``; each job's torchrun meets the others' at ``rdzv_endpoint`` (the same grid
of trials on every node: the ranks check that they were handed the same trial). A node
records the ranks it ran; ``pipeprof merge`` joins the nodes' folders (see ``merge``).
"""

from __future__ import annotations

import contextlib
import gc
import json
import os
import re
import signal
import socket
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict
from pathlib import Path
from typing import Callable, Iterator, Optional

import psutil
import torch

from pipeprof.schema import TrialKind
from pipeprof.trials import TrialContext, TrialSpec, run_trial
from pipeprof.trials.columns import combine_ranks
from pipeprof.trials.heap import release, trial_heap
from pipeprof.trials.watchdog import TrialTimeout

JOB_FILE, TRIAL_FILE, RANK_FILE, STOP_FILE = "job.json", "trial-{k}.json", "rank-{k}-{rank}.json", "stop"
LAUNCH_MARGIN_S = 180.0  # torchrun, imports, model build and rendezvous, on top of each trial's own cap
POLL_S = 0.05  # how often the parent looks for the ranks' results, and a rank for the next trial
TRACK_S = 0.5  # how often the parent tells the monitor the job's processes (they change as loaders start)
CLOSE_S = 30.0  # how long the ranks of a job asked to stop may take to leave their group before it is killed


def split_cpus(cpus: list[int], parts: int) -> list[list[int]]:
    """``cpus`` cut into ``parts`` contiguous slices as even as they come (the first get one more)."""
    size, extra = divmod(len(cpus), parts)
    out, start = [], 0
    for i in range(parts):
        end = start + size + (i < extra)
        out.append(cpus[start:end] or cpus[i % len(cpus) : i % len(cpus) + 1])  # fewer CPUs than ranks: share
        start = end
    return out


def launch_command(spec: TrialSpec, job_dir: Path, dist_cfg: dict) -> list[str]:
    """The torchrun command line of one trial on this node."""
    nnodes = dist_cfg["nnodes"]
    local = spec.gpus // nnodes
    cmd = [sys.executable, "-m", "torch.distributed.run", f"--nproc-per-node={local}", f"--nnodes={nnodes}"]
    if nnodes == 1:
        cmd.append("--standalone")  # a rendezvous on a free local port
    else:
        cmd += [
            f"--node-rank={dist_cfg['node_rank']}",
            "--rdzv-backend=c10d",
            f"--rdzv-endpoint={dist_cfg['rdzv_endpoint']}",
            f"--rdzv-id={rdzv_id(spec)}",
        ]
    return cmd + ["-m", "pipeprof.orchestrate.distributed", str(job_dir / JOB_FILE)]


def rdzv_id(spec: TrialSpec) -> str:
    """The same on every node (the trial's id), and usable as a folder name (torchrun makes one of it)."""
    return "pipeprof-" + re.sub(r"[^A-Za-z0-9_.-]", "_", spec.trial_id)


def launch_env(spec: TrialSpec) -> dict:
    env = os.environ | {"NCCL_NVLS_ENABLE": "0", "OMP_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1"}
    if spec.p2p is False:
        env["NCCL_P2P_DISABLE"] = "1"
    else:
        env.pop("NCCL_P2P_DISABLE", None)
    return env


def job_key(spec: TrialSpec) -> tuple[int, bool]:
    """What a job is started with: its GPU count and its link setting (p2p None, the loaders-only kind that
    sends nothing between GPUs, runs with the link on, as NCCL does unless told otherwise)."""
    return spec.gpus, spec.p2p is not False


def joins(spec: TrialSpec, key: tuple[int, bool]) -> bool:
    """Whether ``spec`` can run in a live job of ``key``: the same GPU count, and the same link setting
    unless the trial sends nothing over the link."""
    return spec.gpus == key[0] and (spec.p2p is None or spec.p2p == key[1])


class Job:
    """One torchrun job on this node, its ranks running trial after trial (``rank_main``).

    Each trial is a file in the job's folder (``trial-K.json``), each rank's result another
    (``rank-K-R.json``); a ``stop`` file ends the job. The job starts with its first trial's settings
    (GPU count, link, rendezvous id: the same trial on every node) and ends when :meth:`close` is
    called, or with the first trial that fails, overruns or is interrupted (its group is killed)."""

    def __init__(self, ctx: TrialContext, spec: TrialSpec):
        self.key, self.trials = job_key(spec), 0
        self.local = spec.gpus // ctx.job["config"]["distributed"]["nnodes"]
        self.tmp = tempfile.TemporaryDirectory(prefix="pipeprof-job-")
        self.dir = Path(self.tmp.name)
        me = psutil.Process()
        (self.dir / JOB_FILE).write_text(json.dumps(ctx.job | {"parent": {"pid": me.pid, "started": me.create_time()}}))
        self.proc = subprocess.Popen(
            launch_command(spec, self.dir, ctx.job["config"]["distributed"]),
            env=launch_env(spec),
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            start_new_session=True,
        )  # its own group: an overrun kills every rank
        self.reader = _Reader(self.proc)

    def run(self, ctx: TrialContext, spec: TrialSpec) -> dict:
        """The trial in every local rank; the job's row (``ranks`` holds each rank's). Bounded in time (the
        trial's cap plus :data:`LAUNCH_MARGIN_S`); the job's processes are followed by the monitor meanwhile."""
        k, self.trials = self.trials, self.trials + 1
        _write_atomic(self.dir / TRIAL_FILE.format(k=k), json.dumps(asdict(spec)))
        ctx.monitor.set_trial(spec.trial_id, "job")  # our samples (the GPUs, the machine) are the job's
        try:
            ranks = self._follow(ctx, k, ctx.measure.max_trial_s + LAUNCH_MARGIN_S)
        except BaseException:
            self.kill()
            raise
        failed = [r for r in ranks if r.get("status") != "ok"]
        if failed or len(ranks) < self.local:
            self.close()  # a failed rank ends its job: the next trial starts a new one
            if failed:
                raise RuntimeError(f"rank {failed[0]['rank']}: {failed[0].get('error')}")
            tail = "\n".join(self.reader.text().splitlines()[-15:])
            raise RuntimeError(
                f"torchrun exited with {self.proc.returncode} ({len(ranks)} of {self.local} local "
                f"ranks reported):\n{tail}"
            )
        return combine_ranks(ranks, spec.gpus) | {"ranks": ranks}

    def alive(self) -> bool:
        return self.proc.poll() is None

    def _report_files(self, k: int) -> list[Path]:
        return sorted(self.dir.glob(RANK_FILE.format(k=k, rank="*")))

    def _follow(self, ctx: TrialContext, k: int, limit_s: float) -> list[dict]:
        """Trial ``k``'s rank results, once every local rank has written its own or the job has ended.
        Meanwhile the monitor is told the job's processes (ranks and their workers). An overrun raises
        :class:`TrialTimeout`; a signal to the sweep (Ctrl-C, SIGTERM) raises here: the caller kills the
        group (started in a session of its own, the ranks would not get the terminal's signal)."""
        t0 = time.monotonic()
        tracked = t0 - TRACK_S  # the first poll tells the monitor
        try:
            while self.alive():
                if len(self._report_files(k)) >= self.local:  # read once all are there, not at every poll
                    break
                now = time.monotonic()
                if now - t0 > limit_s:
                    raise TrialTimeout(f"the N-GPU job ran past {limit_s:.0f} s and was killed with its ranks")
                if now - tracked >= TRACK_S:  # a walk of /proc: not at every poll, beside the ranks being timed
                    tracked = now
                    with contextlib.suppress(psutil.NoSuchProcess):
                        ctx.monitor.track_workers(
                            [c.pid for c in psutil.Process(self.proc.pid).children(recursive=True)]
                        )
                with contextlib.suppress(subprocess.TimeoutExpired):
                    self.proc.wait(timeout=POLL_S)  # back as soon as the job ends
            # every local rank's result, or the job ended: what its ranks wrote before
            return [json.loads(f.read_text()) for f in self._report_files(k)]
        finally:
            ctx.monitor.track_workers([])

    def close(self) -> None:
        """Ask the ranks to end (the ``stop`` file), wait :data:`CLOSE_S` for them, then kill the group."""
        if self.alive():
            _write_atomic(self.dir / STOP_FILE, "")
            with contextlib.suppress(subprocess.TimeoutExpired):
                self.proc.wait(timeout=CLOSE_S)
        self.kill()

    def kill(self) -> None:
        """SIGKILL to the job's group (torchrun, its ranks and their loader workers), then its folder."""
        if self.alive():
            _kill_group(self.proc)
        self.reader.text()
        self.tmp.cleanup()


_live: Optional[Job] = None  # the job kept for the next trials of its kind (inside ``kept_jobs``)
_keeping = False


@contextlib.contextmanager
def kept_jobs():
    """Within the block, consecutive N-GPU trials of one GPU count and link setting share a torchrun job
    (its start, torchrun, the ranks' imports and the rendezvous, is most of a job's first trial); the
    job ends before a trial of another kind (:func:`close_job`) and at the block's end. Outside it, each
    N-GPU trial starts and ends a job of its own."""
    global _keeping
    _keeping = True
    try:
        yield
    finally:
        _keeping = False
        close_job()


def close_job() -> None:
    """End the kept job, if any (a one-GPU trial runs next: the job's rank 0 holds this process's GPU)."""
    global _live
    job, _live = _live, None
    if job is not None:
        job.close()


def run_job(ctx: TrialContext, spec: TrialSpec) -> dict:
    """One N-GPU trial on this node, in the kept job where it can join it, else in a new one."""
    global _live
    if _live is not None and not (_live.alive() and joins(spec, _live.key)):
        close_job()
    job = _live or Job(ctx, spec)
    _live = None  # a trial that raises leaves no job kept (run() ended it)
    row = job.run(ctx, spec)
    if _keeping and job.alive():
        _live = job
    else:
        job.close()
    return row


def _write_atomic(path: Path, text: str) -> None:
    """Readers (the ranks, the parent) see the whole file or none. Not ``results``' writer: that module is a
    layer above this one, and its fsync is for run folders that must outlive a power cut, not a job's temporary
    folder."""
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(text)
    tmp.replace(path)


def _kill_group(proc: subprocess.Popen) -> None:
    """SIGKILL to the job's process group (torchrun, its ranks and their loader workers), then reap it."""
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except ProcessLookupError:  # the group ended meanwhile
        pass
    proc.wait()


class _Reader:
    """Drains the job's output in a thread, so a chatty job never blocks on a full pipe."""

    def __init__(self, proc: subprocess.Popen):
        import threading

        self.chunks: list[str] = []
        self.thread = threading.Thread(target=lambda: self.chunks.extend(proc.stdout), daemon=True)
        self.thread.start()

    def text(self) -> str:
        self.thread.join(timeout=5)
        return "".join(self.chunks)


# ---- inside a rank -----------------------------------------------------------------------------


def rank_main(job_path: str) -> int:
    """One rank of an N-GPU job (torchrun sets RANK, WORLD_SIZE, LOCAL_RANK, LOCAL_WORLD_SIZE): it joins the
    group once, then runs the trials the parent hands the job (``trial-K.json``), one after another, each
    result in a file of its own (``rank-K-R.json``), until the ``stop`` file, the parent's end, or the first
    trial that fails here (the parent fails that trial with this rank's error; torchrun ends the others)."""
    import torch.distributed as dist

    from pipeprof.config import RunConfig

    folder, job = Path(job_path).parent, json.loads(Path(job_path).read_text())
    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    local, local_world = int(os.environ["LOCAL_RANK"]), int(os.environ["LOCAL_WORLD_SIZE"])
    cpus = split_cpus(job["cpus"], local_world)[local]
    os.sched_setaffinity(0, cpus)
    cfg = RunConfig.model_validate(job["config"])
    cuda = cfg.device == "cuda"
    device = torch.device("cuda", local) if cuda else torch.device("cpu")
    if cuda:
        torch.cuda.set_device(device)
    dist.init_process_group("nccl" if cuda else "gloo", device_id=device if cuda else None)
    here = _RankContext(cfg, job, device, rank, world, len(cpus))
    code = 0
    with trial_heap(collect_first=cuda):  # as the sweep's: each release walks only what its trial made
        for k, spec in enumerate(_handed(folder, job["parent"])):
            row = {
                "rank": rank,
                "local_rank": local,
                "node": socket.gethostname(),
                "cpus": _span(cpus),
                "cores": len(cpus),
                "pid": os.getpid(),
                "job_trial": k,
                "status": "ok",
                "error": None,
            }
            try:
                row |= here.measure(spec)
            except Exception as exc:  # the parent reads it from the rank's file and fails the trial with it
                row |= {"status": "error", "error": f"{type(exc).__name__}: {exc}"[:2000]}
            _write_atomic(folder / RANK_FILE.format(k=k, rank=rank), json.dumps(row, default=str))
            if row["status"] != "ok":
                code = 1
                break
            release(device)  # the trial's model, DDP buckets and loader: before the next trial builds its own
    dist.destroy_process_group()
    return code


def _handed(folder: Path, parent: dict) -> Iterator[TrialSpec]:
    """The trials the parent hands the job, in order, as they come; none once the ``stop`` file is there or
    the parent is gone (killed: the job, in a session of its own, would otherwise wait for ever)."""
    k = 0
    while True:
        handed = folder / TRIAL_FILE.format(k=k)
        if handed.exists():
            yield TrialSpec(**json.loads(handed.read_text()))
            k += 1
        elif (folder / STOP_FILE).exists() or not _running(parent):
            return
        else:
            time.sleep(POLL_S)


def _running(parent: dict) -> bool:
    try:
        return psutil.Process(parent["pid"]).create_time() == parent["started"]
    except psutil.NoSuchProcess:
        return False


class _RankContext:
    """What a rank keeps from trial to trial: the config, the sources and the user's objects (built at the
    first trial, so a failure is that trial's error), and the gloo group of the shared clock."""

    def __init__(self, cfg, job: dict, device: torch.device, rank: int, world: int, cores: int):
        self.cfg, self.job, self.device, self.rank, self.world, self.cores = cfg, job, device, rank, world, cores
        self.built: Optional[dict] = None

    def _build(self) -> dict:
        import torch.distributed as dist

        from pipeprof.data.prepare import build_sources

        cfg = self.cfg
        return {
            "sources": build_sources(cfg, self.job["folder"], lambda *a: None) if self.job["folder"] else {},
            "user": {"user_dataset": _user_dataset(cfg), "user_loader": _user_loader(cfg)},
            "group": dist.new_group(backend="gloo"),
        }

    def measure(self, spec: TrialSpec) -> dict:
        """The trial in this rank, under its own monitor (its CPU: main process and workers)."""
        import torch.distributed as dist

        from pipeprof.measure.monitors import Monitor, summarize

        self.built = self.built or self._build()
        group = self.built["group"]
        ids = [None] * self.world
        dist.all_gather_object(ids, spec.trial_id, group=group)
        if len(set(ids)) > 1:  # the nodes' parents handed this job different trials
            raise RuntimeError(f"the ranks were handed different trials: {sorted(set(ids))}")
        lockstep = spec.kind != TrialKind.CPU_PIPELINE.value
        clock = shared_clock(group) if lockstep else time.perf_counter
        with Monitor(hz=self.cfg.monitor_hz, gpu=False) as monitor:
            ctx = TrialContext.from_config(
                self.cfg,
                self.device,
                monitor,
                self.built["sources"],
                self.cores,
                ddp=(self.rank, self.world),
                clock=clock,
                **self.built["user"],
            )
            dist.barrier()  # every rank's loader and step start together
            metrics = run_trial(ctx, spec)
            own = summarize(
                monitor.timeline(), spec.trial_id, metrics.get("t_measure_start_s"), metrics.get("t_measure_end_s")
            )
        keep = ("main_cpu_pct_mean", "workers_cpu_pct_mean", "cpu_util_pct_mean", "rss_mb_max", "pss_mb_steady")
        return metrics | {k: own.get(k) for k in keep if k in own}


def shared_clock(group) -> Callable[[], float]:
    """A clock every rank reads alike: rank 0's ``perf_counter``, broadcast over ``group`` (gloo,
    on the host: no GPU synchronisation) at each read. Decisions made on it (warm-up settled, one
    more window) are the same in every rank."""
    import torch.distributed as dist

    buf = torch.zeros(1, dtype=torch.float64)

    def clock() -> float:
        buf[0] = time.perf_counter()
        dist.broadcast(buf, src=0, group=group)
        return float(buf[0])

    return clock


def _user_dataset(cfg):
    if cfg.data.kind != "factory":
        return None
    from pipeprof.models import load_callable

    return load_callable(cfg.data.factory)()


def _user_loader(cfg) -> Optional[Callable]:
    if cfg.data.kind != "loader":
        return None
    from pipeprof.models import load_callable

    return load_callable(cfg.data.factory)


def _span(cpus: list[int]) -> str:
    """CPU ids as ranges: 0-7,16-23."""
    out, start = [], None
    for i, c in enumerate(cpus):
        if start is None:
            start = c
        if i + 1 == len(cpus) or cpus[i + 1] != c + 1:
            out.append(str(start) if start == c else f"{start}-{c}")
            start = None
    return ",".join(out)


if __name__ == "__main__":
    code = rank_main(sys.argv[1])
    # the rank's files are written and its loaders shut down: no collection walks the objects of torch (DDP
    # imports its compiler) at exit, which kept torchrun waiting seconds for every rank of every job
    gc.freeze()
    sys.exit(code)
