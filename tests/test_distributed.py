"""N-GPU trials through torchrun, on the CPU: gloo, real DataLoaders per rank, CPU affinity split.

The GPU form (NCCL, p2p on/off) is the same code with another backend; ``test_two_gpus`` runs it
where two CUDA devices exist.
"""

import contextlib
import io
import json
import os
import socket
import subprocess
import sys
import threading
import time
from dataclasses import asdict

import pandas as pd
import psutil
import pytest
import torch

import pipeprof
from pipeprof import config as C
from pipeprof.analysis.scaling import scaling
from pipeprof.cli import main
from pipeprof.orchestrate.distributed import launch_command, launch_env, split_cpus
from pipeprof.results import load_run
from pipeprof.trials import TrialSpec
from pipeprof.trials.columns import combine_ranks

# these tests check what the ranks record and how it is combined (sums, the slowest rank, efficiency), not a
# rate: two short windows a trial, and no action trial (the 1-GPU group binds on the input side: its action
# trial, 4 s at two pairs of 0.4 s windows, is test_action_trials's; the action settings stay for a run
# that sets actions back)
SMALL = {
    "device": "cpu",
    "stage_timing": False,
    "data": {"images": 64, "classes": 4},
    "augment": {"preset": "light"},
    "loader": {"num_workers": [1], "batch_size": 8},
    "model": {"name": "pipeprof.checks.calibrate:fixed_step_model_5ms", "threads": 1},
    "measure": {
        "window_s": 0.25,
        "windows": 2,
        "max_windows": 2,
        "warmup_max_s": 0.5,
        "redraws": 10,
        "cpu_reference_s": 0,
        "max_trial_s": 30,
        "action_window_s": 0.4,
        "action_pairs": 2,
        "action_max_pairs": 2,
    },
    "actions": "predict",
}


def test_cpus_are_split_evenly_and_contiguously():
    assert split_cpus(list(range(32)), 2) == [list(range(16)), list(range(16, 32))]
    assert split_cpus([0, 1, 2, 3, 4], 2) == [[0, 1, 2], [3, 4]]
    assert split_cpus([0], 2) == [[0], [0]]  # fewer CPUs than ranks: they share


def test_launch_uses_torchrun_and_keeps_nvls_off():
    spec = TrialSpec("end_to_end", num_workers=4, gpus=4, p2p=False)
    one = launch_command(spec, __import__("pathlib").Path("/j"), {"nnodes": 1, "node_rank": 0})
    assert one[1:3] == ["-m", "torch.distributed.run"] and "--nproc-per-node=4" in one and "--standalone" in one
    two = launch_command(
        spec, __import__("pathlib").Path("/j"), {"nnodes": 2, "node_rank": 1, "rdzv_endpoint": "h:29400"}
    )
    assert "--nproc-per-node=2" in two and "--node-rank=1" in two and "--rdzv-endpoint=h:29400" in two
    assert launch_env(spec)["NCCL_P2P_DISABLE"] == "1" and launch_env(spec)["NCCL_NVLS_ENABLE"] == "0"
    on = launch_env(TrialSpec("end_to_end", gpus=2, p2p=True))
    assert "NCCL_P2P_DISABLE" not in on and on["NCCL_NVLS_ENABLE"] == "0"


def test_n_gpu_trials_come_in_job_order_and_join_a_job_of_their_settings(monkeypatch):
    from pipeprof.orchestrate import sweep
    from pipeprof.orchestrate.distributed import job_key, joins

    monkeypatch.setattr(sweep, "usable_cores", lambda: {"usable": 8})
    cfg = C.resolve(
        C.build(
            {
                "distributed": {"gpus": [1, 2, 4], "p2p": ["on", "off"]},
                "trials": ["gpu_ceiling", "cpu_pipeline", "end_to_end"],
                "loader": {"num_workers": [1]},
            }
        ),
        cuda=True,
        bf16_ok=True,
        usable_cores=8,
        gpu_count=4,
    )
    many = [(s.gpus, s.p2p, s.kind) for s in sweep.expand(cfg) if s.gpus > 1]
    # by GPU count, then link: p2p on (with the loaders alone, which send nothing between GPUs), then off
    assert many == [
        (2, True, "gpu_ceiling"),
        (2, None, "cpu_pipeline"),
        (2, True, "end_to_end"),
        (2, False, "gpu_ceiling"),
        (2, False, "end_to_end"),
        (4, True, "gpu_ceiling"),
        (4, None, "cpu_pipeline"),
        (4, True, "end_to_end"),
        (4, False, "gpu_ceiling"),
        (4, False, "end_to_end"),
    ]
    # so 4 jobs: a new one where the GPU count or the link changes
    specs = [TrialSpec(k, gpus=n, p2p=p) for n, p, k in many]
    assert [i for i in range(len(specs)) if i == 0 or not joins(specs[i], job_key(specs[i - 1]))] == [0, 3, 5, 8]
    assert joins(TrialSpec("cpu_pipeline", gpus=2, p2p=None), (2, False))
    assert not joins(TrialSpec("gpu_ceiling", gpus=2, p2p=True), (2, False))


