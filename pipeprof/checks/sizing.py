"""``pipeprof validate --sizing``: check the core-count predictions by measuring them.

A full run on all usable cores predicts, from its measured CPU curve, the end-to-end rate
with fewer cores (``analysis.what_if``) and the cores one GPU needs (``analysis.cores_needed``).
This re-runs the same sweep inside CPU affinity masks of fewer cores and prints predicted vs
measured for each, and the cores-per-GPU each run's own curve gives: a sizing claim that
cannot be checked is a guess.

How a mask is made: ``os.sched_setaffinity`` in the child process before it starts
pipeprof, so the training process and every DataLoader worker it forks are confined to
the mask (no external tool). A mask takes one CPU per physical core (``env.cpu_groups``)
before any SMT sibling, as the scheduler places workers on the unrestricted machine.
Each run is a separate ``python -m pipeprof run`` process writing its own run folder.

Why a bracket beside each mask: the all-cores run and a masked run are minutes apart on shared cores, which move
more than the prediction errs (docs/measured.md, "The size table against CPU masks"). Right before each masked run,
an unmasked run measures the same workloads end to end at the all-cores run's own worker count nearest the mask
(:func:`bracket_count`): the same setting, minutes later. Its ratio to the all-cores run's figure (:func:`moves`) is
how far the machine moved for that very workload, and the prediction scaled by it is the error the model owns
(``error_after_move_frac``). The target is still judged on the raw error; the move attributes, it corrects nothing.
"""

from __future__ import annotations

import math
import os
import subprocess
import sys
from pathlib import Path
from typing import Optional

import pandas as pd
import yaml

from pipeprof.analysis import cores_needed, curves, handoff_limit, main_cpu_s_per_sample, ok, what_if
from pipeprof.analysis import workstation as ws
from pipeprof.analysis.bounds import cores_curve
from pipeprof.answer import CoresNeeded
from pipeprof.env import mask_for
from pipeprof.results import Run, load_run

#: The known-answer sizing config: 10 ms of CPU per sample (100 samples/s per core) feeding a
#: 5 ms step that uses no CPU (1,600 samples/s at batch 8), on the CPU device.
KNOWN = {
    "device": "cpu",
    "trials": ["gpu_ceiling", "cpu_pipeline", "end_to_end"],
    "data": {"kind": "factory", "factory": "pipeprof.checks.calibrate:burn_dataset_10ms"},
    "model": {"name": ["pipeprof.checks.calibrate:fixed_step_model_5ms"], "threads": 1},
    "loader": {"batch_size": [8]},
    "measure": {
        "warmup_batches": 3,
        "warmup_s": 0.5,
        "window_s": 0.75,
        "window_batches": 3,
        "windows": 4,
        "max_windows": 8,
        "cpu_reference_s": 0,
    },
}
TARGET_RATE_ERR = 0.10  # predicted vs measured at each restricted core count
TARGET_CORES_SPREAD = 0.15  # cores-per-GPU from runs at different core counts


