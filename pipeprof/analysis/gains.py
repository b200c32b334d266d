"""Each action's predicted gain, from this run's own figures at one end-to-end trial (the group's best).

:func:`predicted_actions` runs the predictor that each entry of ``pipeprof.actions.ACTIONS`` names (``predict``:
a function of this module by name) over one :class:`Evidence`, and ranks what they predict. A predictor returns
candidates (``Candidate``: the change in words, its predicted rate, the basis), computed with the same model as
``bounds.predict``; the gain is read against the model's own figure for today, so the model's error cancels.

Two families, read differently:
- changes of the CPU's work (decoder, uint8, a transform, more workers): capped at the measured hand-off, which
  the same float32 batches still pass (not for an action that changes what is handed over: ``new_handoff``),
  and marked ``within_noise`` when the gain is no larger than the trial's own 95% interval;
- storage swaps (RAM, shards, faster storage, more workers for latency), each predicted from another source
  measured in the same run (same batch and workers: its storage_fetch rate replaces the I/O bound and its
  cpu_pipeline curve, which includes its reads, the CPU bound); those gaining no more than ``MIN_GAIN`` are
  not listed.

A predictor is a plain function of this module: ``fn(ev: Evidence) -> list[Candidate]``, named in the action's
registry entry.
"""

from __future__ import annotations

from typing import NamedTuple, Optional

import numpy as np
import pandas as pd

from pipeprof.actions import ACTIONS, FINDING
from pipeprof.stats import workers_text

from .bounds import _known, cpu_curve, ok, predict, stage_cost_s, waits_on_storage
from .verdict import SATURATED

MIN_GAIN = 0.02  # storage changes predicted to gain less than this are not worth listing
LATENCY_SCALING = 0.7  # raw reads growing at >= 70% of linear with workers: latency, not bandwidth, binds
IN_RAM = "cache the dataset in RAM"  # how a RAM action's words start


class Evidence(NamedTuple):
    """What every predictor reads: the end-to-end ``row`` (its bounds joined on), the run's CPU curve
    (``ws`` worker counts, ``rates`` samples/s), its usable cores and device, the stage shares of worker time,
    both CPU decoders timed on the run's files (``measure.decoders``), the run's trials, and the model's own
    rate for the row (``base``) with its bounds."""

    row: pd.Series
    ws: np.ndarray
    rates: np.ndarray
    cores: float
    device: str
    shares: dict
    decode_costs: Optional[dict]
    trials: pd.DataFrame
    base: float
    bounds: dict


class Candidate(NamedTuple):
    action: str  # in words
    predicted: Optional[float]  # samples/s; None: not predicted (the basis says why)
    basis: str
    storage: bool = False  # a storage swap (the second family above)
    id: Optional[str] = None  # another action's id than the predictor's entry (a measured swap names its kind)


def predicted_actions(
    row: pd.Series,
    ws: np.ndarray,
    rates: np.ndarray,
    cores: float,
    device: str = "cuda",
    decode_costs: Optional[dict] = None,
    trials: Optional[pd.DataFrame] = None,
) -> list[dict]:
    """Ranked single changes with their predicted gain: a finding first where the row is at the step's ceiling
    (no change on the input side can help), then those with no predicted gain, then by gain. Each has the ``id``
    of its registry entry, which the action trials match their measurements to."""
    base, bounds = predict(row, ws, rates, cores)
    shares = {k.split(".", 1)[1]: v for k, v in row.items() if k.startswith("stage_share.") and v == v}
    ev = Evidence(
        row,
        ws,
        rates,
        cores,
        device,
        shares,
        decode_costs,
        trials if trials is not None else pd.DataFrame(),
        base,
        bounds,
    )
    found = [(c.id or key, c) for key, a in ACTIONS.items() if a.predict for c in globals()[a.predict](ev)]
    cpu = _ranked([(key, c) for key, c in found if not c.storage], base, row)
    storage = [g for key, c in found if c.storage and (g := _storage_gain(key, c, row["samples_per_s"], base))]
    if any(a["action"].startswith(IN_RAM) for a in storage):  # measured, or from the stage clocks: it replaces
        cpu = [a for a in cpu if not a["action"].startswith(IN_RAM)]  # the one that took the loader bound as CPU's
    out = sorted(cpu + storage, key=lambda a: (a["gain_frac"] is not None, -(a["gain_frac"] or 0)))
    if _known(bounds.get("step")) and row["samples_per_s"] >= 0.9 * bounds["step"]:
        out.insert(0, _at_step_ceiling(device))
    return out


