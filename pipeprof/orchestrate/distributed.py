"""N-GPU trials: one process per GPU started by torch's own launcher, DDP, a loader per rank.

The sweep's process stays the parent. For a trial with ``gpus = N > 1`` it writes a job file
(the resolved config, the dataset folder, the trial's spec), starts ``torch.distributed.run``
(torchrun: its elastic agent, its rendezvous) with ``N / nnodes`` processes on this machine,
and reads back one result file per local rank. Each rank (:func:`rank_main`):

- takes its slice of the usable CPUs (``os.sched_setaffinity``, recorded), so one rank's
  loader workers do not run on another's cores;
- joins the process group (NCCL on GPUs, gloo on CPUs) and rebuilds the trial's context from
  the config: the same pipeline, a ``DistributedSampler`` shard of the samples, the model in
  ``DistributedDataParallel``, ``num_workers`` workers of its own (the count is per rank);
- measures with the sweep's own trial code. The step kinds read rank 0's clock (broadcast over
  a gloo group at every read): DDP steps run in lockstep, and ranks deciding on one clock end
  their warm-up and windows after the same steps, so none is left waiting in an all-reduce.
  The loader-only kind (``cpu_pipeline``: every rank's loader at once on the shared cores)
  needs no lockstep: each rank times itself after a common start barrier.

NVLink multicast stays off (``NCCL_NVLS_ENABLE=0``) in every process pipeprof starts; with
``p2p`` off ``NCCL_P2P_DISABLE=1`` sends the all-reduce through host memory instead of the
direct link. GPU clocks and settings are never touched.

Several machines: every node runs ``pipeprof run`` with the same config and its
``distributed.node_rank``; each trial's torchrun meets the others' at ``rdzv_endpoint``. A node
records the ranks it ran; ``pipeprof merge`` joins the nodes' folders (see ``merge``).
"""
from __future__ import annotations

import contextlib
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
from typing import Callable, Optional

import psutil
import torch

from pipeprof.schema import TrialKind
from pipeprof.trials import TrialContext, TrialSpec, run_trial
from pipeprof.trials.columns import combine_ranks
from pipeprof.trials.watchdog import TrialTimeout

JOB_FILE, RANK_FILE = "job.json", "rank-{rank}.json"
LAUNCH_MARGIN_S = 180.0  # torchrun, imports, model build and rendezvous, on top of the trial's own cap


def split_cpus(cpus: list[int], parts: int) -> list[list[int]]:
    """``cpus`` cut into ``parts`` contiguous slices as even as they come (the first get one more)."""
    size, extra = divmod(len(cpus), parts)
    out, start = [], 0
    for i in range(parts):
        end = start + size + (i < extra)
        out.append(cpus[start:end] or cpus[i % len(cpus):i % len(cpus) + 1])  # fewer CPUs than ranks: share
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
        cmd += [f"--node-rank={dist_cfg['node_rank']}", "--rdzv-backend=c10d",
                f"--rdzv-endpoint={dist_cfg['rdzv_endpoint']}", f"--rdzv-id={rdzv_id(spec)}"]
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


def run_job(ctx: TrialContext, spec: TrialSpec) -> dict:
    """One N-GPU trial on this node: its torchrun job, then the job's row (``ranks`` holds each rank's).

    The job is bounded in time (the trial's cap plus :data:`LAUNCH_MARGIN_S`); its processes are
    followed by the monitor while it runs and killed with their group when it overruns."""
    job = ctx.job
    dist_cfg = job["config"]["distributed"]
    with tempfile.TemporaryDirectory(prefix="pipeprof-job-") as tmp:
        job_dir = Path(tmp)
        (job_dir / JOB_FILE).write_text(json.dumps({**job, "spec": asdict(spec)}))
        ctx.monitor.set_trial(spec.trial_id, "job")  # our samples (the GPUs, the machine) are the job's
        proc = subprocess.Popen(launch_command(spec, job_dir, dist_cfg), env=launch_env(spec),
                                stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                                start_new_session=True)  # its own group: an overrun kills every rank
        log = _follow(proc, ctx, ctx.measure.max_trial_s + LAUNCH_MARGIN_S)
        ranks = [json.loads(f.read_text()) for f in sorted(job_dir.glob("rank-*.json"))]
    failed = [r for r in ranks if r.get("status") != "ok"]
    if proc.returncode != 0 and not failed:
        tail = "\n".join(log.splitlines()[-15:])
        raise RuntimeError(f"torchrun exited with {proc.returncode} ({len(ranks)} of {spec.gpus // dist_cfg['nnodes']} "
                           f"local ranks reported):\n{tail}")
    if failed:
        raise RuntimeError(f"rank {failed[0]['rank']}: {failed[0].get('error')}")
    return combine_ranks(ranks, spec.gpus) | {"ranks": ranks}


