"""``pipeprof bench regress CONFIG --against RUN_DIR``: an old run's own config run again beside CONFIG, A B B A,
through the CI guard. Real runs of pipeprof's own pipeline (the loader alone, no worker processes, a few windows):
the same config is within noise; a costlier preset (the ``heavy`` preset against ``light``: several times the CPU
per sample) is slower beyond any noise these runs have."""

import pytest
import yaml

from pipeprof.cli import main

SETS = {
    "data": {"images": 16, "classes": 2},
    "name": "regress",
    "trials": ["cpu_pipeline"],
    "loader": {"num_workers": [0], "batch_size": 4},
    "stage_timing": False,
    "measure": {
        "warmup_s": 0.1,
        "warmup_max_s": 0.5,
        "window_s": 0.1,
        "windows": 4,
        "max_windows": 4,
        "redraws": 0,
        "cpu_reference_s": 0,
    },
}


def _config(tmp_path, preset: str) -> str:
    path = tmp_path / f"{preset}.yaml"
    cfg = SETS | {"augment": {"preset": preset}, "data": SETS["data"] | {"cache_dir": str(tmp_path / "ds")}}
    path.write_text(yaml.safe_dump(cfg | {"out_dir": str(tmp_path / "out")}))
    return str(path)


@pytest.mark.alone
@pytest.mark.slow
def test_an_old_runs_config_runs_again_beside_the_new_one_and_the_guard_reads_them(tmp_path, capsys):
    light = _config(tmp_path, "light")
    assert main(["run", light]) == 0
    base = next((tmp_path / "out").glob("regress-*"))
    capsys.readouterr()
    out_dir = str(tmp_path / "bench")
    # A B B A twice by default: with one cycle (2 runs a side) the machine slowing over the middle two runs reads as
    # a change that neither the windows nor the runs' spread can show is noise (a suite run read -14.4% (-23.5% …
    # -4.2%), the runs' spread no wider than the windows'); with two cycles such a dip falls on some runs of a side
    assert main(["bench", "regress", light, "--against", str(base), "--out-dir", out_dir]) == 0
    out = capsys.readouterr().out
    assert out.count(" base ") == 4 and out.count(" new ") == 4  # A B B A A B B A
    assert "guard: within noise" in out
    # A B B A twice (--repeats 2): each run is 0.4 s of windows, and with two runs a side one disturbed run (a
    # second of the shared machine's load) widens the runs' spread past a 45% change (t with 2 degrees of
    # freedom: 4.3); a CI run read "within noise" so. Four runs a side read it with 6.
    heavy = _config(tmp_path, "heavy")
    code = main(["bench", "regress", heavy, "--against", str(base), "--out-dir", out_dir, "--repeats", "2"])
    out = capsys.readouterr().out
    assert code == 1 and "guard: slower: 1 of 1 matching trials" in out
    assert "beyond the 5% threshold and the runs' noise [windows (16 and 16)" in out  # (and the runs' spread)