def default_core_counts(usable: int) -> list[int]:
    """A quarter and a half of the machine (at least 1, fewer than all)."""
    return sorted({c for c in (usable // 4, usable // 2) if 1 <= c < usable}) or ([1] if usable > 1 else [])


def masked_workers(cores: int, end_to_end_only: bool = False) -> list[int]:
    """Worker counts for a run on ``cores`` CPUs: half of them, all but the training process's, all
    (``end_to_end_only``: the last two, where the best end-to-end rate of a loader-bound run lies)."""
    counts = (cores - 1, cores) if end_to_end_only else (cores // 2, cores - 1, cores)
    return sorted({w for w in counts if w >= 1})


def launch(
    config_path: Path,
    out_dir: Path,
    name: str,
    overrides: list[str],
    cpus: Optional[list[int]],
    env: Optional[dict] = None,
) -> Run:
    """Run ``python -m pipeprof run`` in a child process (inside ``cpus`` when given; ``env``: variables set for it
    beside this process's own); its run folder. Its output goes to ``NAME.log`` in ``out_dir``."""
    log_path = out_dir / f"{name}.log"
    sets = [*overrides, f"out_dir={out_dir}", f"name={name}"]  # the last wins: the run must land where it is looked for
    cmd = [sys.executable, "-m", "pipeprof", "run", str(config_path)] + [a for s in sets for a in ("--set", s)]
    confine = (lambda: os.sched_setaffinity(0, cpus)) if cpus else None  # noqa: E731 - runs in the child
    before = set(out_dir.glob(f"{name}-*"))
    with open(log_path, "w") as log:
        rc = subprocess.run(
            cmd, stdout=log, stderr=subprocess.STDOUT, preexec_fn=confine, env=os.environ | env if env else None
        ).returncode
    new = sorted(set(out_dir.glob(f"{name}-*")) - before)
    if rc != 0 or len(new) != 1:
        raise RuntimeError(f"sizing run {name} failed (exit {rc}); its output is in {log_path}")
    return load_run(new[0])


def bracket_count(full: Run, cores: int) -> Optional[int]:
    """The all-cores run's end-to-end worker count nearest ``cores`` (the lower of two as near), the count its
    bracket re-measures; None where it measured none with workers."""
    e2e = ok(full.trials, "end_to_end")
    counts = sorted({int(w) for w in e2e["num_workers"] if w == w and w >= 1})
    return min(counts, key=lambda w: (abs(w - cores), w)) if counts else None


def moves(full: Run, bracket: Run, workers: int) -> dict:
    """Per workload (``analysis.workstation.label``): the bracket's end-to-end rate at ``workers`` against the
    all-cores run's at the same count, as a fraction (+0.10: the machine ran this workload 10% faster)."""

    def at(run: Run) -> dict:
        cv = curves(run.trials)
        cv = cv[cv["num_workers"] == workers] if len(cv) else cv
        return {ws.label(r): float(r["samples_per_s"]) for _, r in cv.iterrows()}

    before, now = at(full), at(bracket)
    return {k: now[k] / before[k] - 1 for k in now if before.get(k, 0) > 0 and now[k] > 0}


def _after_move(predicted: float, move: Optional[float], got: float) -> float:
    """The prediction's error once the machine's move for its workload is put into it (NaN without one)."""
    if move is None or move != move or not got == got or got <= 0:
        return float("nan")
    return predicted * (1 + move) / got - 1


def _group_row(run: Run) -> Optional[pd.Series]:
    """The best end-to-end trial of the run's first group (a sizing config has one group)."""
    cv = curves(run.trials)
    return cv.loc[cv["samples_per_s"].idxmax()] if len(cv) else None


def _main_s(run: Run) -> float:
    return main_cpu_s_per_sample(curves(run.trials))


def step_rate(run: Run) -> Optional[float]:
    ceiling = ok(run.trials, "gpu_ceiling")
    return float(ceiling["samples_per_s"].iloc[0]) if len(ceiling) else None


def cores_per_gpu(run: Run, step: float) -> CoresNeeded:
    """Cores one GPU needs, from this run's own CPU curve, hand-off limit and training-process CPU."""
    best = _group_row(run)
    if best is None:
        return CoresNeeded(basis="no end-to-end trial")
    cores, rates = cores_curve(run.trials, best, run.meta["machine"]["cores"]["usable"])
    if not (cores > 0).any():
        return CoresNeeded(basis="no cpu_pipeline trial with workers")
    return CoresNeeded.from_dict(
        cores_needed(
            step, cores, rates, _main_s(run), run.meta["machine"]["cores"]["usable"], handoff_limit(run.trials, best)
        )
    )


def predict_at(full: Run, step: float, cores: int) -> dict:
    """The full run's prediction for ``cores`` cores (one GPU, storage as measured)."""
    best = _group_row(full)
    curve, rates = cores_curve(full.trials, best, full.meta["machine"]["cores"]["usable"])
    row = what_if(
        step,
        curve,
        rates,
        _main_s(full),
        full.meta["machine"]["cores"]["usable"],
        None,
        None,
        core_counts=(cores,),
        gpus=(1,),
        storage_mb_s=(None,),
        cap=handoff_limit(full.trials, best),
    )[0]
    return {
        "predicted_samples_per_s": row["predicted_samples_per_s"],
        "binding": row["binding"],
        "extrapolated": row["extrapolated"],
    }


def measured(run: Run) -> dict:
    best = _group_row(run)
    if best is None:
        return {"measured_samples_per_s": float("nan"), "measured_workers": None}
    return {
        "measured_samples_per_s": float(best["samples_per_s"]),
        "measured_workers": int(best["num_workers"]),
        "measured_ci95_low": best.get("samples_per_s_ci95_low"),
        "measured_ci95_high": best.get("samples_per_s_ci95_high"),
    }


def check(
    raw: dict,
    core_counts: list[int],
    out_dir: str | Path,
    overrides: list[str] = (),
    full_run: Optional[str] = None,
    groups: Optional[list[list[int]]] = None,
    progress=lambda text: None,
    end_to_end_only: bool = False,
    bracket: bool = True,
) -> tuple[pd.DataFrame, pd.DataFrame]:
    """One row per core count: the full run's prediction, the masked run's measurement, cores-per-GPU; and
    ``pipeprof size``'s table checked against the same masked runs (:func:`size_check`). ``end_to_end_only``: the
    masked runs measure only the end-to-end rate (at all cores and all but one), the figure the prediction is
    checked by, in about a third of the time; their own cores-per-GPU (which needs their CPU curve) is not made.
    ``bracket``: an unmasked run right before each masked one measures how far the machine moved since the
    all-cores run (module doc)."""
    from pipeprof.env import cpu_groups

    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    config = out / "sizing-config.yaml"
    config.write_text(yaml.safe_dump(raw))
    if full_run:
        full = load_run(full_run)
    else:
        progress("full run on all usable cores")
        full = launch(config, out, "sizing-all", list(overrides), None)
    step = step_rate(full)
    if step is None:
        raise RuntimeError(f"the full run {full.path} has no step ceiling (gpu_ceiling trial): nothing to size against")
    all_cores = int(full.meta["machine"]["cores"]["usable"])
    rows = [{"cores": all_cores, "cpus": "all", "run": str(full.path), **measured(full), **_need(full, step)}]
    masked: dict = {}
    moved: dict = {}  # cores -> {workload: the machine's move since the all-cores run}
    for c in core_counts:
        cpus = mask_for(c, groups or cpu_groups())
        if len(cpus) < c:
            raise ValueError(f"--cores {c}: this process may use only {len(cpus)} CPUs")
        k = bracket_count(full, c) if bracket else None
        if k is not None:
            progress(f"all cores at {k} workers (the bracket before the {c}-core mask)")
            sets = [*overrides, f"loader.num_workers=[{k}]", "trials=[end_to_end]"]
            moved[c] = moves(full, launch(config, out, f"sizing-bracket-{c}", sets, None), k)
        progress(f"{c} cores (CPUs {','.join(map(str, cpus))})")
        workers = ",".join(map(str, masked_workers(c, end_to_end_only)))
        kinds = "end_to_end" if end_to_end_only else "cpu_pipeline,end_to_end"
        run = launch(
            config, out, f"sizing-{c}", [*overrides, f"loader.num_workers=[{workers}]", f"trials=[{kinds}]"], cpus
        )
        need = NOT_MEASURED if end_to_end_only else _need(run, step)
        got = _masked_row(full, run, step, c, moved.get(c, {}))
        rows.append({"cores": c, "cpus": ",".join(map(str, cpus)), "run": str(run.path), **got, **need})
        masked[c] = run
    return pd.DataFrame(rows), size_check(full, masked, moved)


def _masked_row(full: Run, run: Run, step: float, cores: int, moved: dict) -> dict:
    """A masked run's measurement beside the all-cores run's prediction for its cores, their error, and what the
    machine may own of it (the CPU references' move; the bracket's for the prediction's workload, ``moved``)."""
    got = measured(run) | predict_at(full, step, cores)
    got["rate_error_frac"] = got["predicted_samples_per_s"] / got["measured_samples_per_s"] - 1
    got["core_speed_move_frac"] = core_speed_move(full, run)
    best = _group_row(full)
    got["move_frac"] = moved.get(ws.label(best)) if best is not None else None
    got["error_after_move_frac"] = _after_move(
        got["predicted_samples_per_s"], got["move_frac"], got["measured_samples_per_s"]
    )
    return got


def core_speed_move(full: Run, run: Run) -> Optional[float]:
    """How much faster (+) or slower one core of the machine ran at ``run``'s start than at ``full``'s: their CPU
    references' one-process decode rates (``compare.reference_rate``), None where either run has none. Masked
    runs are minutes apart on shared cores, which move more than the prediction errs (docs/measured.md): this says
    how much of an error the machine may own; it corrects nothing."""
    from pipeprof.analysis.compare import reference_rate

    a, b = (reference_rate(r.meta, processes=1, at=("start",)) for r in (full, run))
    return b / a - 1 if a and b else None


def size_check(full: Run, masked: dict, moved: Optional[dict] = None) -> pd.DataFrame:
    """``pipeprof size``'s table checked against masked runs (``masked``: cores -> its run): per workload of the
    all-cores run and per masked core count, the candidate of that many cores and one GPU as
    ``analysis.workstation.predict`` gives it (samples/s with its interval, binding, extrapolated) beside the best
    end-to-end rate the masked run measured for that workload; with ``moved`` (cores -> workload -> the bracket's
    move, :func:`moves`) the error after that move too."""
    loads = ws.workloads(full, skipped=True)
    rows = []
    for cores, run in masked.items():
        best, move = _best_per_workload(run), core_speed_move(full, run)
        for w in loads:
            p = ws.predict(w, ws.Candidate(f"{cores} cores", int(cores)))
            m = best.get(w.label)
            got = float(m["samples_per_s"]) if m is not None else float("nan")
            mv = (moved or {}).get(cores, {}).get(w.label)
            rows.append(
                {
                    "workload": w.label,
                    "cores": int(cores),
                    "predicted_samples_per_s": p["samples_per_s"],
                    "predicted_low": p["samples_per_s_low"],
                    "predicted_high": p["samples_per_s_high"],
                    "binding": p["binding"],
                    "extrapolated": p["extrapolated"],
                    "measured_samples_per_s": got,
                    "measured_workers": None if m is None else int(m["num_workers"]),
                    "error_frac": p["samples_per_s"] / got - 1 if got == got and got > 0 else float("nan"),
                    "within_interval": bool(p["samples_per_s_low"] <= got <= p["samples_per_s_high"])
                    if got == got
                    else None,  # nothing measured: neither
                    "core_speed_move_frac": move,
                    "move_frac": mv,
                    "error_after_move_frac": _after_move(p["samples_per_s"], mv, got),
                    **split(p, w.main_s, m),
                }
            )
    return pd.DataFrame(rows)


def split(predicted: dict, main_s: float, got: Optional[pd.Series]) -> dict:
    """A CPU-bound prediction's error in its two factors. The model gives the workers the cores the training
    process leaves (``cores - main_s x P``) and reads the rate off the curve, i.e. at the curve's CPU per sample
    there; the masked run measured the cores its workers got (their CPU) and its rate. So predicted / measured =
    (cores the model gave / cores the workers got) x (CPU per sample in the mask / the model's): the first is the
    model's own accounting of cores, the second each sample costing more or less CPU than the curve said (a
    machine that moved, or work that costs more on fewer cores; on shared cores it moves more than the target
    within minutes: docs/measured.md, "The size table's error in its two factors"): it says which factor an error
    comes from, and corrects nothing. NaN where the prediction binds on the GPU or hand-off, or the mask's CPU was
    not read."""
    nan = float("nan")
    out = {k: nan for k in ("worker_cores_model", "worker_cores_got", "cpu_ms_model", "cpu_ms_got")}
    rate = predicted["samples_per_s"]
    cpu = None if got is None else got.get("workers_cpu_pct_mean")
    if predicted["binding"] != "cpu" or not rate or cpu is None or cpu != cpu or not got["samples_per_s"] > 0:
        return out | {"cores_error_frac": nan, "cost_move_frac": nan}
    model = predicted["cores"] - main_s * rate
    mine = float(cpu) / 100
    out |= {
        "worker_cores_model": model,
        "worker_cores_got": mine,
        "cpu_ms_model": 1e3 * model / rate,
        "cpu_ms_got": 1e3 * mine / float(got["samples_per_s"]),
    }
    return out | {
        "cores_error_frac": model / mine - 1,
        "cost_move_frac": out["cpu_ms_got"] / out["cpu_ms_model"] - 1,
    }


def split_summary(size: pd.DataFrame) -> Optional[dict]:
    """The size check's largest factors (:func:`split`) over its CPU-bound rows: the model's cores accounting and
    each sample's CPU move, signed at their largest magnitude; None where no row was split."""
    if size.empty or "cores_error_frac" not in size:
        return None
    rows = size.dropna(subset=["cores_error_frac", "cost_move_frac"])
    if rows.empty:
        return None
    return {k: float(rows[k].loc[rows[k].abs().idxmax()]) for k in ("cores_error_frac", "cost_move_frac")}


def _best_per_workload(run: Run) -> dict:
    """The best end-to-end row of each workload of a run, by ``analysis.workstation.label``."""
    cv = curves(run.trials)
    out: dict = {}
    for _, r in cv.iterrows():
        label = ws.label(r)
        if label not in out or r["samples_per_s"] > out[label]["samples_per_s"]:
            out[label] = r
    return out


#: a masked run's cores-per-GPU where it measured no CPU curve (``end_to_end_only``): left out of the spread
NOT_MEASURED = {
    "cores_per_gpu": None,
    "cores_per_gpu_basis": "not measured (end-to-end only: no CPU curve of its own)",
    "handoff_limit_samples_per_s": None,
}


def _need(run: Run, step: float) -> dict:
    need = cores_per_gpu(run, step)
    return {
        "cores_per_gpu": need.cores,
        "cores_per_gpu_basis": need.basis,
        "handoff_limit_samples_per_s": need.handoff_limit,
    }


def summary(df: pd.DataFrame) -> dict:
    """The two figures the check is judged by, against their targets. A masked run without a
    measurement fails the check; runs that all find the ceiling unreachable (hand-off limit) agree. The spread is
    None where fewer than two runs made a cores-per-GPU (masked runs end-to-end only), and not judged."""
    masked = df.iloc[1:]
    errors = masked["rate_error_frac"].abs() if "rate_error_frac" in masked else pd.Series(dtype=float)
    made = df[df["cores_per_gpu_basis"] != NOT_MEASURED["cores_per_gpu_basis"]]
    needs = pd.to_numeric(made["cores_per_gpu"], errors="coerce")
    if len(needs) < 2:
        spread = None
    elif needs.isna().all():
        spread = 0.0  # every run says no core count reaches the ceiling: the same answer
    elif needs.isna().any():
        spread = math.inf  # some runs say a number, others that none suffices
    else:
        spread = (needs.max() - needs.min()) / needs.min()
    measured_all = len(errors) > 0 and errors.notna().all()
    after = masked["error_after_move_frac"].abs() if "error_after_move_frac" in masked else pd.Series(dtype=float)
    return {
        "max_rate_error_frac": float(errors.max()) if measured_all else None,
        # attributes, not judged: the largest error left once each mask's bracket move is put in (None: no bracket)
        "max_error_after_move_frac": float(after.max()) if len(after) and after.notna().all() else None,
        "cores_per_gpu_spread_frac": None if spread is None else float(spread),
        "passed": bool(
            measured_all
            and errors.max() <= TARGET_RATE_ERR
            and (spread is None or spread <= TARGET_CORES_SPREAD + 1e-9)
        ),
    }