def _ranked(found: list, base: float, row: pd.Series) -> list[dict]:
    """The CPU family's gains against the model's figure, capped at the measured hand-off, with their noise."""
    now, noise, handoff = row["samples_per_s"], _noise_frac(row), row.get("handoff_samples_per_s")
    out = []
    for key, c in found:
        a = {"id": key, "action": c.action, "predicted_samples_per_s": c.predicted, "basis": c.basis}
        a["gain_frac"] = c.predicted / base - 1 if _known(base) and _known(c.predicted) else None
        if (
            a["gain_frac"] is not None
            and not ACTIONS[key].new_handoff
            and _known(handoff)
            and now
            and now * (1 + a["gain_frac"]) > handoff
        ):
            # the same batches still pass the training process's hand-off, a limit of its own. It is CPU work
            # on the same cores, so it moves with the machine as the pipeline's rate does: the capped gain is a
            # ratio to the rate measured beside it, not an absolute rate (docs/measured.md: the decoder case)
            a["gain_frac"] = max(handoff / now - 1, 0.0)
            a["basis"] += (
                f"; capped at the loader's hand-off, which the same float32 batches still pass: "
                f"{handoff:,.0f} samples/s (the handoff trial)"
            )
        a["predicted_samples_per_s"] = now * (1 + a["gain_frac"]) if a["gain_frac"] is not None else None
        a["within_noise"] = a["gain_frac"] is not None and abs(a["gain_frac"]) <= 2 * noise
        out.append(a)
    return out


def _storage_gain(key: str, c: Candidate, now: float, base: float) -> Optional[dict]:
    """A storage swap with its predicted rate, or None when it gains no more than ``MIN_GAIN``."""
    gain = c.predicted / base - 1
    if gain <= MIN_GAIN:
        return None
    return {
        "id": key,
        "action": c.action,
        "predicted_samples_per_s": now * (1 + gain),
        "basis": c.basis,
        "gain_frac": gain,
    }


def _noise_frac(row: pd.Series) -> float:
    """The row's 95% half-width as a share of its rate (0 where no interval was measured)."""
    lo, hi, now = row.get("samples_per_s_ci95_low"), row.get("samples_per_s_ci95_high"), row.get("samples_per_s")
    return (hi - lo) / 2 / now if _known(lo) and _known(hi) and _known(now) and now else 0.0


def _at_step_ceiling(device: str) -> dict:
    text = (
        (
            "the GPU is the limit: lower precision, a larger batch or a faster GPU",
            "already at the measured GPU ceiling; CPU-side changes cannot help",
        )
        if device == "cuda"
        else (
            "the CPU step is the limit: fewer workers (more threads for the step), a larger batch, or a GPU",
            "already at the measured step ceiling on these cores",
        )
    )
    return {
        "id": FINDING,
        "action": text[0],
        "predicted_samples_per_s": None,
        "basis": text[1],
        "gain_frac": None,
        "within_noise": False,
    }


def _cheaper_cpu(ev: Evidence, share: float) -> float:
    """Predicted rate with ``share`` of worker time removed (row, CPU curve and stage clocks scaled)."""
    f = 1 / (1 - share)
    r = ev.row.copy()
    r["cpu_bound_samples_per_s"] = ev.row.get("cpu_bound_samples_per_s", float("nan")) * f
    for k in r.index:
        if k.startswith("stage_us_per_sample."):
            r[k] = r[k] / f
    return predict(r, ev.ws, ev.rates * f, ev.cores)[0]


# ---- the CPU's work ------------------------------------------------------------------------


