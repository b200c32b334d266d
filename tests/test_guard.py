"""The CI guard (``pipeprof compare BASE NEW --fail-if-slower``) on two recorded runs of known content: copies of
a stored CPU run whose rates, intervals and window rates are set to known values, so each verdict is known."""

import json
import shutil
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from pipeprof.analysis.guard import guard, lines
from pipeprof.cli import main
from pipeprof.results import load_run

DATA = Path(__file__).parent / "data" / "run-cpu-files"
SPREAD = np.array([0.97, 1.0, 1.03, 0.99, 1.01])  # each trial's five windows around its rate: CV 2.3%


def _run(tmp: Path, name: str, scale: float = 1.0, spread=SPREAD, machine: dict | None = None) -> Path:
    """A copy of the stored run whose every trial ran at ``scale`` times its stored rate, in windows ``spread``
    around it; ``machine``: fields of the machine snapshot changed."""
    dst = tmp / name
    shutil.copytree(DATA, dst)
    t = pd.read_parquet(dst / "trials.parquet")
    rate = t["samples_per_s"] * scale
    windows = [list(r * spread) if r == r else None for r in rate]
    t["window_rates"] = windows
    t["samples_per_s"] = [float(np.median(w)) if w else np.nan for w in windows]
    half = [2.776 * float(np.std(w, ddof=1)) / np.sqrt(len(w)) if w else np.nan for w in windows]
    t["samples_per_s_ci95_low"] = [float(np.mean(w)) - h if w else np.nan for w, h in zip(windows, half)]
    t["samples_per_s_ci95_high"] = [float(np.mean(w)) + h if w else np.nan for w, h in zip(windows, half)]
    t.to_parquet(dst / "trials.parquet")
    if machine:
        meta = json.loads((dst / "run.json").read_text())
        meta["machine"] |= machine
        (dst / "run.json").write_text(json.dumps(meta))
    return dst


def test_a_drop_inside_the_runs_noise_passes(tmp_path):
    g = guard(load_run(_run(tmp_path, "base")), load_run(_run(tmp_path, "new", 0.98)), 0.05)
    assert g.verdict == "within noise" and not g.failed and g.changes
    # every trial: -2%, its interval from the two sets of windows (CV 2.3% each, 5 windows: t 2.776)
    assert all(c.change_frac == pytest.approx(-0.02) and c.low_frac < -0.02 < c.high_frac for c in g.changes)
    assert all(c.basis == "windows (5 and 5)" for c in g.changes)
    assert lines(g)[0].startswith("within noise: none of")


def test_a_drop_beyond_threshold_and_noise_fails_and_says_by_how_much(tmp_path, capsys):
    base, new = _run(tmp_path, "base"), _run(tmp_path, "new", 0.8)
    code = main(["compare", str(base), str(new), "--fail-if-slower", "--html", str(tmp_path / "c.html")])
    out = capsys.readouterr().out
    assert code == 1
    assert "guard: slower:" in out and "-20.0% (" in out and "beyond the 5% threshold and the runs' noise" in out
    # a threshold wider than the drop: slower beyond the noise, but within the threshold, passes
    code = main(["compare", str(base), str(new), "--fail-if-slower", "25", "--html", str(tmp_path / "c.html")])
    assert code == 0 and "slower beyond the noise but within the 25% threshold" in capsys.readouterr().out


def test_noisy_windows_keep_a_drop_past_the_threshold_inside_the_noise(tmp_path):
    wide = np.array([0.7, 1.0, 1.3, 0.8, 1.2])  # CV 22%: a -8% change cannot be told from noise
    g = guard(load_run(_run(tmp_path, "base", 1.0, wide)), load_run(_run(tmp_path, "new", 0.92, wide)), 0.05)
    assert g.verdict == "within noise" and all(c.change_frac < -0.05 and c.high_frac > 0 for c in g.changes)


def test_the_machines_drift_widens_the_interval(tmp_path):
    base, new = load_run(_run(tmp_path, "base")), load_run(_run(tmp_path, "new", 0.85))
    assert guard(base, new, 0.05).failed  # -15%, the same CPU reference in both
    # the new run's CPU reference decoded 20% slower: its cores were slower, so the change with that taken out
    # (0.85 / 0.8: +6%) is inside the interval too, and the drop is not shown beyond the noise
    for end in ("start", "end"):
        for point in new.meta["cpu_reference"][end]["points"]:
            point["decodes_per_s"] *= 0.8
    g = guard(base, new, 0.05)
    assert not g.failed and all("widened by the CPU references' drift (-20.0%)" in c.basis for c in g.changes)
    assert all(c.high_frac > 0.05 for c in g.changes)


