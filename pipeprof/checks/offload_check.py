"""``pipeprof bench offload-check``: the offload model's prediction for two nodes against a cluster of two nodes.

The model (``analysis.offload``) sizes remote CPUs from one-node runs: one Ray CPU delivers what the run's
smallest CPU limit did, each node bringing its own, under the training process's ingest. This check measures that
claim where a second node can be made, on this machine, as Ray's own multi-node tests do:

1. a DataLoader run (``cpu_pipeline`` at 1 worker, the step's ``gpu_ceiling``): the per-sample CPU to set the
   actors' beside (or ``loader_run``, one already made of the same preset and batch);
2. a Ray cluster of one node of 1 CPU (``ray start --head --num-cpus 1``) and a Ray run on it (``RAY_ADDRESS``):
   ``cpu_pipeline`` and ``handoff`` at 1 CPU, from which the model predicts 2 CPUs;
3. a second node of 1 CPU joins (``ray start --address ... --num-cpus 1``) and a Ray run measures ``cpu_pipeline``
   at 2 CPUs, one actor a node: predicted against measured, the target within 10%.

Each node is a ``ray start --block`` child of this process, stopped by its own process id (SIGTERM, which shuts
its node's processes down; any of them still alive after it is ended by its id): ``ray stop`` would end every Ray
process on the machine, other jobs' too. The cluster keeps its files, and its address, in a folder of its own, so
no other ``ray.init()`` on the machine joins it.

On one machine the two nodes share its cores with the training process and whatever else runs there, so a miss
is split in its two factors (:func:`split`): the actors' busy share (their CPU over the CPUs they held) and each
sample's CPU, one node against two. Each run is a separate ``python -m pipeprof run`` writing its own run folder.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import NamedTuple, Optional

import psutil
import yaml

from pipeprof.analysis import offload
from pipeprof.analysis.bounds import ok
from pipeprof.results import Run, load_measured
from pipeprof.stats import signed_pct

from .sizing import launch

TARGET_ERR = 0.10
#: short windows: the check's trials at a few hundred samples/s hold several batches a window
QUICK_MEASURE = {
    "warmup_s": 0.5,
    "window_s": 0.5,
    "window_batches": 2,
    "windows": 4,
    "max_windows": 6,
    "ci_target": 0.1,
    "redraws": 10,
    "cpu_reference_s": 0,
}
#: a local test cluster: no dashboard, a small object store, no 30-s drain when its node is told to stop, no
#: authentication token between processes of one machine
CLUSTER_ENV = {
    "RAY_GRACEFUL_SHUTDOWN_DRAIN_TIMEOUT_S": "0",
    "RAY_AUTH_MODE": "disabled",
    "RAY_USAGE_STATS_ENABLED": "0",
}


#: the step: 5 ms that use no CPU (a GPU's stand-in, ``checks.calibrate``), so the DataLoader run's ceiling costs
#: seconds, not the minute a CPU model's took beside the check's other load, and the offload table has a GPU's scale
STEP_MODEL = "pipeprof.checks.calibrate:fixed_step_model_5ms"


def config(preset: str, batch_size: int, images: int, cache_dir: str, measure: Optional[dict] = None) -> dict:
    """The check's experiment: a synthetic folder, the preset and batch, a fixed step (:data:`STEP_MODEL`)."""
    return {
        "device": "cpu",
        "sweep": "exhaustive",
        "data": {"kind": "synthetic", "images": images, "classes": 2, "cache_dir": cache_dir},
        "augment": {"preset": [preset]},
        "loader": {"batch_size": [batch_size]},
        "model": {"name": [STEP_MODEL], "threads": 1},
        "measure": measure or QUICK_MEASURE,
    }


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class LocalCluster:
    """Ray nodes on this machine, each a ``ray start --block`` child of this process (module doc)."""

    def __init__(self, root: Path, logs: Path, object_store_mb: int = 256):
        # root: Ray's files (short: its socket paths must fit 107 characters); logs: each node's ray start output
        self.root, self.logs, self.store = Path(root), Path(logs), object_store_mb * 1024 * 1024
        self.nodes: list[subprocess.Popen] = []
        self.address: Optional[str] = None
        self.pids: set[int] = set()  # every process of the cluster seen when it was stopped

    def __enter__(self) -> "LocalCluster":
        return self

    def __exit__(self, *exc) -> None:
        self.stop()

    def _start(self, args: list[str], name: str, timeout_s: float = 90) -> None:
        log = self.logs / f"ray-{name}.log"
        cmd = [
            *ray_command(),
            "start",
            "--block",
            "--disable-usage-stats",
            f"--object-store-memory={self.store}",
            f"--dashboard-agent-listen-port={free_port()}",
            *args,
        ]
        with open(log, "w") as out:
            proc = subprocess.Popen(
                cmd, stdout=out, stderr=subprocess.STDOUT, env=os.environ | CLUSTER_ENV, start_new_session=True
            )
        self.nodes.append(proc)
        deadline = time.monotonic() + timeout_s
        while "Ray runtime started" not in log.read_text(errors="replace"):
            if proc.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"ray start ({name}) did not start a node; its output is in {log}")
            time.sleep(0.2)

    def start_head(self, cpus: int) -> str:
        port = free_port()
        self._start(
            [
                "--head",
                f"--num-cpus={cpus}",
                f"--port={port}",
                "--node-ip-address=127.0.0.1",
                "--include-dashboard=false",
                f"--ray-client-server-port={free_port()}",
                f"--temp-dir={self.root / 'ray'}",
            ],
            "head",
        )
        self.address = f"127.0.0.1:{port}"
        return self.address

    def add_node(self, cpus: int) -> None:
        self._start(
            [f"--address={self.address}", f"--num-cpus={cpus}", "--node-ip-address=127.0.0.1"],
            f"node-{len(self.nodes)}",
        )

    def env(self) -> dict:
        """What a driver (a ``pipeprof run``) joins the cluster with."""
        return {"RAY_ADDRESS": self.address, **CLUSTER_ENV}

    def stop(self, grace_s: float = 20) -> list[int]:
        """Each node's ``ray start`` told to stop (SIGTERM: it shuts its node's processes down), all at once; then any
        of the processes it had started still alive ended by its id. Returns those ids."""
        spawned: list[psutil.Process] = []
        for proc in self.nodes:
            try:
                spawned += psutil.Process(proc.pid).children(recursive=True)
            except psutil.NoSuchProcess:
                pass
        self.pids |= {p.pid for p in self.nodes} | {p.pid for p in spawned}
        for proc in self.nodes:
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
        for proc in self.nodes:
            try:
                proc.wait(grace_s)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(5)
        _, alive = psutil.wait_procs(spawned, timeout=5)
        for p in alive:
            p.kill()
        psutil.wait_procs(alive, timeout=5)
        self.nodes = []
        return [p.pid for p in alive]


