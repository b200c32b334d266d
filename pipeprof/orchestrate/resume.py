"""``pipeprof run --resume out/<run>``: what may be resumed, and which of its rows are kept.

A run folder is resumed only with the config it was made with (its resolved config in run.json
against this resolution, out_dir and name aside), on the machine it was made on (hostname, CPU model,
usable cores, GPU names), for the same kind of dataset, and when no process of it still runs. Its rows
that ended ``ok`` are kept, matched to the trials planned now by their settings (``trials.spec_key``);
the others (error, failed, timeout, oom) run again.
"""

from __future__ import annotations

import json
from typing import Optional

from pipeprof.results import Run, is_running
from pipeprof.trials import spec_key

IGNORED = ("out_dir", "name")  # where the run folder lives and what it is called: not what is measured


def _plain(obj):
    """``obj`` as run.json holds it (JSON types), so a fresh config compares equal to a stored one."""
    return json.loads(json.dumps(obj, default=str))


def _flat(d: dict, prefix: str = "") -> dict:
    out = {}
    for k, v in d.items():
        if isinstance(v, dict) and v:
            out |= _flat(v, f"{prefix}{k}.")
        else:
            out[f"{prefix}{k}"] = v
    return out


def config_differences(stored: dict, now: dict) -> list[str]:
    """``field: X in the run, Y now`` for each field of the resolved configs that differs."""
    old, new = (_flat({k: v for k, v in _plain(c).items() if k not in IGNORED}) for c in (stored, now))
    return [
        f"{k}: {old.get(k)!r} in the run, {new.get(k)!r} now"
        for k in sorted(old.keys() | new.keys())
        if old.get(k) != new.get(k)
    ]


def machine_facts(machine: dict) -> dict:
    """What must be the same for two sessions' trials to be comparable."""
    return _plain(
        {
            "hostname": machine.get("hostname"),
            "CPU model": machine.get("cpu_model"),
            "usable cores": (machine.get("cores") or {}).get("usable"),
            "GPUs": [g.get("name") for g in machine.get("gpus") or []],
        }
    )


def differences(meta: dict, config: dict, machine: dict, dataset_kind: Optional[str], pid: int) -> list[str]:
    """Why the run whose run.json is ``meta`` cannot be resumed by this process (``pid``), which resolved
    ``config`` on ``machine`` for a dataset of ``dataset_kind``; empty when it can."""
    out = []
    if meta.get("status") == "running" and meta.get("pid") not in (None, pid) and is_running(meta["pid"]):
        out.append(f"its process (pid {meta['pid']}) is still running it")
    if "config" not in meta:
        return out + ["run.json holds no config"]
    diff = config_differences(meta["config"], config)
    if diff:
        out.append(
            "the config differs (" + "; ".join(diff) + "): give the config file and --set overrides "
            "the run was started with"
        )
    old, new = machine_facts(meta.get("machine") or {}), machine_facts(machine)
    out += [f"the machine differs: {k} {old[k]!r} in the run, {new[k]!r} here" for k in old if old[k] != new[k]]
    was = (meta.get("dataset") or {}).get("kind")
    if was != dataset_kind:
        out.append(f"the dataset differs: {was!r} in the run, {dataset_kind!r} now")
    return out


def kept_rows(run: Run) -> dict:
    """The rows of ``run`` that ended ok, by ``spec_key``, as dicts (NaN as None), each N-GPU row with its
    ranks (``ranks.parquet``) again, so saving the rows rewrites that table whole."""
    rows = run.trials.astype(object).where(run.trials.notna(), None).to_dict("records") if len(run.trials) else []
    ranks: dict = {}
    if len(run.ranks):
        for r in run.ranks.astype(object).where(run.ranks.notna(), None).to_dict("records"):
            ranks.setdefault(r["trial_id"], []).append(r)
    return {
        spec_key(r): r | ({"ranks": ranks[r["trial_id"]]} if r["trial_id"] in ranks else {})
        for r in rows
        if r.get("status") == "ok"
    }