def test_the_spread_of_pooled_runs_widens_the_windows_interval(tmp_path):
    """Each side pooled two runs (bench regress): tight windows say -8% beyond the noise, but whole runs of one
    side moved 10% apart, so the change is not shown beyond the runs' noise."""

    def pooled(name: str, scale: float, runs: list) -> object:
        run = load_run(_run(tmp_path, name, scale))
        run.trials["run_rates"] = [[r * k for k in runs] if r == r else None for r in run.trials["samples_per_s"]]
        return run

    tight = guard(load_run(_run(tmp_path, "b0")), load_run(_run(tmp_path, "n0", 0.92)), 0.05)
    assert tight.failed and all(c.basis == "windows (5 and 5)" for c in tight.changes)
    g = guard(pooled("base", 1.0, [0.95, 1.05]), pooled("new", 0.92, [0.95, 1.05]), 0.05)
    assert not g.failed and all(c.high_frac > 0 for c in g.changes)
    assert all(c.basis == "windows (5 and 5), widened by the runs' spread (2 and 2 runs)" for c in g.changes)
    # runs 3% apart, both sides' degrees of freedom (t 4.30, not 12.7 at one run's): a -15% drop still fails
    drop = guard(pooled("b3", 1.0, [0.985, 1.015]), pooled("n3", 0.85, [0.985, 1.015]), 0.05)
    assert drop.failed and all(c.high_frac < 0 for c in drop.changes)
    steady = guard(pooled("b2", 1.0, [1.0, 1.0001]), pooled("n2", 0.92, [1.0, 1.0001]), 0.05)
    assert steady.failed and all(c.basis == "windows (5 and 5)" for c in steady.changes)  # runs agree: windows'


def test_runs_from_two_machines_are_refused_without_the_flag(tmp_path, capsys):
    base, new = _run(tmp_path, "base"), _run(tmp_path, "new", 0.8, machine={"cpu_model": "Intel Xeon"})
    code = main(["compare", str(base), str(new), "--fail-if-slower", "--html", str(tmp_path / "c.html")])
    out = capsys.readouterr().out
    assert code == 2 and "guard: other machine: the runs' machines differ (machine.cpu_model: AMD EPYC vs Intel" in out
    code = main(
        [
            "compare",
            str(base),
            str(new),
            "--fail-if-slower",
            "--allow-other-machine",
            "--html",
            str(tmp_path / "c.html"),
        ]
    )
    out = capsys.readouterr().out
    assert code == 1 and "note: the runs come from different machines" in out


def test_the_guard_takes_two_runs_and_a_percentage(tmp_path, capsys):
    base = str(_run(tmp_path, "base"))
    assert main(["compare", base, base, base, "--fail-if-slower"]) == 2
    assert "--fail-if-slower compares two runs, BASE NEW" in capsys.readouterr().err
    assert main(["compare", base, base, "--fail-if-slower", "150"]) == 2
    assert "threshold in percent from 0 to 100 (got 2 runs, 150%)" in capsys.readouterr().err


def test_trial_ids_are_unique_where_presets_hand_the_step_different_inputs_and_old_shared_ids_do_not_crash(tmp_path):
    """light hands uint8, standard float32: the step's own trial ran once per input under one id before."""
    from pipeprof import config as C
    from pipeprof.orchestrate.sweep import expand

    cfg = C.resolve(
        C.build({"augment": {"preset": ["standard", "light"]}, "out_dir": str(tmp_path)}),
        cuda=False,
        bf16_ok=False,
        usable_cores=2,
    )
    ids = [s.trial_id for s in expand(cfg)]  # each preset probed for what it hands the step
    assert len(ids) == len(set(ids)) and sum(i.startswith("gpu_ceiling/") for i in ids) == 2
    assert any(i.startswith("gpu_ceiling/") and "/uint8/" in i for i in ids)
    # a stored run from before, two trials under one id: read without their windows, not as each other's
    old = load_run(_run(tmp_path, "old"))
    twin = old.trials[old.trials["kind"] == "gpu_ceiling"].iloc[:1].assign(input_dtype="uint8")
    old.trials = pd.concat([old.trials, twin], ignore_index=True)
    g = guard(old, load_run(_run(tmp_path, "new", 0.98)), 0.05)
    assert g.verdict == "within noise" and g.changes
