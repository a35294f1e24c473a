"""Compiles every CUDA source of hvd_torch without a GPU: the .cu files with
nvcc, and every C++ file that has CUDA-only code (HVD_TORCH_WITH_CUDA /
HVD_TORCH_WITH_NCCL) with the host compiler, against the installed torch's
headers, CUDA's and NCCL's. Compile only: linking and running need a CUDA
build of torch and a GPU (see docs/gpu.md).

    python scripts/cuda_compile_check.py [--jobs N]

Prints one line per source and exits non-zero when one fails. NCCL's headers
come from the installed nvidia-nccl wheel, else from build/nccl-headers
(scripts/setup.sh unpacks them there when nvcc is present).
"""

from __future__ import annotations

import argparse
import concurrent.futures
import os
import subprocess
import sys
import sysconfig
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from build_config import cuda_home, gloo_paths, nccl_include_dir, nvcc_path  # noqa: E402

GUARDS = ("HVD_TORCH_WITH_CUDA", "HVD_TORCH_WITH_NCCL")


def cuda_sources() -> list[Path]:
    """The .cu files, everything under backends/nccl, and guarded C++ files."""
    found = set(ROOT.glob("csrc/**/*.cu")) | set(ROOT.glob("csrc/backends/nccl/*.cc"))
    for path in ROOT.glob("csrc/**/*.c*"):
        if path.suffix in (".cc", ".cpp") and any(g in path.read_text() for g in GUARDS):
            found.add(path)
    return sorted(found)


# A CPU build of torch ships c10/cuda's headers but not the one CMake writes
# for CUDA builds; this is its content in torch's CUDA wheels.
CMAKE_MACROS = "c10/cuda/impl/cuda_cmake_macros.h"
CMAKE_MACROS_TEXT = "#pragma once\n#define C10_CUDA_BUILD_SHARED_LIBS\n"


def flags(out_dir: str) -> list[str]:
    import torch
    from torch.utils.cpp_extension import include_paths

    home = cuda_home()
    if home is None:
        raise SystemExit("no CUDA toolkit headers (cuda_runtime_api.h): set CUDA_HOME")
    nccl = nccl_include_dir()
    if nccl is None:
        raise SystemExit("no nccl.h: install nvidia-nccl-cu13 or run scripts/setup.sh")
    # Other projects' headers as system headers: only our own warnings show.
    includes = [*include_paths(), os.path.join(home, "include"), nccl,
                sysconfig.get_paths()["include"], *gloo_paths().include_dirs]
    if not any(os.path.exists(os.path.join(d, CMAKE_MACROS)) for d in include_paths()):
        stub = os.path.join(out_dir, "stub-include")
        os.makedirs(os.path.join(stub, os.path.dirname(CMAKE_MACROS)))
        with open(os.path.join(stub, CMAKE_MACROS), "w") as f:
            f.write(CMAKE_MACROS_TEXT)
        includes.append(stub)
    abi = int(torch._C._GLIBCXX_USE_CXX11_ABI)
    return ([f"-I{ROOT / 'csrc'}"] + [a for d in includes for a in ("-isystem", d)] +
            [f"-D{g}" for g in GUARDS] +
            ["-DTORCH_API_INCLUDE_EXTENSION_H", "-DTORCH_EXTENSION_NAME=_C",
             f"-D_GLIBCXX_USE_CXX11_ABI={abi}", "-std=c++17", "-O0"])


def compile_one(source: Path, nvcc: str, common: list[str], out_dir: str):
    obj = os.path.join(out_dir, source.name + ".o")
    if source.suffix == ".cu":
        cmd = [nvcc, "-c", str(source), "-o", obj, *common, "-Xcompiler", "-fPIC"]
    else:
        cmd = [os.environ.get("CXX", "g++"), "-c", str(source), "-o", obj, "-fPIC", "-Wall",
               *common]
    run = subprocess.run(cmd, capture_output=True, text=True, check=False)
    return source, run.returncode, run.stdout + run.stderr


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--jobs", type=int, default=2)
    args = parser.parse_args(argv)
    nvcc = nvcc_path()
    if nvcc is None:
        print("cuda compile check: no nvcc on this machine")
        return 2
    failed = 0
    with tempfile.TemporaryDirectory() as out_dir, \
            concurrent.futures.ThreadPoolExecutor(args.jobs) as pool:
        common = flags(out_dir)
        jobs = [pool.submit(compile_one, s, nvcc, common, out_dir) for s in cuda_sources()]
        for job in jobs:
            source, code, output = job.result()
            print(f"{'ok  ' if code == 0 else 'FAIL'} {source.relative_to(ROOT)}")
            failed += code != 0
            if output.strip():  # errors, and warnings worth reading
                print(output)
    print(f"cuda compile check: {len(jobs) - failed} compiled, {failed} failed")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
