"""Where the GPU test files run their rank code: on the GPU (skipped without
one) or, with HVD_TORCH_GPU_TESTS_ON=cpu, on the CPU path, which checks those
tests themselves on a machine without a GPU."""

import os

import pytest
import torch

DEVICE = os.environ.get("HVD_TORCH_GPU_TESTS_ON", "cuda")
needs_device = pytest.mark.skipif(DEVICE == "cuda" and not torch.cuda.is_available(),
                                  reason="needs a CUDA GPU")