def other_decoder(ev: Evidence) -> list[Candidate]:
    """The other CPU decoder, predicted from the workers' measured decode share scaled by the two decoders'
    measured costs on this run's files (no assumed speed-up); nothing when it is not faster here."""
    decoder, share = ev.row.get("decoder"), ev.shares.get("decode")
    costs = ev.decode_costs or {}
    us = costs.get("us_per_sample", {})
    other = next((d for d in us if d != decoder), None)
    if not (share and share < 1 and isinstance(decoder, str) and decoder in us and other):
        return []
    ratio = us[other] / us[decoder]
    if ratio >= 1:
        return []
    procs = costs.get("processes")
    as_workers = (
        f" (each in {min(procs.values())} processes of one decoder and the preset, as workers)" if procs else ""
    )
    return [
        Candidate(
            f"decode with {other} instead of {decoder} (data.decoder: {other}): decode is {share:.0%} of worker time",
            _cheaper_cpu(ev, share * (1 - ratio)),
            f"decode's measured share less {1 - ratio:.0%}: {other} decoded {costs['samples']} of this run's "
            f"files in {us[other]:,.0f} us each against {us[decoder]:,.0f} us for {decoder}{as_workers}",
        )
    ]


def cheapen_costliest_stage(ev: Evidence) -> list[Candidate]:
    """The costliest transform (decode has its own actions: the other decoder, decoding on the GPU)."""
    costly = max(
        ((k, v) for k, v in ev.shares.items() if k not in ("read", "collate", "decode")),
        key=lambda kv: kv[1],
        default=None,
    )
    if not (costly and costly[1] < 1):
        return []
    name, share = costly
    return [
        Candidate(
            f"drop or cheapen {name}: {share:.0%} of worker time",
            _cheaper_cpu(ev, share),
            "worker time less that stage's measured share",
        )
    ]


def uint8_to_gpu(ev: Evidence) -> list[Candidate]:
    """uint8 batches: the workers lose Normalize and 3/4 of collate (a quarter of the bytes). Where the cores
    are full, the training process's hand-off (receiving and pinning the batches, measured by the handoff
    trial) shares them with the workers, and its 3/4 goes too: the CPU a sample costs the machine is then
    worker time + hand-off time (predicting from worker time alone fell short of the measured gain:
    docs/measured.md)."""
    shares, row = ev.shares, ev.row
    uint8_share = shares.get("Normalize", 0) + 0.75 * shares.get("collate", 0)
    if not (shares.get("Normalize", 0) and uint8_share < 1 and ev.device == "cuda"):
        return []
    basis = "Normalize's share and 3/4 of collate's share removed from worker time"
    worker_us = sum(v for k, v in row.items() if k.startswith("stage_us_per_sample.") and _known(v))
    handoff_us = row.get("handoff_main_us_per_sample")
    busy = row.get("usable_busy_cores_mean")
    if _known(handoff_us) and worker_us > 0 and _known(busy) and busy >= SATURATED * ev.cores:
        uint8_share = (uint8_share * worker_us + 0.75 * handoff_us) / (worker_us + handoff_us)
        basis += (
            f"; the cores are full, so 3/4 of the training process's hand-off goes too ({handoff_us:,.0f} us a "
            f"sample, measured by the handoff trial), of the {worker_us + handoff_us:,.0f} us a sample costs them"
        )
    return [
        Candidate(
            "normalise on the GPU and send uint8 (4x fewer bytes through collate and IPC)",
            _cheaper_cpu(ev, uint8_share),
            basis,
        )
    ]


def gpu_pipeline(ev: Evidence) -> list[Candidate]:
    """Decode and augment on the GPU (augment.device: cuda): the workers keep their reads only. No gain is
    predicted from the sweep: the GPU's own decode/augment time, which competes with the step, is measured by
    nothing in it (counting it free overstated the gain: docs/measured.md). The action trials measure the GPU
    pipeline beside a stand-in for the step first and predict from it (:func:`gpu_pipeline_prediction`)."""
    if ev.device != "cuda" or not ev.shares.get("decode"):
        return []
    moved = 1 - ev.shares.get("read", 0)
    if moved >= 1:
        return []
    return [
        Candidate(
            ACTIONS["gpu_pipeline"].label,
            None,
            f"not predicted: it frees the workers' decode, transforms and collate ({moved:.0%} of their "
            "time), but the GPU's decode/augment time beside the step is known only from measuring its "
            "pipeline beside a stand-in for the step, which the action trials do first",
        )
    ]