def test_a_rank_takes_the_trials_handed_in_order_and_ends_at_stop_or_without_its_parent(tmp_path):
    from pipeprof.orchestrate.distributed import STOP_FILE, TRIAL_FILE, _handed, _write_atomic

    me = psutil.Process()
    alive = {"pid": me.pid, "started": me.create_time()}
    spec = TrialSpec("end_to_end", num_workers=1, gpus=2, p2p=True)
    _write_atomic(tmp_path / TRIAL_FILE.format(k=0), json.dumps(asdict(spec)))
    later = threading.Timer(
        0.3,
        lambda: _write_atomic(
            tmp_path / TRIAL_FILE.format(k=1), json.dumps(asdict(TrialSpec("cpu_pipeline", num_workers=2, gpus=2)))
        ),
    )
    stop = threading.Timer(0.6, lambda: _write_atomic(tmp_path / STOP_FILE, ""))
    later.start(), stop.start()
    t0 = time.monotonic()
    got = [(s.kind, s.num_workers) for s in _handed(tmp_path, alive)]  # waits for the second, then the stop
    assert got == [("end_to_end", 1), ("cpu_pipeline", 2)] and 0.55 <= time.monotonic() - t0 < 5
    assert not list(tmp_path.glob("*.tmp"))
    # a parent that is gone (here: this process as it would be after a restart, another start time) ends it
    gone = {"pid": os.getpid(), "started": me.create_time() - 1}
    (tmp_path / STOP_FILE).unlink()
    assert [s.kind for s in _handed(tmp_path, gone)] == ["end_to_end", "cpu_pipeline"]  # those already handed


def test_job_row_sums_ranks_and_names_the_slowest():
    base = {"trial_id": "t", "kind": "end_to_end", "status": "ok", "node": "a", "cores": 8, "cpus": "0-7"}
    ranks = [
        base | {"rank": 0, "samples_per_s": 100.0, "data_wait_frac": 0.1, "main_cpu_pct_mean": 90.0},
        base | {"rank": 1, "samples_per_s": 100.2, "data_wait_frac": 0.4, "main_cpu_pct_mean": 80.0, "cpus": "8-15"},
    ]
    row = combine_ranks(ranks, 2)
    assert row["samples_per_s"] == pytest.approx(200.2) and row["samples_per_s_per_gpu"] == pytest.approx(100.1)
    assert row["main_cpu_pct_mean"] == pytest.approx(170.0) and row["data_wait_frac"] == pytest.approx(0.25)
    # rates within 0.5% are a tie (DDP lockstep): the rank that waited longer for data holds the others
    assert row["slowest_rank"] == 1 and "8-15" in row["slowest_rank_why"] and "40%" in row["slowest_rank_why"]
    ranks[0]["samples_per_s"] = 50.0
    assert combine_ranks(ranks, 2)["slowest_rank"] == 0
    assert combine_ranks(ranks[:1], 2)["ranks_reported"] == 1  # one node's share of a two-node job


def test_scaling_efficiency_and_p2p_effect_from_known_rows():
    rows = [
        {"kind": "gpu_ceiling", "model": "m", "gpus": 1, "p2p": None, "samples_per_s": 1000.0},
        {"kind": "gpu_ceiling", "model": "m", "gpus": 2, "p2p": True, "samples_per_s": 1900.0},
        {"kind": "gpu_ceiling", "model": "m", "gpus": 2, "p2p": False, "samples_per_s": 1710.0},
    ]
    df = pd.DataFrame([r | {"status": "ok", "trial_id": f"t{i}"} for i, r in enumerate(rows)])
    on, off = scaling(df)
    assert on["efficiency"] == pytest.approx(0.95) and on["comm_exposed_frac"] == pytest.approx(0.05)
    assert on["p2p_effect"] == pytest.approx(-0.1) and off["efficiency"] == pytest.approx(0.855)


