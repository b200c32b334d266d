"""``pipeprof size --offload``'s words: what the model read from the two runs, then one row per GPU count (the figures
are ``analysis.offload``'s)."""

from __future__ import annotations

import math

from pipeprof.analysis.offload import Inputs, Row, busy_frac, line_check
from pipeprof.stats import signed_pct


def _ms(s) -> str:
    return "–" if s is None else f"{s * 1e3:.2f} ms"


def _cpus(n: int) -> str:
    return f"{n} CPU{'s' * (n != 1)}"


def _rate(r) -> str:
    return f"{r.value:,.1f} samples/s ({r.low:,.1f}–{r.high:,.1f})"


def basis(x: Inputs, link_gbps: float) -> list[str]:
    """The lines above the table: the workload, each sample's CPU both ways, one Ray CPU's rate, the link, the
    ingest."""
    nodes = f", {x.ray_nodes} node{'s' * (x.ray_nodes != 1)}" if x.ray_nodes else ""
    out = [
        f"offload sizing for {x.workload}: the step's ceiling {_rate(x.step)} a GPU; Ray {x.ray_version}{nodes}",
    ]
    cpu = f"per-sample CPU: Ray actors {_ms(x.ray_cpu_s)} (at {_cpus(x.cpu_limit)})"
    if x.loader_cpu_s is not None:
        w = x.loader_workers
        cpu += f", DataLoader workers {_ms(x.loader_cpu_s)} ({w} worker{'s' * (w != 1)})"
        if x.ray_cpu_s:
            cpu += f": Ray {signed_pct(x.ray_cpu_s / x.loader_cpu_s - 1)}"
    if x.carry_cpu_s is not None:
        cpu += (
            f"; Ray's cost of carrying a sample {_ms(x.carry_cpu_s)} (the hand-off's actors: no read, decode, augment)"
        )
    out.append(cpu)
    busy = busy_frac(x.per_cpu.value * x.cpu_limit, x.ray_cpu_s, x.cpu_limit)
    one = f"one Ray CPU delivers {_rate(x.per_cpu)}, the {x.cpu_limit}-CPU trial's" + (
        f" (its actors {busy:.0%} busy)" if busy is not None else ""
    )
    for n, got, line in line_check(x):
        one += f"; at {n} CPUs the run measured {got:,.1f}, the line {line:,.1f} ({signed_pct(line / got - 1)})"
    out.append(one)
    link = f"link: {x.bytes_per_sample:,.0f} bytes a sample at {link_gbps:g} Gb/s"
    ingest = (
        f"ingest: {_rate(x.ingest)} a training process (the hand-off at {_cpus(x.ingest_limit)})"
        if x.ingest
        else "ingest: not measured (trials: handoff)"
    )
    out.append(f"{link}; {ingest}")
    return out + [f"note: {n}" for n in x.notes]


def render_offload(x: Inputs, rows: list[Row], target: float, link_gbps: float, node_cores: int) -> str:
    """The basis lines, the table, and the line a buyer reads first."""
    out = basis(x, link_gbps) + [
        "",
        f"| GPUs | GPUs take | target ({target:.0%}) | link carries | ingest | remote cores (range) | "
        f"nodes of {node_cores} cores | delivers | of ceiling | binding | note |",
        "|" + "---|" * 11,
    ]
    for r in rows:
        ingest = "–" if math.isinf(r.ingest_samples_per_s) else f"{r.ingest_samples_per_s:,.1f}"
        out.append(
            f"| {r.gpus} | {r.gpus_samples_per_s:,.1f} | {r.target_samples_per_s:,.1f} | "
            f"{r.network_samples_per_s:,.0f} | {ingest} | {r.cores} ({r.cores_low}–{r.cores_high}) | {r.nodes} | "
            f"{r.delivered_samples_per_s:,.1f} | {r.of_ceiling_frac:.0%} | {r.binding} | {r.note} |"
        )
    short = [r for r in rows if r.binding != "cpu"]
    out.append("")
    out.append(
        f"from {short[0].gpus} GPUs a node the {short[0].binding} binds: remote cores past "
        f"{short[0].cores} add nothing, the GPUs get {short[0].of_ceiling_frac:.0%} of their ceiling"
        if short
        else f"every GPU count reaches {target:.0%} of the ceiling with the remote cores shown"
    )
    return "\n".join(out) + "\n"