def gpu_pipeline_prediction(row: pd.Series, beside: dict) -> dict:
    """The GPU pipeline's predicted rate and gain at the baseline ``row`` (an end-to-end row with its step
    bound joined on), read off its pipeline measured beside a stand-in for the step (``beside``: its
    ``cpu_pipeline`` row, workers reading bytes, the device kept busy the step's own time before each batch:
    ``trials.device_side.StandIn``). End to end the host decodes and queues the next batch while the device
    runs the step, so a batch costs the step's time plus the pipeline's own device time, not plus its time
    alone (the serial sum 1 / (1/step + 1/alone) fell well short of the measured rate: docs/measured.md). The
    stand-in has no host side: a step whose own launches outlast the device's work is not in it. An absolute
    prediction (the device's time does not move with the CPU's speed, as a cap at the CPU's hand-off does), read
    against the row's measured rate; within the noise as :func:`predicted_actions` marks its own."""
    step, now = float(row["step_bound_samples_per_s"]), float(row["samples_per_s"])
    predicted = float(beside["samples_per_s"])
    gain = predicted / now - 1
    device = [beside.get(k) for k in ("device_decode_ms_mean", "device_augment_ms_mean")]
    own = (
        f"; its own device time {sum(device):.1f} ms a batch (decode {device[0]:.1f}, augment {device[1]:.1f}), "
        f"the host's {beside['device_pipeline_host_ms_mean']:.1f} ms"
        if None not in device and beside.get("device_pipeline_host_ms_mean") is not None
        else ""
    )
    return {
        "predicted_samples_per_s": predicted,
        "gain_frac": gain,
        "within_noise": abs(gain) <= 2 * _noise_frac(row),
        "absolute": True,
        "basis": (
            f"the GPU pipeline beside a stand-in for the step (the device kept busy "
            f"{beside.get('stand_in_step_ms') or 0:.1f} ms a batch, the step's own time at {step:,.0f} "
            f"samples/s) ran at {predicted:,.0f} samples/s ({beside.get('trial_id') or 'its cpu_pipeline trial'})"
            f"{own}; against {now:,.0f} now; in turn with the stand-in, a lower bound for the pipeline overlapped"
        ),
    }


def all_cores_as_workers(ev: Evidence) -> list[Candidate]:
    """All cores but the training process's as workers, read off the CPU curve past its last point."""
    from .advice import rate_at_workers  # advice reads the curve; it knows nothing of actions

    row, ws = ev.row, ev.ws
    main = row.get("main_cores_step") if _known(row.get("main_cores_step")) else 1.0
    more = max(int(ev.cores - main), 1)
    if not (ev.device == "cuda" and len(ws) and more > max(ws.max(), row["num_workers"])):  # measured counts speak
        return []
    r = row.copy()
    r["num_workers"], r["cpu_bound_samples_per_s"] = more, rate_at_workers(more, ws, ev.rates, ev.cores).value
    if r["cpu_bound_samples_per_s"] != r["cpu_bound_samples_per_s"]:
        return []
    return [
        Candidate(
            f"num_workers={more} (all cores but the training process's)",
            predict(r, ws, ev.rates, ev.cores)[0],
            "the measured cpu_pipeline curve, extrapolated past its last point",
        )
    ]


# ---- storage ---------------------------------------------------------------------------------


def in_memory(ev: Evidence) -> list[Candidate]:
    """The dataset in RAM: as measured with a memory source of the run, else (the pipeline waited on storage)
    the loader's CPU bound from its stage clocks, else the storage bound removed from the model."""
    swaps = [c for c in _measured_swaps(ev) if c.id == "memory"]
    measured = any(f["kind"] == "memory" for f in _source_facts(ev.trials).values())
    # the model's own (storage bound removed) stays only where neither storage figure gains enough to list
    return swaps + ([] if measured else _ram_from_stage_clocks(ev)) + _remove_storage_bound(ev)


