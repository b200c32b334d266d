"""The trial kinds on Ray Data (``data.engine: ray``), timed as the DataLoader's are (``measure.windows``).

| kind         | timed region of one step                                                         |
|--------------|----------------------------------------------------------------------------------|
| cpu_pipeline | next(iter_torch_batches): read, decode, augment in CPU actors, the object store, pin |
| handoff      | the same over one prebuilt batch per actor: the ingest limit (object store, pin)  |
| end_to_end   | the cpu_pipeline's next() + host->device copy + model step                        |

gpu_ceiling runs no loader and is the DataLoader's own. The trial's ``num_workers`` is the Ray Data CPU limit
(``DataContext.execution_options.resource_limits.cpu``) and the actor pool's size. Each row carries the cluster's
facts (Ray's version, nodes, CPUs), the nodes its actors ran on, the actors' CPU a sample (their process CPU over
the measured windows, measured inside the actors: it holds on a remote node) and the bytes a sample crosses the
network with (the batch's). The monitor follows the actors on this machine's nodes only: a remote actor's process
id names nothing here.
"""

from __future__ import annotations

from pipeprof.data.ray_engine import ActorCpu, RayStream, ensure_cluster, local_node_keys
from pipeprof.measure.windows import steady_state
from pipeprof.schema import TrialKind

from .skeleton import make_step
from .spec import TrialContext, TrialSpec

#: the kinds that have a Ray form (gpu_ceiling needs none: it reads no batches)
RAY_KINDS = (TrialKind.CPU_PIPELINE.value, TrialKind.HANDOFF.value, TrialKind.END_TO_END.value)

TIMED_REGIONS = {
    "ray_cpu_pipeline": "next(iter_torch_batches) over Ray Data: read, decode, augment in map_batches CPU actors "
    "(one thread each), the object store, pinning; the Ray Data CPU limit and the actor pool at the trial's CPUs",
    "ray_handoff": "next(iter_torch_batches) over one real batch built once in each actor: the object store, the "
    "iterator and pinning (the ingest limit)",
    "ray_end_to_end": "ray_cpu_pipeline's next() + host->device copy + train/inference step; windows closed by "
    "device sync",
}


def run(ctx: TrialContext, spec: TrialSpec) -> dict:
    """One Ray trial of a kind in :data:`RAY_KINDS`."""
    if spec.kind not in RAY_KINDS:
        raise ValueError(f"data.engine ray: the {spec.kind} trial has no Ray form (it has: {', '.join(RAY_KINDS)})")
    if ctx.source is None:
        raise ValueError("data.engine ray runs pipeprof's own pipeline: data.kind synthetic or folder")
    facts = ensure_cluster()
    cpus = max(int(spec.num_workers or 1), 1)
    step = make_step(ctx, spec) if spec.kind == TrialKind.END_TO_END.value else None
    stream = RayStream(
        ctx.source_for(spec),
        spec,
        ctx.sample_policy,
        cpus,
        bool(spec.pin_memory),
        ctx.prefetch_factor,
        prebuilt=spec.kind == TrialKind.HANDOFF.value,
    )
    cpu, phase, seen, nodes, shape = ActorCpu(), {"now": "warmup"}, set(), set(), {}
    here = local_node_keys()

    def one() -> int:
        batch = next(stream)
        actors = set(zip(batch["pid"].tolist(), batch["node"].tolist()))
        if actors - seen:  # the monitor follows the actors as DataLoader workers (the local ones: psutil reads them)
            seen.update(actors)
            nodes.update(n for _, n in actors)
            ctx.monitor.track_workers(sorted(p for p, n in seen if n in here))
        if phase["now"] == "measure":
            cpu.add(batch)
        if not shape:
            shape["bytes"] = batch["image"].element_size() * batch["image"].numel() + 8 * batch["label"].numel()
        if step is not None:
            step.run(batch["image"], batch["label"])
        return batch["image"].shape[0]

    def on_phase(p: str) -> None:
        phase["now"] = p
        ctx.monitor.set_trial(spec.trial_id if p != "done" else None, p if p != "done" else None)

    try:
        up_s = _actors_up(one, seen, cpus, ctx.clock, ctx.measure.max_trial_s / 2)
        # warm-up: the actors' start-up and the prefetched batches (the pool's in flight, the iterator's) excluded
        m = steady_state(
            one,
            ctx.measure,
            min_warmup_batches=cpus * 2 + ctx.prefetch_factor + 2,
            batch_multiple=cpus,
            clock=ctx.clock,
            sync=step.clock.sync if step is not None else lambda: None,
            on_phase=on_phase,
        )
    finally:
        ctx.monitor.track_workers([])
        stream.close()
    per = cpu.per_sample_s()
    return (
        m.stats()
        | facts
        | {
            "engine": "ray",
            "ray_cpu_limit": cpus,
            "ray_actors_seen": len(seen),
            "ray_actors_up_s": up_s,
            "ray_actor_nodes": len(nodes),
            "ray_actor_cpu_s_per_sample": per,
            "batch_bytes_per_sample": shape.get("bytes", 0) / spec.batch_size if shape else None,
        }
    )


def _actors_up(one, seen: set, cpus: int, clock, cap_s: float) -> float:
    """Batches taken, untimed, until each of the pool's ``cpus`` actors has delivered one, for at most ``cap_s``;
    the seconds it took. A node whose actors start later would otherwise join inside the windows, or after them:
    warm-up ends when the rate settles, and one actor's rate settles too (a second node's actor on the 2-core
    machine had delivered no batch by the end of a 14-s trial)."""
    t0 = clock()
    while len(seen) < cpus and clock() - t0 < cap_s:
        one()
    return clock() - t0
