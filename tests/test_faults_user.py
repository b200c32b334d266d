"""Faults a user meets, on real things: a folder that cannot be written, a damaged run folder.

Each test asserts the message the user reads, the exit status, and what is kept on disk. Older cases of the
same kind are in test_user_faults.py. The tests run as root, where a chmod does not stop a write: a path under a
regular file (``afile/sub``) is one that no user can create.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path


def _pipeprof(*args: str, cwd: Path) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "pipeprof", *args], cwd=cwd, capture_output=True, text=True, timeout=120
    )


def test_watch_checks_its_out_dir_before_the_job_starts(tmp_path):
    """The job does not run (its marker file is never written) when the run folder could not be kept."""
    (tmp_path / "afile").write_text("a regular file, not a folder")
    bad = tmp_path / "afile" / "sub"
    job = [sys.executable, "-c", "open('ran', 'w').write('the job ran')"]
    cmd = [sys.executable, "-m", "pipeprof", "watch", "--out-dir", str(bad), "--", *job]
    done = subprocess.run(cmd, cwd=tmp_path, capture_output=True, text=True, timeout=120)
    assert done.returncode == 2, done.stderr
    assert f"out_dir: {bad} cannot hold run folders: a file stands where a folder of its path should be" in (
        done.stderr
    )
    assert "Traceback" not in done.stderr
    assert not (tmp_path / "ran").exists()  # nothing was started, so nothing measured was lost
    assert not bad.exists()


def _copy(run_dir: Path, tmp_path: Path, name: str) -> Path:
    dst = tmp_path / name
    shutil.copytree(run_dir, dst)
    return dst


def test_compare_names_a_truncated_trial_table(cpu_run_dir, tmp_path):
    good = _copy(cpu_run_dir, tmp_path, "good")
    cut = _copy(cpu_run_dir, tmp_path, "cut")
    table = cut / "trials.parquet"
    table.write_bytes(table.read_bytes()[: table.stat().st_size // 2])  # a copy cut off halfway
    done = _pipeprof("compare", str(good), str(cut), "--html", str(tmp_path / "cmp.html"), cwd=tmp_path)
    assert done.returncode == 2, done.stdout + done.stderr
    assert f"{table}: cannot be read" in done.stderr
    assert "differ only" not in done.stdout + done.stderr and "Traceback" not in done.stderr
    assert table.stat().st_size > 0  # the damaged file is left as it was, for the user to look at


def test_report_names_run_json_and_a_null_config(cpu_run_dir, tmp_path):
    run = _copy(cpu_run_dir, tmp_path, "run")
    meta = json.loads((run / "run.json").read_text())
    meta["config"] = None
    (run / "run.json").write_text(json.dumps(meta))
    done = _pipeprof("report", str(run), cwd=tmp_path)
    out = done.stdout + done.stderr
    assert "Traceback" not in out and "AttributeError" not in out
    assert f'{run / "run.json"}: the field "config" is null, expected a JSON object' in out
    assert done.returncode in (0, 2)
    assert (run / "trials.parquet").is_file()  # the measurements stay