def _follow(proc: subprocess.Popen, ctx: TrialContext, limit_s: float) -> str:
    """Wait for the job, telling the monitor its processes (ranks and their workers); its output.
    A job that overruns, or a signal to the sweep (Ctrl-C, SIGTERM) while it runs, kills its group:
    started in a session of its own, the ranks would not get the terminal's signal nor die with us."""
    t0 = time.monotonic()
    reader = _Reader(proc)
    try:
        while proc.poll() is None:
            if time.monotonic() - t0 > limit_s:
                _kill_group(proc)
                raise TrialTimeout(f"the N-GPU job ran past {limit_s:.0f} s and was killed with its ranks")
            try:
                ctx.monitor.track_workers([c.pid for c in psutil.Process(proc.pid).children(recursive=True)])
            except psutil.NoSuchProcess:
                pass
            with contextlib.suppress(subprocess.TimeoutExpired):
                proc.wait(timeout=0.5)  # back as soon as the job ends, not up to half a second later
    except KeyboardInterrupt:
        _kill_group(proc)
        raise
    finally:
        ctx.monitor.track_workers([])
    return reader.text()


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
    """One rank of an N-GPU trial (torchrun sets RANK, WORLD_SIZE, LOCAL_RANK, LOCAL_WORLD_SIZE)."""
    import torch.distributed as dist

    from pipeprof.config import RunConfig

    job = json.loads(Path(job_path).read_text())
    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    local, local_world = int(os.environ["LOCAL_RANK"]), int(os.environ["LOCAL_WORLD_SIZE"])
    cpus = split_cpus(job["cpus"], local_world)[local]
    os.sched_setaffinity(0, cpus)
    cfg = RunConfig.model_validate(job["config"])
    spec = TrialSpec(**job["spec"])
    cuda = cfg.device == "cuda"
    device = torch.device("cuda", local) if cuda else torch.device("cpu")
    if cuda:
        torch.cuda.set_device(device)
    dist.init_process_group("nccl" if cuda else "gloo", device_id=device if cuda else None)
    row = {"rank": rank, "local_rank": local, "node": socket.gethostname(), "cpus": _span(cpus),
           "cores": len(cpus), "status": "ok", "error": None}
    try:
        row |= _measure(cfg, job, spec, device, rank, world, len(cpus))
    except Exception as exc:  # the parent reads it from the rank's file and fails the trial with it
        row |= {"status": "error", "error": f"{type(exc).__name__}: {exc}"[:2000]}
    out = Path(job_path).parent / RANK_FILE.format(rank=rank)
    tmp = out.with_suffix(".tmp")
    tmp.write_text(json.dumps(row, default=str))
    tmp.replace(out)
    dist.destroy_process_group()
    return 0 if row["status"] == "ok" else 1


def _measure(cfg, job: dict, spec: TrialSpec, device: torch.device, rank: int, world: int, cores: int) -> dict:
    """The trial in this rank, under its own monitor (its CPU: main process and workers)."""
    import torch.distributed as dist

    from pipeprof.data.prepare import build_sources
    from pipeprof.measure.monitors import Monitor, summarize

    sources = build_sources(cfg, job["folder"], lambda *a: None) if job["folder"] else {}
    lockstep = spec.kind != TrialKind.CPU_PIPELINE.value
    clock = shared_clock(dist.new_group(backend="gloo")) if lockstep else time.perf_counter
    user = {"user_dataset": _user_dataset(cfg), "user_loader": _user_loader(cfg)}
    with Monitor(hz=cfg.monitor_hz, gpu=False) as monitor:
        ctx = TrialContext.from_config(cfg, device, monitor, sources, cores, ddp=(rank, world), clock=clock,
                                       **user)
        dist.barrier()  # every rank's loader and step start together
        metrics = run_trial(ctx, spec)
        own = summarize(monitor.timeline(), spec.trial_id, metrics.get("t_measure_start_s"),
                        metrics.get("t_measure_end_s"))
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
    # the rank's file is written and its loader shut down: no collection walks the objects of torch (DDP
    # imports its compiler) at exit, which kept torchrun waiting 2-3 s for every rank of every job
    import gc

    gc.freeze()
    sys.exit(code)
