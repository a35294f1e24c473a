"""Where the GPU test files run their rank code: on the GPU where there is one,
else on the CPU path. Those files thereby run on every machine, so a mistake in
a GPU test itself shows here, not first on the scarce GPU machine (their CUDA
code is compiled here by tests/gpu/test_cuda_build.py, run only on a GPU).

HVD_TORCH_GPU_TESTS_ON=cuda or =cpu chooses; cuda without a GPU skips them."""

import os

import pytest
import torch

DEVICE = os.environ.get("HVD_TORCH_GPU_TESTS_ON") or (
    "cuda" if torch.cuda.is_available() else "cpu")
needs_device = pytest.mark.skipif(DEVICE == "cuda" and not torch.cuda.is_available(),
                                  reason="needs a CUDA GPU")
