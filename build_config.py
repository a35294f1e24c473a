"""Where the build finds CUDA, NCCL and Gloo: one place, shared by setup.py and
the CUDA compile check (tests/gpu/test_cuda_build.py).

Features are detected, not chosen: CUDA sources compile when torch is a CUDA
build and nvcc is found; NCCL links when the nvidia-nccl wheel that torch uses
is installed. HVD_TORCH_GLOO_ROOT points at a Gloo outside /usr.
"""

from __future__ import annotations

import dataclasses
import glob
import importlib.util
import os
import shutil
import subprocess

GLOO_ROOT_ENV = "HVD_TORCH_GLOO_ROOT"
# Where scripts/setup.sh unpacks NCCL's headers for the compile-only check on a
# machine without the NCCL wheel (a CPU build of torch).
NCCL_HEADERS_DIR = os.path.join(os.path.dirname(os.path.abspath(__file__)), "build",
                                "nccl-headers", "nvidia", "nccl", "include")


@dataclasses.dataclass
class Paths:
    include_dirs: list[str]
    library_dirs: list[str]
    library: str = ""


def cxx_standard() -> str:
    """The C++ standard torch's headers require: c++20 from torch 2.14 on (ATen.h
    stops a build below C++20), c++17 before; read from the headers, not guessed from
    the version."""
    from torch.utils.cpp_extension import include_paths

    for base in include_paths():
        aten = os.path.join(base, "ATen", "ATen.h")
        if os.path.exists(aten):
            with open(aten) as f:
                return "c++20" if "__cplusplus < 202002L" in f.read() else "c++17"
    return "c++17"


def nvcc_path() -> str | None:
    home = os.environ.get("CUDA_HOME") or os.environ.get("CUDA_PATH")
    if home and os.access(os.path.join(home, "bin", "nvcc"), os.X_OK):
        return os.path.join(home, "bin", "nvcc")
    return shutil.which("nvcc")


def cuda_home() -> str | None:
    """The CUDA toolkit's root (its include/ has cuda_runtime_api.h)."""
    candidates = [os.environ.get("CUDA_HOME"), os.environ.get("CUDA_PATH"), "/usr/local/cuda"]
    nvcc = nvcc_path()
    if nvcc:
        candidates.append(os.path.dirname(os.path.dirname(os.path.realpath(nvcc))))
    for home in candidates:
        if home and os.path.exists(os.path.join(home, "include", "cuda_runtime_api.h")):
            return home
    return None


def cuda_enabled() -> bool:
    """The one place that decides whether CUDA sources are compiled."""
    import torch

    return torch.version.cuda is not None and nvcc_path() is not None


def gloo_paths() -> Paths:
    """Debian's libgloo-dev under / or under $HVD_TORCH_GLOO_ROOT."""
    root = os.environ.get(GLOO_ROOT_ENV, "/")
    include = os.path.join(root, "usr", "include")
    if not os.path.exists(os.path.join(include, "gloo", "allreduce.h")):
        where = f"{GLOO_ROOT_ENV}={root}" if root != "/" else "/usr/include"
        raise SystemExit(
            f"hvd-torch needs Debian's Gloo (libgloo-dev), not found under {where}: run "
            "`apt-get install -y libgloo-dev` or `make setup`, or unpack the .deb files "
            f"(`dpkg -x libgloo-dev_*.deb DIR`, likewise libgloo0) and set {GLOO_ROOT_ENV}=DIR. "
            "See docs/architecture.md, 'Which Gloo'.")
    if root == "/":
        return Paths([], [])  # the compiler's default paths
    libs = sorted({os.path.dirname(p) for p in glob.glob(os.path.join(root, "usr", "lib", "**",
                                                                       "libgloo.so*"),
                                                         recursive=True)})
    return Paths([include], libs)


def nccl_include_dir() -> str | None:
    """nccl.h from the installed nvidia-nccl wheel, else from build/nccl-headers."""
    spec = importlib.util.find_spec("nvidia.nccl") if importlib.util.find_spec("nvidia") else None
    for base in (list(spec.submodule_search_locations) if spec else []):
        if os.path.exists(os.path.join(base, "include", "nccl.h")):
            return os.path.join(base, "include")
    if os.path.exists(os.path.join(NCCL_HEADERS_DIR, "nccl.h")):
        return NCCL_HEADERS_DIR
    return None


def nccl_paths() -> Paths | None:
    """Headers and library of the NCCL wheel torch uses; None when absent."""
    include = nccl_include_dir()
    if include is None:
        return None
    lib = os.path.join(os.path.dirname(include), "lib")
    if not glob.glob(os.path.join(lib, "libnccl.so*")):
        return None  # headers only (the compile check): nothing to link
    # The wheel ships libnccl.so.2 without the unversioned link name.
    name = "nccl" if os.path.exists(os.path.join(lib, "libnccl.so")) else ":libnccl.so.2"
    return Paths([include], [lib], name)


def private_libstdcxx(extension_path: str) -> list[str]:
    """libstdc++ internals that a built extension defines itself (empty when healthy).

    A compiler that finds only libstdc++'s static archive (the GPU machine's
    /opt/gcc wrapper does) links a private copy of it into _C. That copy's
    locale is never initialised: an error message that formats an integer is
    cut short there, or crashes the process (SIGSEGV in
    std::ostream::_M_insert<long> on the GPU machine).
    std::locale's own members are the mark: a healthy extension only uses them.
    """
    nm = shutil.which("nm")
    if nm is None:
        return []
    run = subprocess.run([nm, "--defined-only", extension_path], capture_output=True, text=True,
                         check=False)
    names = (line.split()[-1] for line in run.stdout.splitlines() if line.strip())
    return sorted(n for n in names if n.startswith("_ZNSt6locale"))