def ray_command() -> list[str]:
    """``ray`` of this interpreter's environment (its scripts folder), else on the PATH."""
    here = Path(sys.executable).parent / "ray"
    return [str(here)] if here.exists() else ["ray"]


class Side(NamedTuple):
    """One Ray run's cpu_pipeline trial, as the check reads it."""

    run: str
    cpus: int
    rate: offload.Rate
    cpu_s: Optional[float]  # the actors' CPU a sample
    busy_frac: Optional[float]  # their CPU over the CPUs they held
    nodes: int  # the cluster's live nodes
    node_cpus: str
    actor_nodes: Optional[int]  # the nodes its actors ran on
    foreign_cores: Optional[float]  # CPU beside the run's own processes on this machine (the monitor's)
    busy_cores: Optional[float]  # this machine's busy cores (of its usable ones) during the trial
    driver_cores: Optional[float]  # the training process's CPU (the Ray driver: the iterator, the executor)
    usable_cores: Optional[int]


class Result(NamedTuple):
    ray_version: str
    one: Side
    two: Side
    predicted_samples_per_s: float
    binding: str
    error_frac: float  # predicted / measured - 1
    busy_factor: Optional[float]  # (split) the one node's busy share over the two nodes'
    cost_factor: Optional[float]  # (split) each sample's CPU on two nodes over one's
    loader_cpu_s: Optional[float]
    carry_cpu_s: Optional[float]
    passed: bool
    inputs: offload.Inputs
    loader_run: str
    cluster_pids: tuple = ()  # the cluster's processes (each node's ray start and what it started)
    killed_pids: tuple = ()  # those still alive after their node's ray start ended, ended by their id