def in_shards(ev: Evidence) -> list[Candidate]:
    return [c for c in _measured_swaps(ev) if c.id == "shards"]


def faster_storage(ev: Evidence) -> list[Candidate]:
    return [c for c in _measured_swaps(ev) if c.id == "faster_storage"]


def _remove_storage_bound(ev: Evidence) -> list[Candidate]:
    if not (_known(ev.bounds.get("io")) and ev.bounds["io"] <= 1.1 * ev.base):
        return []
    r = ev.row.copy()
    r["io_bound_samples_per_s"] = float("nan")
    return [
        Candidate(
            f"{IN_RAM} (source: memory) or move it to faster storage",
            predict(r, ev.ws, ev.rates, ev.cores)[0],
            "storage bound removed; CPU and step bounds as measured",
        )
    ]


def _storage_known(ev: Evidence) -> bool:
    """The row reads one of pipeprof's sources, and the model has a rate and an I/O bound for it."""
    return (
        isinstance(ev.row.get("source"), str)
        and ev.base == ev.base
        and bool(ev.base)
        and _known(ev.bounds.get("io"))
        and "source" in ev.trials
    )


def _match(df: pd.DataFrame, **keys) -> pd.DataFrame:
    for k, v in keys.items():
        if k in df:
            df = df[df[k].isna()] if v is None or (isinstance(v, float) and v != v) else df[df[k] == v]
    return df


def _source_facts(trials: pd.DataFrame) -> dict:
    """source label -> {kind, throttle} from the trials' own columns."""
    facts = {}
    if "source" not in trials:
        return facts
    for label, sub in trials[trials["source"].notna()].groupby("source"):
        first = sub.iloc[0]
        kind = first.get("source_kind")
        facts[label] = {
            "kind": kind if isinstance(kind, str) else str(label).split("-")[0],
            "throttle": first.get("throttle") if isinstance(first.get("throttle"), str) else None,
        }
    return facts


def _state_for(trials: pd.DataFrame, label: str, wanted) -> object:
    """The target source's cache state comparable to the row's: the same if swept, else its only one."""
    states = trials.loc[trials["source"] == label, "cache_state"].dropna().unique() if "cache_state" in trials else []
    if wanted in states:
        return wanted
    return "n/a" if "n/a" in states else (states[0] if len(states) else None)


def _swap_storage(ev: Evidence, label: str) -> Optional[tuple[float, float]]:
    """(predicted samples/s, target io bound) with the row's storage replaced by source ``label``; None if
    unmeasured."""
    trials, row = ev.trials, ev.row
    state = _state_for(trials, label, row.get("cache_state"))
    at = dict(source=label, cache_state=state, batch_size=row["batch_size"])
    io = _match(ok(trials, "storage_fetch"), num_workers=row["num_workers"], **at)
    if io.empty:
        return None
    r = row.copy()
    r["io_bound_samples_per_s"] = float(io["samples_per_s"].iloc[0])
    like = row.copy()
    like["source"], like["cache_state"] = label, state
    ws_t, rates_t = cpu_curve(trials, like)
    if len(ws_t):  # the target's own loader curve (it includes its reads); else the row's CPU figures stand
        here = rates_t[ws_t == row["num_workers"]]
        if len(here):
            r["cpu_bound_samples_per_s"] = float(here[0])
    else:
        ws_t, rates_t = ev.ws, ev.rates
    return predict(r, ws_t, rates_t, ev.cores)[0], r["io_bound_samples_per_s"]


def _measured_swaps(ev: Evidence) -> list[Candidate]:
    """Each other measured source this trial's storage could become, with the action it stands for."""
    if not _storage_known(ev):
        return []
    facts, row, io_now = _source_facts(ev.trials), ev.row, ev.bounds["io"]
    me = facts.get(row["source"], {"kind": None, "throttle": None})
    out = []
    for label, f in facts.items():
        swap = _swap_storage(ev, label) if label != row["source"] else None
        if swap is None:
            continue
        predicted, io_t = swap
        basis = (
            f"storage_fetch {io_t:,.0f} vs {io_now:,.0f} samples/s measured at {workers_text(row['num_workers'])}"
            f" ({label} vs {row['source']}), with {label}'s measured pipeline rate"
        )
        kind = _swap_kind(f, me, io_t, io_now)
        if kind:
            out.append(
                Candidate(
                    _SWAP_WORDS[kind].format(
                        label=label,
                        what=f"emulated {f['throttle']}" if f["throttle"] else "this machine's own, unthrottled",
                    ),
                    predicted,
                    basis,
                    True,
                    kind,
                )
            )
    return out


