"""The GPU test files' rank code, run on the CPU path (HVD_TORCH_GPU_TESTS_ON=cpu).

Without a GPU those files skip, so a mistake in a test itself would first show
on the scarce GPU machine. This runs them here, in a child pytest, and asserts
that every test in them ran and passed.
"""

import os
import subprocess
import sys
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest
import torch

HERE = Path(__file__).resolve().parent
FILES = ["test_cuda_training.py", "test_cuda_sets_join.py", "test_cuda_adasum.py",
         "test_c10d_cuda.py"]

pytestmark = pytest.mark.skipif(torch.cuda.is_available(),
                                reason="with a GPU those files run on it themselves")


def _outcomes(junit: Path) -> dict[str, list[str]]:
    """Each test file's test outcomes ("passed", "skipped", "failed", "error")."""
    by_file: dict[str, list[str]] = {name: [] for name in FILES}
    for case in ET.parse(junit).iter("testcase"):
        module = case.get("classname", "").rsplit(".", 1)[-1] + ".py"
        kinds = [child.tag for child in case if child.tag in ("skipped", "failure", "error")]
        by_file.setdefault(module, []).append(kinds[0] if kinds else "passed")
    return by_file


# One child pytest for all the files: its rank pools serve every file's tests,
# where a child per file started (and imported torch in) a pool of its own.
@pytest.mark.timeout(600)
def test_gpu_test_files_pass_on_the_cpu_path(tmp_path):
    env = dict(os.environ, HVD_TORCH_GPU_TESTS_ON="cpu")
    junit = tmp_path / "gpu_on_cpu.xml"
    child = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", f"--junitxml={junit}",
         *(str(HERE / name) for name in FILES)],
        cwd=HERE.parent, env=env, capture_output=True, text=True, timeout=580)
    assert child.returncode == 0, child.stdout[-4000:] + child.stderr[-2000:]
    for name, outcomes in _outcomes(junit).items():
        # Every test in every file ran on the CPU path and passed.
        assert len(outcomes) >= 3 and set(outcomes) == {"passed"}, (name, outcomes)