def test_gpu_counts_resolve_and_bad_counts_are_named():
    cfg = C.resolve(C.build({"distributed": {"gpus": "all"}}), cuda=True, bf16_ok=True, usable_cores=64, gpu_count=8)
    assert cfg.distributed.gpus == [1, 2, 4, 8]
    with pytest.raises(C.ConfigError, match="distributed.gpus: 4 asked for, but the job has 2 GPUs"):
        C.resolve(C.build({"distributed": {"gpus": [1, 4]}}), cuda=True, bf16_ok=True, usable_cores=8, gpu_count=2)
    with pytest.raises(C.ConfigError, match="rdzv_endpoint"):
        C.build({"distributed": {"nnodes": 2}})


@pytest.mark.slow
def test_two_process_gloo_run_records_ranks_totals_and_scaling(tmp_path):
    run = pipeprof.run(
        None,
        [f"out_dir={tmp_path}", "trials=[gpu_ceiling,cpu_pipeline,end_to_end]", "distributed.gpus=[1,2]"]
        + _sets(SMALL),
        log=lambda *a: None,
    )
    t, ranks = run.trials.set_index("trial_id"), run.ranks
    jobs = t[t["gpus"] == 2]
    assert len(jobs) == 3 and (jobs["status"] == "ok").all()
    for tid, job in jobs.iterrows():
        mine = ranks[ranks["trial_id"] == tid].sort_values("rank")
        assert list(mine["rank"]) == [0, 1] and mine["cpus"].nunique() == 2  # each rank its own CPU
        assert job["samples_per_s"] == pytest.approx(mine["samples_per_s"].sum())
        assert job["ranks_reported"] == 2 and job["slowest_rank"] in (0, 1)
        assert mine.set_index("rank").loc[int(job["slowest_rank"]), "samples_per_s"] == pytest.approx(
            mine["samples_per_s"].min(), rel=0.006
        )
    # one torchrun job ran the three (one GPU count, p2p on; the loaders-only kind joins it): each rank is one
    # process throughout, and the trials are the job's 0th, 1st and 2nd
    assert (ranks.groupby("rank")["pid"].nunique() == 1).all() and ranks["pid"].nunique() == 2
    assert sorted(jobs["job_trial"]) == [0, 1, 2] and sorted(ranks["job_trial"]) == [0, 0, 1, 1, 2, 2]
    meta = json.loads((run.path / "run.json").read_text())
    (e2e,) = [s for s in meta["analysis"]["scaling"] if s["kind"] == "end_to_end"]
    one = t[(t["gpus"] == 1) & (t["kind"] == "end_to_end")]["samples_per_s"].iloc[0]
    assert e2e["efficiency"] == pytest.approx(e2e["samples_per_s"] / (2 * one))
    assert {g.key["gpus"] for g in load_run(run.path).meta["analysis"]["groups"]} == {1, 2}


@pytest.mark.slow
def test_two_nodes_over_loopback_merge_into_one_job(tmp_path):
    with socket.socket() as s:  # a free port for node 0's rendezvous
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    # one job: end_to_end, whose ranks also all-reduce and share rank 0's clock across the nodes (each kind's
    # rank totals on one node are test_two_process_gloo_run_...'s; a second job here merged the same way)
    sets = _sets(SMALL) + [
        "trials=[end_to_end]",
        "distributed.gpus=[2]",
        "distributed.nnodes=2",
        f"distributed.rdzv_endpoint=127.0.0.1:{port}",
    ]
    args = [
        sum([["--set", x] for x in sets + [f"distributed.node_rank={k}", f"out_dir={tmp_path}/node{k}"]], [])
        for k in (0, 1)
    ]
    # node 1 a `pipeprof run` of its own; node 0 the command in this process, meanwhile (each node's torchrun and
    # rank are real processes either way; a second `pipeprof run` interpreter added 6 s of CPU to its start)
    node1 = subprocess.Popen(
        [sys.executable, "-m", "pipeprof", "run", *args[1]], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
    )
    got: dict = {}
    reader = threading.Thread(target=lambda: got.update(out=node1.communicate(timeout=600)[0]), daemon=True)
    reader.start()  # node 1's output read as it comes: a full pipe would stop it mid-job
    printed = io.StringIO()
    try:
        with contextlib.redirect_stdout(printed):
            code0 = main(["run", *args[0]])
    except BaseException:
        node1.kill()  # not left waiting for its peer
        raise
    finally:
        reader.join(timeout=600)
        if node1.poll() is None:
            node1.kill()
            node1.wait()
    assert [code0, node1.returncode] == [0, 0], (printed.getvalue(), got.get("out"))
    folders = [next((tmp_path / f"node{k}").glob("run-*")) for k in (0, 1)]
    parts = [load_run(f) for f in folders]
    assert all((p.trials["ranks_reported"] == 1).all() and p.trials["partial_job"].notna().all() for p in parts)
    assert sorted(pd.concat([p.ranks for p in parts])["rank"].unique()) == [0, 1]
    # the command in this process (its exit status is the CLI's; a subprocess would add an interpreter's start)
    assert main(["merge", *map(str, folders), "--out-dir", str(tmp_path / "merged")]) == 0
    m = load_run(next((tmp_path / "merged").glob("*-merged-*")))
    assert len(m.trials) == 1
    for _, job in m.trials.iterrows():
        both = pd.concat([p.ranks for p in parts])
        both = both[both["trial_id"] == job["trial_id"]]
        assert job["ranks_reported"] == 2 and job["nodes_reported"] in (1, 2)
        assert job["samples_per_s"] == pytest.approx(both["samples_per_s"].sum())


