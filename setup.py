"""Builds hvd_torch._C against the installed torch (pip install --no-build-isolation .)."""

import glob
import os
import shutil

import torch
from setuptools import find_packages, setup
from torch.utils.cpp_extension import BuildExtension, CppExtension

GLOO_HEADER = "/usr/include/gloo/allreduce.h"


def cuda_enabled():
    """The one place that decides whether CUDA sources are compiled."""
    return torch.version.cuda is not None and shutil.which("nvcc") is not None


def sources():
    found = []
    for pattern in ("csrc/core/*.cc", "csrc/backends/gloo/*.cc", "csrc/torch/*.cc",
                    "csrc/torch/*.cpp", "csrc/python/*.cpp"):
        found += sorted(glob.glob(pattern))
    return found


def extension():
    if not os.path.exists(GLOO_HEADER):
        raise SystemExit(
            "hvd-torch needs Debian's Gloo (libgloo-dev): run `apt-get install -y libgloo-dev` "
            "or `make setup`. See docs/architecture.md, 'Which Gloo'.")
    macros = [("HVD_TORCH_WITH_CUDA", None)] if cuda_enabled() else []
    return CppExtension(
        name="hvd_torch._C",
        sources=sources(),
        include_dirs=[os.path.abspath("csrc")],
        define_macros=macros,
        # libgloo first: our Gloo calls must bind to Debian's library, never to
        # the copy inside libtorch_cpu (see docs/architecture.md).
        libraries=["gloo"],
        extra_compile_args=["-O3", "-g0", "-std=c++17", "-fvisibility=hidden"],
    )


setup(
    packages=find_packages(
        include=["hvd_torch", "hvd_torch.*", "hvdrun", "hvdrun.*", "ray_integration",
                 "ray_integration.*"]),
    ext_modules=[extension()],
    cmdclass={"build_ext": BuildExtension.with_options(use_ninja=True)},
)
