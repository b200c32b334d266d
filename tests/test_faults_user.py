"""Faults a user meets, on real things: a folder that cannot be written, a damaged run folder.

Each test asserts the message the user reads, the exit status, and what is kept on disk. Older cases of the
same kind are in test_user_faults.py. The tests run as root, where a chmod does not stop a write: a path under a
regular file (``afile/sub``) is one that no user can create.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import sysconfig
from pathlib import Path

import pandas as pd
import pytest

from test_user_faults import QUICK


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


def test_a_zero_byte_jpeg_is_a_bad_sample_for_every_decoder(tiny_dataset, tmp_path):
    """OpenCV 5 raises on an empty buffer (4.x returned None): the file is a bad sample counted and named, as
    Pillow's path counts it, and the run answers instead of failing every trial."""
    import cv2

    from pipeprof.data.decode import DecodeError, get_decoder

    for name in ("pil", "cv2"):  # the class: every decoder's failure is a DecodeError
        with pytest.raises(DecodeError, match="cannot decode 0 bytes"):
            get_decoder(name)(b"")
    root = tmp_path / "data"
    shutil.copytree(tiny_dataset, root)
    (root / "class_000" / "empty.jpg").write_bytes(b"")
    out = tmp_path / "out"
    sets = [*QUICK, "data.kind=folder", f"data.path={root}", f"out_dir={out}", "data.max_bad_frac=0.5"]
    sets += ["data.decoder=cv2", "trials=[cpu_pipeline]", "loader.num_workers=[0]", "augment.preset=light"]
    done = _pipeprof("run", *[a for s in sets for a in ("--set", s)], cwd=tmp_path)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "Traceback" not in done.stdout + done.stderr and "imdecode_" not in done.stderr
    (folder,) = out.glob("t-*")
    rows = pd.read_parquet(folder / "trials.parquet")
    assert (rows["status"] == "ok").all() and cv2.__version__
    assert all(r.bad_samples >= 1 and "empty.jpg" in r.bad_samples_first for r in rows.itertuples())


def test_check_data_names_a_png_named_jpg(tiny_dataset, tmp_path, capsys):
    """A PNG named .jpg decodes on the CPU but not on a JPEG-only GPU decoder (nvJPEG): the scan names it."""
    from PIL import Image

    from pipeprof.cli import main

    root = tmp_path / "data"
    shutil.copytree(tiny_dataset, root)
    Image.new("RGB", (32, 24), (200, 10, 10)).save(root / "class_001" / "really_png.jpg", format="PNG")
    assert main(["check-data", str(root)]) in (0, 1)
    printed = capsys.readouterr().out
    assert "1 named as another format" in printed
    assert f"misnamed: {root / 'class_001' / 'really_png.jpg'}: PNG named .jpg" in printed


WORKER_RAISES = """
import torch
from torch.utils.data import DataLoader, Dataset


class Broken(Dataset):
    def __len__(self):
        return 64

    def __getitem__(self, i):
        if i == 9:
            raise ValueError("sample 9 is broken: " + "x" * 600)  # BROKEN_LINE
        return torch.zeros(3)


for batch in DataLoader(Broken(), batch_size=4, num_workers=1):
    pass
"""


def test_the_users_exception_in_a_worker_keeps_their_frame_type_and_whole_message(tmp_path):
    """The DataLoader re-raises a worker's exception in the main process: run.json and the console name the
    user's line in the worker, its type and its whole message (not pipeprof's hook frame, not cut at 500)."""
    script = tmp_path / "train.py"
    script.write_text(WORKER_RAISES)
    line = WORKER_RAISES.splitlines().index(next(x for x in WORKER_RAISES.splitlines() if "BROKEN_LINE" in x)) + 1
    done = _pipeprof("watch", "--out-dir", str(tmp_path / "out"), "--", sys.executable, str(script), cwd=tmp_path)
    assert done.returncode != 0  # the job's own failure stays its failure
    assert "Traceback" in done.stderr and "sample 9 is broken" in done.stderr  # the user's traceback as Python prints
    (folder,) = (tmp_path / "out").glob("*")
    (exc,) = json.loads((folder / "run.json").read_text())["exceptions"]
    assert exc["type"] == "ValueError" and exc["message"] == "sample 9 is broken: " + "x" * 600
    assert exc["where"] == f"{script}:{line}"
    assert "pipeprof" not in exc["where"] and "pipeprof" not in (exc["raised_at"] or "")
    assert "the job raised ValueError: sample 9 is broken" in done.stdout + done.stderr
    assert f"{script}:{line}" in done.stdout + done.stderr


def test_exception_facts_read_a_workers_traceback_from_the_message():
    from pipeprof.watch.sites import exception_facts

    text = (
        "Caught KeyError in DataLoader worker process 0.\nOriginal Traceback (most recent call last):\n"
        '  File "/site-packages/torch/utils/data/_utils/worker.py", line 349, in _worker_loop\n'
        "    data = fetcher.fetch(index)\n"
        '  File "/home/me/data.py", line 12, in __getitem__\n    return self.items[i]\n'
        "KeyError: 'img_9'\n"
    )
    facts = exception_facts("KeyError", text, [("/home/me/train.py", 30), ("/site-packages/torch/x.py", 5)])
    assert facts["where"] == "/home/me/data.py:12" and facts["message"] == "'img_9'" and facts["text"] == text
    stdlib = os.path.join(sysconfig.get_paths()["stdlib"], "runpy.py")  # this interpreter's standard library
    plain = exception_facts("RuntimeError", "boom", [("/home/me/train.py", 30), (stdlib, 2)])
    assert plain["where"] == "/home/me/train.py:30" and plain["message"] == "boom" and plain["text"] is None


OWN_ITER = """
import torch
from torch.utils.data import DataLoader


class Batches(DataLoader):
    def __iter__(self):  # batches built here, never through the base iterator
        for i in range(0, len(self.dataset), self.batch_size):
            yield torch.stack([self.dataset[j] for j in range(i, min(i + self.batch_size, len(self.dataset)))])


loader = Batches([torch.zeros(3)] * 60, batch_size=4)  # BUILT_HERE
taken = sum(1 for _ in loader)
print("batches", taken)
"""


def test_a_loader_whose_own_iter_bypasses_the_timed_iterator_is_named_with_why(tmp_path):
    script = tmp_path / "train.py"
    script.write_text(OWN_ITER)
    line = next(k for k, x in enumerate(OWN_ITER.splitlines(), 1) if "BUILT_HERE" in x)
    done = _pipeprof("watch", "--out-dir", str(tmp_path / "out"), "--", sys.executable, str(script), cwd=tmp_path)
    assert done.returncode == 0, done.stdout + done.stderr
    said = done.stdout + done.stderr
    assert "batches 15" in said and "no DataLoader returned a batch" not in said
    assert f"Batches built at {script}:{line}: no batch timed: its class defines its own __iter__" in said
    (folder,) = (tmp_path / "out").glob("*")
    (loader,) = json.loads((folder / "run.json").read_text())["loaders"].values()
    assert loader["settings"]["own_iter"] is True and loader["settings"]["loader_class"].endswith("Batches")
