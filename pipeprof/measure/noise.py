"""Why a trial's windows varied: the cause that goes with its ``unstable`` flag.

On shared virtual machines the spread of a CPU-bound trial comes mostly from outside
the pipeline: the hypervisor taking CPU time (steal), other processes on the run's
cores, a GPU that throttles. The monitor measures each of these over the trial's
windows (``monitors.summarize``); this names the largest one with its figure, so a
flag tells the user what to fix (a quieter machine, fewer workers than cores) rather
than only that the number wobbled.
"""

from __future__ import annotations

from typing import Optional

FOREIGN_MIN_CORES = 0.10  # outside processes using a tenth of a core or more on the run's CPUs ...
FOREIGN_MIN_FRAC = 0.02  # ... and 2% of them: a big busy machine's kernel threads alone take about that
STEAL_MIN_PCT = 1.0  # the hypervisor took 1% of CPU time or more
THROTTLE_MIN_FRAC = 0.05  # the GPU was throttled in 5% of the samples or more
OVERSUBSCRIBED = 0.97  # the run's own processes kept the usable cores this busy


def _num(row: dict, key: str) -> Optional[float]:
    v = row.get(key)
    return float(v) if isinstance(v, (int, float)) and v == v else None


def causes(row: dict) -> list[tuple[str, str]]:
    """(cause, text with its figure) for each outside influence seen in the trial's windows, largest first."""
    found = []
    foreign, steal = _num(row, "foreign_cores_mean"), _num(row, "cpu_steal_pct_mean")
    run, cores = _num(row, "run_cores_mean"), _num(row, "usable_cores")
    throttled = _num(row, "gpu_throttled_frac")
    if foreign is not None and foreign >= max(FOREIGN_MIN_CORES, FOREIGN_MIN_FRAC * (cores or 0)):
        found.append(("foreign load", f"foreign load {foreign:.0%} of a core on the run's CPUs"))
    if steal is not None and steal >= STEAL_MIN_PCT:
        found.append(("steal", f"CPU steal {steal:.0f}%"))
    if run is not None and cores and run >= OVERSUBSCRIBED * cores:
        found.append(("cores full", f"the run's own processes kept {run:.1f} of {cores:g} cores busy"))
    if throttled is not None and throttled >= THROTTLE_MIN_FRAC:
        found.append(("gpu throttled", f"GPU throttled in {throttled:.0%} of the samples"))
    return found


def attribute(row: dict) -> dict:
    """Columns to add to an unstable trial's row: ``noise_cause`` and the reason with its likely cause."""
    if row.get("unstable") is not True:
        return {}
    found = causes(row)
    if found:
        cause, text = found[0][0], "; ".join(t for _, t in found)
    else:
        cause, text = (
            "unseen",
            (
                "no steal, outside load or throttling seen from inside the machine: the host's "
                "contention (the run's CPU reference shows how far the machine moved) or the "
                "pipeline's own variation"
            ),
        )
    reason = row.get("unstable_reason") or "unstable"
    return {"noise_cause": cause, "unstable_reason": f"{reason}; likely cause: {text}"}