@pytest.mark.gpu
@pytest.mark.skipif(torch.cuda.device_count() < 2, reason="needs two CUDA devices")
def test_two_gpus(tmp_path):
    run = pipeprof.run(
        None,
        [
            f"out_dir={tmp_path}",
            "device=cuda",
            "distributed.gpus=[1,2]",
            "distributed.p2p=[on,off]",
            "trials=[gpu_ceiling]",
            "model.name=resnet18",
            "loader.batch_size=64",
            "measure.cpu_reference_s=0",
        ],
        log=lambda *a: None,
    )
    two = run.trials[run.trials["gpus"] == 2]
    assert len(two) == 2 and (two["status"] == "ok").all() and set(two["p2p"]) == {True, False}


def _sets(d: dict, prefix: str = "") -> list[str]:
    """A nested dict as --set assignments."""
    out = []
    for k, v in d.items():
        if isinstance(v, dict):
            out += _sets(v, f"{prefix}{k}.")
        else:
            out.append(f"{prefix}{k}={json.dumps(v)}")
    return out


def test_the_answer_for_two_gpus_speaks_per_rank_and_for_the_job():
    from types import SimpleNamespace

    from pipeprof.answer import Answer, CoresNeeded
    from pipeprof.report.summary import answer, group_label

    key = {
        "model": "resnet50",
        "precision": "bf16",
        "mode": "train",
        "preset": "standard",
        "batch_size": 256,
        "source": "files",
        "cache_state": "warm",
        "gpus": 2,
        "p2p": True,
    }
    g = Answer(
        key,
        workers=15,
        samples_per_s=6247.1,
        best_workers=15,
        best_samples_per_s=6247.1,
        verdict="cores-bound",
        cores_needed=CoresNeeded(handoff_limit=7295.0, cores_to_handoff_limit=35),
    )
    one = Answer(
        key | {"gpus": 1, "p2p": None}, workers=15, samples_per_s=6247.1, best_workers=15, best_samples_per_s=6247.1
    )
    curves = [
        {
            **g.key,
            "num_workers": 15,
            "step_bound_samples_per_s": 8891.9,
            "samples_per_s_ci95_low": 6028.0,
            "samples_per_s_ci95_high": 6439.0,
        },
        {**one.key, "num_workers": 15, "step_bound_samples_per_s": 4706.3},
    ]
    run = SimpleNamespace(meta={"config": {"device": "cuda"}, "analysis": {"groups": [g, one], "curves": curves}})
    text = answer(run, g)
    assert "with 15 workers per GPU training runs at 6,247 ± 206 samples/s" in text
    assert "the 2 GPUs alone take 8,892" in text and "in each rank's DataLoader" in text
    assert (
        "no core count keeps these 2 GPUs busy in BF16: 2 loaders (one per GPU) hand off at most (measured) 7,295"
        in text
    )
    assert "2 GPUs" in group_label(g.key) and "GPUs" not in group_label(one.key)


def test_objects_that_ranks_cannot_reach_are_refused_by_name(tmp_path):
    from pipeprof.checks.calibrate import BurnDataset, FixedStepModel

    with pytest.raises(C.ConfigError, match="the dataset, model, loss passed as a Python object"):
        pipeprof.profile(
            BurnDataset(16, 0.001),
            model=FixedStepModel(0.001, num_classes=10),
            batch_size=4,
            device="cpu",
            out_dir=str(tmp_path),
            loss_fn=lambda out, y: out.sum(),
            config={"distributed": {"gpus": [1, 2]}},
            log=lambda *a: None,
        )
    assert not list(tmp_path.glob("*-20*"))  # refused before any run folder