_SWAP_WORDS = {
    "memory": f"{IN_RAM} (source: memory; measured)",
    "shards": "pack the files into tar shards (`pipeprof pack`) and read them sequentially",
    "faster_storage": "faster storage: as measured with {label} ({what})",
}


def _swap_kind(f: dict, me: dict, io_t: float, io_now: float) -> Optional[str]:
    if f["kind"] == "memory" and not f["throttle"]:
        return "memory"
    if f["kind"] == "shards" and me["kind"] in ("files", "url") and f["throttle"] == me["throttle"]:
        return "shards"
    if (f["kind"] == me["kind"] or {f["kind"], me["kind"]} <= {"files", "url"}) and io_t > io_now:
        return "faster_storage"
    return None


def _ram_from_stage_clocks(ev: Evidence) -> list[Candidate]:
    """Caching in RAM when the measured loader bound waited on storage: the loader's CPU bound then comes from
    its stage clocks (worker CPU per sample) instead."""
    cpu, io, cost = ev.bounds.get("cpu"), ev.bounds.get("io"), stage_cost_s(ev.row)
    if not (_storage_known(ev) and cost and waits_on_storage(cpu, io)):
        return []
    w = max(int(ev.row["num_workers"]), 1)
    r = ev.row.copy()
    r["io_bound_samples_per_s"], r["cpu_bound_samples_per_s"] = float("nan"), w / cost
    ws2, rates2 = np.array([1.0, float(w)]), np.array([1 / cost, w / cost])
    return [
        Candidate(
            f"{IN_RAM} (source: memory) or move it to faster storage",
            predict(r, ws2, rates2, ev.cores)[0],
            f"storage bound removed; the loader's CPU bound from its stage clocks ({cost * 1e6:,.0f} us of "
            "worker CPU per sample), because the measured pipeline waited on storage",
            True,
        )
    ]


def workers_for_latency(ev: Evidence) -> list[Candidate]:
    """More workers when the storage bound binds and raw reads scale with workers."""
    row, io = ev.row, ev.bounds.get("io")
    if not (_storage_known(ev) and io <= 1.1 * ev.base):
        return []
    f = _match(
        ok(ev.trials, "storage_fetch"),
        source=row["source"],
        cache_state=row.get("cache_state"),
        batch_size=row["batch_size"],
    )
    f = f[f["num_workers"] > 0].drop_duplicates("num_workers").sort_values("num_workers")
    cost = stage_cost_s(row)
    if len(f) < 2 or not cost:  # no worker CPU cost measured apart from the waits: cannot tell where the CPU binds
        return []
    (w1, r1), (wm, rm) = f[["num_workers", "samples_per_s"]].iloc[[0, -1]].to_numpy(float)
    eff = (rm / r1) / (wm / w1)
    if eff < LATENCY_SCALING:
        return []
    w2 = int(2 * wm)
    r = row.copy()
    r["num_workers"], r["io_bound_samples_per_s"] = w2, rm * 2 * min(eff, 1.0)
    r["cpu_bound_samples_per_s"] = w2 / cost
    ws2, rates2 = np.array([1.0, float(w2)]), np.array([1 / cost, w2 / cost])  # worker CPU alone, no waits
    return [
        Candidate(
            f"num_workers={w2} to hide storage latency (workers mostly wait on reads)",
            predict(r, ws2, rates2, ev.cores)[0],
            f"raw reads scale {r1:,.0f} -> {rm:,.0f} samples/s from {w1:.0f} to {wm:.0f} workers ({eff:.0%} "
            f"of linear), extrapolated to {w2}; worker CPU {cost * 1e6:,.0f} us/sample from the stage clocks",
            True,
        )
    ]
