"""The GPU test files' rank code, run on the CPU path (HVD_TORCH_GPU_TESTS_ON=cpu).

Without a GPU those files skip, so a mistake in a test itself would first show
on the scarce GPU machine. This runs them here, in a child pytest, and asserts
that every test in them ran and passed.
"""

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import torch

HERE = Path(__file__).resolve().parent
FILES = ["test_cuda_training.py", "test_cuda_sets_join.py", "test_cuda_adasum.py"]

pytestmark = pytest.mark.skipif(torch.cuda.is_available(),
                                reason="with a GPU those files run on it themselves")


@pytest.mark.timeout(420)
@pytest.mark.parametrize("name", FILES)
def test_gpu_test_file_passes_on_the_cpu_path(name):
    env = dict(os.environ, HVD_TORCH_GPU_TESTS_ON="cpu")
    child = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", str(HERE / name)],
        cwd=HERE.parent, env=env, capture_output=True, text=True, timeout=400)
    summary = child.stdout.strip().splitlines()[-1] if child.stdout.strip() else ""
    assert child.returncode == 0, child.stdout[-4000:] + child.stderr[-2000:]
    passed = re.search(r"(\d+) passed", summary)
    assert passed and int(passed.group(1)) >= 3, summary
    assert not re.search(r"skipped|failed|error", summary), summary