def side(run: Run, cpus: int) -> Side:
    t = ok(run.trials, "cpu_pipeline")
    t = t[t["ray_cpu_limit"] == cpus]
    if t.empty:
        raise RuntimeError(f"{run.path}: no cpu_pipeline trial at {cpus} Ray CPUs succeeded")
    r = t.iloc[0]
    rate = offload.Rate(*(float(r[k]) for k in ("samples_per_s", "samples_per_s_ci95_low", "samples_per_s_ci95_high")))
    keys = ("ray_actor_cpu_s_per_sample", "ray_actor_nodes", "foreign_cores_mean", "usable_busy_cores_mean")
    cost, actor_nodes, foreign, busy = (_known(r, k) for k in keys)
    main, usable = _known(r, "main_cpu_pct_mean"), _known(r, "usable_cores")
    return Side(
        str(run.path),
        cpus,
        rate,
        cost,
        offload.busy_frac(rate.value, cost, cpus),
        int(r["ray_nodes"]),
        str(r["ray_node_cpus"]),
        None if actor_nodes is None else int(actor_nodes),
        foreign,
        busy,
        None if main is None else main / 100,
        None if usable is None else int(usable),
    )


def _known(r, key: str) -> Optional[float]:
    v = r.get(key)
    return float(v) if v is not None and v == v else None


def split(one: Side, two: Side) -> tuple[Optional[float], Optional[float]]:
    """predicted / measured = (busy share on one node / on two) x (CPU a sample on two / on one): the rate a CPU
    gives is its busy share over each sample's CPU, and the prediction carries the one-node run's of both."""
    if not (one.busy_frac and two.busy_frac and one.cpu_s and two.cpu_s):
        return None, None
    return one.busy_frac / two.busy_frac, two.cpu_s / one.cpu_s


def check(
    out_dir: str | Path,
    preset: str = "light",
    batch_size: int = 64,
    images: int = 64,
    measure: Optional[dict] = None,
    loader_run: Optional[str] = None,
    overrides: list[str] = (),
    progress=lambda text: None,
) -> Result:
    """The two-node check (module doc); its runs and logs under ``out_dir``. ``overrides``: ``--set`` values for
    every run (the preset, the batch ...; its engine, trials and CPU limits are the check's). Batches of 64: at 16
    the Ray Data pipeline on one node of 2 CPUs ran 1.15x its 1-CPU rate on the 2-core machine, at 64 1.74x (each
    batch's cost in the driver's executor)."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    path = out / "offload-config.yaml"
    path.write_text(yaml.safe_dump(config(preset, batch_size, images, str(out / "datasets"), measure)))
    if loader_run is None:
        progress("the DataLoader at 1 worker (cpu_pipeline) and the step (gpu_ceiling)")
        sets = [*overrides, "trials=[gpu_ceiling,cpu_pipeline]", "loader.num_workers=[1]"]
        loader = launch(path, out, "offload-loader", sets, None)
    else:
        loader = load_measured(loader_run)
    ray_sets = ["data.engine=ray", "sweep=exhaustive"]
    with tempfile.TemporaryDirectory(prefix="pipeprof-ray-") as root, LocalCluster(Path(root), out) as cluster:
        progress("one node of 1 CPU (ray start --head --num-cpus 1)")
        cluster.start_head(1)
        progress("Ray on one node: cpu_pipeline and handoff at 1 CPU")
        sets = [*overrides, *ray_sets, "trials=[cpu_pipeline,handoff]", "loader.num_workers=[1]"]
        one_run = launch(path, out, "offload-ray-1node", sets, None, env=cluster.env())
        progress("a second node of 1 CPU (ray start --address ... --num-cpus 1)")
        cluster.add_node(1)
        progress("Ray on two nodes: cpu_pipeline at 2 CPUs")
        sets = [*overrides, *ray_sets, "trials=[cpu_pipeline]", "loader.num_workers=[2]"]
        two_run = launch(path, out, "offload-ray-2nodes", sets, None, env=cluster.env())
        killed = cluster.stop()
    return judge(one_run, two_run, loader)._replace(cluster_pids=tuple(sorted(cluster.pids)), killed_pids=tuple(killed))


def judge(one_run: Run, two_run: Run, loader: Run) -> Result:
    """The model's prediction for 2 CPUs from the one-node run against the two-node run's measurement."""
    x = offload.inputs([one_run, loader], [str(one_run.path), str(loader.path)])
    one, two = side(one_run, 1), side(two_run, 2)
    predicted, binding = offload.predict(x, 2)
    error = predicted / two.rate.value - 1
    busy, cost = split(one, two)
    return Result(
        x.ray_version,
        one,
        two,
        predicted,
        binding,
        error,
        busy,
        cost,
        x.loader_cpu_s,
        x.carry_cpu_s,
        abs(error) <= TARGET_ERR,
        x,
        str(loader.path),
    )


def machine_lines(r: Result) -> list[str]:
    """Where the busy share went: the two nodes' CPUs are this machine's cores, shared with the training process,
    the cluster's own processes and other jobs; and the rate the one-node run's CPU a sample gives at the CPU the
    actors got (their own clocks): the error the model owns once the machine's cores are put in."""
    t = r.two
    if None in (t.busy_cores, t.driver_cores, t.foreign_cores, t.usable_cores, t.cpu_s, r.one.cpu_s):
        return []
    actors = t.rate.value * t.cpu_s
    given = actors / r.one.cpu_s
    return [
        f"this machine's {t.usable_cores} cores held both nodes: in the two-node trial {t.busy_cores:.2f} were busy "
        f"(the actors {actors:.2f}, the training process {t.driver_cores:.2f}, other processes {t.foreign_cores:.2f}, "
        f"the cluster's own among them); at the CPU the actors got, the one-node run's CPU a sample gives "
        f"{given:,.1f} samples/s, {signed_pct(given / t.rate.value - 1)} of the measured",
    ]


