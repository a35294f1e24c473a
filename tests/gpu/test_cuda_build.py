"""The CUDA sources compile on a machine without a GPU: every .cu file with
nvcc and every CUDA-guarded C++ file with g++, against this torch's headers,
CUDA's and NCCL's (scripts/cuda_compile_check.py). Linking and running are
proven on a GPU machine (tests/gpu/test_cuda_ops.py); here a typo in CUDA-only code
fails CI instead of waiting for a GPU session."""

import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from build_config import nccl_include_dir, nvcc_path  # noqa: E402

sys.path.insert(0, str(ROOT / "scripts"))
import cuda_compile_check  # noqa: E402


def test_cuda_sources_are_found():
    names = {p.name for p in cuda_compile_check.cuda_sources()}
    # The NCCL plane, the kernels, and the torch layer's CUDA half.
    for expected in ("nccl_backend.cc", "cuda_memory.cc", "cuda_event.cc", "scale_kernels.cu",
                     "device_io.cpp", "kernels.cpp"):
        assert expected in names, sorted(names)


@pytest.mark.skipif(nvcc_path() is None, reason="needs nvcc")
@pytest.mark.skipif(nccl_include_dir() is None, reason="needs nccl.h (scripts/setup.sh)")
def test_cuda_sources_compile():
    run = subprocess.run([sys.executable, str(ROOT / "scripts/cuda_compile_check.py"),
                          "--jobs", "2"], capture_output=True, text=True, timeout=1200,
                         check=False)
    assert run.returncode == 0, run.stdout + run.stderr
    compiled = [line for line in run.stdout.splitlines() if line.startswith("ok ")]
    assert len(compiled) == len(cuda_compile_check.cuda_sources()), run.stdout
