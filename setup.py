"""Builds hvd_torch._C against the installed torch (pip install --no-build-isolation .).

With a CUDA build of torch and nvcc on the PATH, the same extension also
compiles the CUDA sources (csrc/backends/nccl/, csrc/torch/device_io.cpp's CUDA
half) and links NCCL from the nvidia-nccl wheel that torch itself uses.

Environment:
  HVD_TORCH_GLOO_ROOT  a Gloo installed elsewhere than /usr, e.g. Debian's
                       libgloo-dev unpacked with `dpkg -x` (ROOT/usr/include/gloo,
                       ROOT/usr/lib/<triplet>/libgloo.so).
"""

import glob
import os
import sys

from setuptools import find_packages, setup

import torch
from torch.utils.cpp_extension import BuildExtension, CppExtension, CUDAExtension

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from build_config import cuda_enabled, gloo_paths, nccl_paths  # noqa: E402


def sources(with_cuda):
    patterns = ["csrc/core/*.cc", "csrc/backends/*.cc", "csrc/backends/gloo/*.cc",
                "csrc/backends/shm/*.cc", "csrc/torch/*.cc",
                "csrc/torch/*.cpp", "csrc/python/*.cpp"]
    if with_cuda:
        patterns += ["csrc/backends/nccl/*.cc", "csrc/backends/nccl/*.cu"]
    found = []
    for pattern in patterns:
        found += sorted(glob.glob(pattern))
    return found


def extension():
    gloo = gloo_paths()
    include_dirs = [os.path.abspath("csrc")] + gloo.include_dirs
    library_dirs = list(gloo.library_dirs)
    # The runtime search path finds a Gloo outside /usr without LD_LIBRARY_PATH;
    # DT_RPATH (not RUNPATH) so that libgloo's own needs unpacked beside it
    # (libhiredis, libibverbs) are found too.
    link_args = [f"-Wl,-rpath,{d}" for d in gloo.library_dirs]
    if gloo.library_dirs:
        link_args.append("-Wl,--disable-new-dtags")
    cxx_args = ["-O3", "-g0", "-std=c++17", "-fvisibility=hidden"]
    # libgloo first: our Gloo calls must bind to Debian's library, never to
    # the copy inside libtorch_cpu (see docs/architecture.md).
    libraries = ["gloo", "rt"]
    macros = []
    with_cuda = cuda_enabled()
    if not with_cuda:
        return CppExtension(name="hvd_torch._C", sources=sources(False), include_dirs=include_dirs,
                            library_dirs=library_dirs, libraries=libraries,
                            extra_compile_args=cxx_args, extra_link_args=link_args)
    macros.append(("HVD_TORCH_WITH_CUDA", None))
    nccl = nccl_paths()
    if nccl is not None:
        macros.append(("HVD_TORCH_WITH_NCCL", None))
        include_dirs += nccl.include_dirs
        library_dirs += nccl.library_dirs
        link_args += [f"-Wl,-rpath,{d}" for d in nccl.library_dirs]
        libraries.append(nccl.library)
    print(f"[hvd_torch build] CUDA {torch.version.cuda}; NCCL "
          f"{'from ' + nccl.include_dirs[0] if nccl else 'not found: host-staged GPU ops only'}")
    return CUDAExtension(
        name="hvd_torch._C",
        sources=sources(True),
        include_dirs=include_dirs,
        library_dirs=library_dirs,
        libraries=libraries,
        define_macros=macros,
        extra_compile_args={"cxx": cxx_args,
                            "nvcc": ["-O3", "-std=c++17"] + [f"-D{k}" for k, _ in macros]},
        extra_link_args=link_args,
    )


setup(
    packages=find_packages(
        include=["hvd_torch", "hvd_torch.*", "hvdrun", "hvdrun.*", "ray_integration",
                 "ray_integration.*"]),
    ext_modules=[extension()],
    cmdclass={"build_ext": BuildExtension.with_options(use_ninja=True)},
)