def render(r: Result) -> str:
    """Predicted against measured, the split of the miss, each sample's CPU both ways, then the offload table the
    runs give."""
    from pipeprof.report.offload import render_offload

    def ms(s):
        return "–" if s is None else f"{s * 1e3:.2f} ms"

    def pct(f):
        return "–" if f is None else f"{f:.0%}"

    def foreign(s):
        return "–" if s.foreign_cores is None else f"{s.foreign_cores:.2f}"

    out = [
        f"Ray {r.ray_version}: the offload model's 2 CPUs against a cluster of two nodes of 1 CPU on this machine",
        "",
        "| cluster | nodes (CPUs) | actors' nodes | CPU limit | samples/s (95% interval) | actors' CPU a sample | "
        "actors busy | other load (cores) |",
        "|" + "---|" * 8,
    ]
    for s in (r.one, r.two):
        out.append(
            f"| {'one node' if s is r.one else 'two nodes'} | {s.nodes} ({s.node_cpus}) | {s.actor_nodes or '–'} | "
            f"{s.cpus} | {s.rate.value:,.1f} ({s.rate.low:,.1f}–{s.rate.high:,.1f}) | {ms(s.cpu_s)} | "
            f"{pct(s.busy_frac)} | {foreign(s)} |"
        )
    out += [
        "",
        f"predicted for two nodes (the 1-CPU run x 2, {r.binding} binds): {r.predicted_samples_per_s:,.1f} samples/s; "
        f"measured {r.two.rate.value:,.1f}: {signed_pct(r.error_frac)} (target within ±{TARGET_ERR:.0%}: "
        f"{'passed' if r.passed else 'missed'})",
    ]
    if r.busy_factor is not None:
        out.append(
            f"the miss's factors: the actors' busy share {r.one.busy_frac:.0%} on one node, {r.two.busy_frac:.0%} "
            f"on two (x{r.busy_factor:.2f}); each sample's CPU {ms(r.one.cpu_s)} on one, {ms(r.two.cpu_s)} on two "
            f"(x{r.cost_factor:.2f})"
        )
        out += machine_lines(r)
    loader = ms(r.loader_cpu_s)
    diff = f" (Ray {signed_pct(r.one.cpu_s / r.loader_cpu_s - 1)})" if r.loader_cpu_s and r.one.cpu_s else ""
    out.append(
        f"per-sample CPU, same preset and batch: DataLoader worker {loader}, Ray actor {ms(r.one.cpu_s)}{diff}; "
        f"Ray's cost of carrying a sample (the hand-off's actors, no read, decode, augment) {ms(r.carry_cpu_s)}"
    )
    x = r.inputs
    table = offload.table(x, list(offload.DEFAULT_GPUS), 0.9, offload.DEFAULT_LINK_GBPS, offload.DEFAULT_NODE_CORES)
    sized = render_offload(x, table, 0.9, offload.DEFAULT_LINK_GBPS, offload.DEFAULT_NODE_CORES)
    out += ["", f"pipeprof size --offload {r.one.run} {r.loader_run}:", "", sized.rstrip("\n")]
    return "\n".join(out) + "\n"
