"""`python -m hvd_torch.doctor` and `hvdrun --check-build`: the verdict on this
installation (real 1- and 2-process loop-back collectives), and a planted torch
version mismatch that it must point at without loading the extension."""

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
TIMEOUT = 240  # two hvdrun jobs of a few seconds each, on a busy machine


def _run(args, pythonpath, timeout=TIMEOUT):
    env = dict(os.environ, PYTHONPATH=str(pythonpath))
    env = {k: v for k, v in env.items() if not k.startswith("HOROVOD_")}
    return subprocess.run([sys.executable, *args], cwd="/", env=env, capture_output=True,
                          text=True, timeout=timeout, stdin=subprocess.DEVNULL)


def stale_copy(tmp_path, **facts):
    """hvd_torch and hvdrun copied with the build record edited: what a torch upgrade
    after the build looks like, without installing another torch."""
    tree = tmp_path / "stale"
    ignore = shutil.ignore_patterns("__pycache__")
    shutil.copytree(ROOT / "hvd_torch", tree / "hvd_torch", ignore=ignore)
    shutil.copytree(ROOT / "hvdrun", tree / "hvdrun", ignore=ignore)
    record = tree / "hvd_torch" / "_build_info.py"
    text = record.read_text()
    for name, value in facts.items():
        text, n = re.subn(rf"^{name} = .*$", f"{name} = {value!r}", text, flags=re.M)
        assert n == 1, (name, text)
    record.write_text(text)
    return tree


def test_doctor_passes_on_this_installation():
    proc = _run(["-m", "hvd_torch.doctor"], ROOT)
    out = proc.stdout
    assert proc.returncode == 0, out + proc.stderr
    import torch

    assert f"built with  torch {torch.__version__}" in out, out
    assert f"running     torch {torch.__version__}" in out, out
    assert "    [X] Gloo" in out and "    [X] PyTorch" in out and "    [ ] MPI" in out, out
    assert re.search(r"\d+ CPU cores", out) and "interfaces: lo 127.0.0.1" in out, out
    assert "OK       the extension was built for the running torch" in out, out
    assert re.search(r"OK       1-process allreduce, broadcast and error through hvdrun", out), out
    assert re.search(r"OK       2-process allreduce, broadcast and error through hvdrun", out), out
    assert "PROBLEM" not in out, out
    assert out.rstrip().endswith("Verdict: OK: hvd-torch is built for this torch and runs "
                                 "collectives here"), out


def test_hvdrun_check_build_runs_the_doctor():
    proc = _run(["-m", "hvdrun", "--check-build"], ROOT)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "Available Tensor Operations:" in proc.stdout and "    [X] Gloo" in proc.stdout
    assert "Verdict: OK" in proc.stdout, proc.stdout


def test_doctor_points_at_a_planted_torch_mismatch(tmp_path):
    import torch

    tree = stale_copy(tmp_path, torch_version="2.12.0+cpu")
    proc = _run(["-m", "hvd_torch.doctor"], tree, timeout=120)
    out = proc.stdout
    assert proc.returncode == 1, out + proc.stderr
    assert "built with  torch 2.12.0+cpu" in out, out
    assert (f"PROBLEM: the extension was built for another torch: torch version: built with "
            f"2.12.0+cpu, running {torch.__version__}") in out, out
    assert "hint: rebuild it against the running torch" in out, out
    assert "pip install --no-build-isolation ." in out, out
    assert "SKIPPED  the loop-back collectives" in out, out
    assert "Verdict: PROBLEM: 1 problem(s) found" in out, out
    assert "undefined symbol" not in out + proc.stderr

    # hvdrun --check-build says the same, with the doctor's exit status.
    proc = _run(["-m", "hvdrun", "--check-build"], tree, timeout=120)
    assert proc.returncode == 1 and "Verdict: PROBLEM" in proc.stdout, proc.stdout
