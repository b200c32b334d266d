"""``pipeprof bench watch-overhead``: a run's rate read from its progress lines as they arrive, on a
script of known step cost, plain and watched; the pure parts on stamped lines of known timing."""

import textwrap

import pytest

from pipeprof.checks.watch_overhead import overhead, progress_rate, render_watch_overhead, watch_overhead

SCRIPT = textwrap.dedent("""
    import argparse, time
    import torch
    from torch.utils.data import DataLoader, TensorDataset

    p = argparse.ArgumentParser()
    p.add_argument("--steps", type=int)
    steps = p.parse_args().steps
    loader = DataLoader(TensorDataset(torch.zeros(64, 4), torch.zeros(64)), batch_size=8)
    step = 0
    while step < steps:
        for x, y in loader:
            time.sleep(0.02)  # a step of known cost: 50 steps/s
            step += 1
            if step % 10 == 0:
                print(f"step {step} loss 0.0", flush=True)
            if step >= steps:
                break
""")


def test_progress_rate_reads_the_steps_between_the_first_and_last_progress_line():
    lines = [
        (0.5, "loading\n"),
        (3.0, "step 10 loss 1.0\n"),
        (4.0, "step 20 loss 0.9\n"),
        (5.0, "epoch done\n"),
        (5.5, "step 40 loss 0.8\n"),
    ]
    r = progress_rate(lines)
    assert r["steps_per_s"] == pytest.approx(30 / 2.5) and r["timed_steps"] == 30 and r["first_progress_s"] == 3.0
    assert r["interval_rates_cv"] == pytest.approx(abs(10 - 20 / 1.5) / ((10 + 20 / 1.5) / 2) / 2**0.5)
    assert progress_rate([(1.0, "it 5"), (2.0, "it 9")], r"\bit (\d+)")["steps_per_s"] == pytest.approx(4.0)
    with pytest.raises(ValueError, match="1 progress line"):
        progress_rate([(1.0, "step 10\n"), (2.0, "done\n")])


def test_overhead_is_the_mean_of_each_pairs_cost_with_its_interval():
    import pandas as pd

    df = pd.DataFrame(
        [
            {"pair": 1, "mode": "plain", "steps_per_s": 10.0, "interval_rates_cv": 0.01},
            {"pair": 1, "mode": "watched", "steps_per_s": 9.8, "interval_rates_cv": 0.02},
            {"pair": 2, "mode": "watched", "steps_per_s": 10.0, "interval_rates_cv": 0.01},
            {"pair": 2, "mode": "plain", "steps_per_s": 10.0, "interval_rates_cv": None},
        ]
    )
    o = overhead(df)
    assert o["costs"] == pytest.approx([0.02, 0.0]) and o["mean"] == pytest.approx(0.01)
    assert o["ci95_low"] < 0.0 < 0.02 < o["ci95_high"]  # two pairs: t = 12.7
    assert "| 1 | 10.00 | 9.80 | +2.00% | 1.0% / 2.0% |" in render_watch_overhead(df)


@pytest.mark.one_core  # a 20 ms sleep a step
@pytest.mark.slow
def test_a_script_of_known_step_cost_plain_and_watched(tmp_path):
    """50 steps/s by construction (a 20 ms sleep per step): both modes read it from the progress lines,
    the watched one through ``pipeprof watch``; the start-up before the first progress line is outside."""
    script = tmp_path / "train.py"
    script.write_text(SCRIPT)
    df = watch_overhead(str(script), steps=60, repeats=1, out_dir=str(tmp_path / "bench"), log=lambda s: None)
    assert list(df["mode"]) == ["plain", "watched"] and set(df["timed_steps"]) == {50}
    for rate in df["steps_per_s"]:
        assert rate == pytest.approx(50.0, rel=0.15)
    assert (df["first_progress_s"] > 0.2).all()  # python and torch started before the first line
    assert list((tmp_path / "bench").glob("watch-overhead-*/runs/watch-*/run.json"))  # the watched run was recorded


def test_a_script_that_prints_no_progress_is_refused_with_what_to_print(tmp_path):
    script = tmp_path / "quiet.py"
    script.write_text("import sys\nprint('done')\n")
    with pytest.raises(ValueError, match="print e.g. 'step 50'"):
        watch_overhead(str(script), steps=5, repeats=1, out_dir=str(tmp_path), log=lambda s: None)
    assert (next(tmp_path.glob("watch-overhead-*")) / "plain.log").read_text() == "done\n"  # its output kept
