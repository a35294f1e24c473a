"""Builds hvd_torch._C against the installed torch (`pip install .`).

With a CUDA build of torch and nvcc on the PATH, the same extension also
compiles the CUDA sources (csrc/backends/nccl/, csrc/torch/device_io.cpp's CUDA
half) and links NCCL from the nvidia-nccl wheel that torch itself uses.

Environment:
  HVD_TORCH_GLOO_ROOT  a Gloo installed elsewhere than /usr, e.g. Debian's
                       libgloo-dev unpacked with `dpkg -x` (ROOT/usr/include/gloo,
                       ROOT/usr/lib/<triplet>/libgloo.so).
  HVD_TORCH_SANITIZE   a sanitizer build, e.g. address,undefined: what `make
                       test-sanitize` builds into build/asan (scripts/sanitize.sh),
                       never installed; see docs/testing.md, "Sanitizers".

Which torch: the extension must be compiled against the torch it will run with.
pip's build isolation (plain `pip install .`, `python -m build`) runs this file in a
temporary environment that hides the installed torch; torch is therefore not a build
requirement (pip would download a different one), and when the build environment has
no torch this file borrows the target environment's (import_torch() below).
Every build records the torch version, CUDA version and C++ ABI it compiled against in
hvd_torch/_build_info.py, beside the extension; `import hvd_torch` compares them with
the running torch before it loads the extension (hvd_torch/build_record.py).
"""

import glob
import os
import subprocess
import sys

from setuptools import Extension, find_packages, setup

REBUILD_HINT = "pip install --no-build-isolation ."


# Commands that only package sources (an sdist, metadata) and need no torch.
_SOURCE_ONLY = {"sdist", "egg_info", "dist_info", "--name", "--version"}


def import_torch():
    """The torch to compile against: the build environment's, else the target's.

    Under pip's build isolation sys.executable is still the target environment's
    interpreter, but sys.path is the isolated one. `python -I` ignores the
    PYTHONPATH pip sets, so it sees the target environment's site-packages, and
    appending the directory holding its torch (after the build environment's own
    entries, so setuptools and ninja stay the isolated ones) builds against the
    torch the extension will run with. None when no torch is found.
    """
    try:
        import torch
        return torch
    except ImportError:
        pass
    probe = subprocess.run(
        [sys.executable, "-I", "-c",
         "import os, torch; print(os.path.dirname(os.path.dirname(torch.__file__)))"],
        capture_output=True, text=True)
    if probe.returncode != 0:
        return None
    sys.path.append(probe.stdout.strip())
    print(f"[hvd_torch build] isolated build: compiling against the torch installed in "
          f"{probe.stdout.strip()}")
    import torch
    return torch


torch = import_torch()
if torch is None and not _SOURCE_ONLY.intersection(sys.argv[1:]):
    sys.exit(f"hvd-torch: no torch found. hvd-torch compiles against the torch of the environment "
             f"it is installed into, and {sys.executable} has none. Install torch first "
             f"(pip install torch), then `pip install .`; with `python -m build` (which builds in "
             f"a fresh environment of its own), install torch and run `python -m build "
             f"--no-isolation`.")
if torch is not None:
    from torch.utils.cpp_extension import BuildExtension, CppExtension, CUDAExtension

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from build_config import (  # noqa: E402
    cuda_enabled, cxx_standard, gloo_paths, nccl_paths, private_libstdcxx,
)


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
    std = f"-std={cxx_standard()}"  # c++20 for torch 2.14 and later
    cxx_args = ["-O3", "-g0", std, "-fvisibility=hidden"]
    sanitize = os.environ.get("HVD_TORCH_SANITIZE")
    if sanitize:
        # -O1 with line tables and frame pointers: a report names file:line, and
        # ASan's fast unwinder walks every frame. No recovery: a UBSan report stops
        # the process, so the rank fails instead of printing and going on.
        # -fno-wrapv undoes the -fwrapv of Python's own flags, under which a signed
        # overflow is defined and UBSan does not look for one.
        checks = [f"-fsanitize={sanitize}", "-fno-sanitize-recover=all",
                  "-fno-omit-frame-pointer", "-fno-wrapv"]
        cxx_args = ["-O1", "-g", std, "-fvisibility=hidden"] + checks
        link_args += checks
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
                            "nvcc": ["-O3", std] + [f"-D{k}" for k, _ in macros]},
        extra_link_args=link_args,
    )


def build_record(ext):
    """The contents of hvd_torch/_build_info.py: what this build compiled against.
    torch_cuda is the build of torch (its CUDA version, None for a CPU build), even
    when no CUDA source was compiled (a CUDA torch without nvcc): the extension is
    linked to that build's libraries and runs with it only."""
    facts = {
        "torch_version": torch.__version__,
        "torch_cuda": torch.version.cuda,
        "cuda_version": torch.version.cuda if cuda_enabled() else None,
        "cxx11_abi": bool(torch._C._GLIBCXX_USE_CXX11_ABI),
        "cuda_built": cuda_enabled(),
        "nccl_built": any(m[0] == "HVD_TORCH_WITH_NCCL" for m in ext.define_macros or []),
    }
    lines = [f"{k} = {v!r}" for k, v in facts.items()]
    return ('"""Written by setup.py when hvd_torch._C was built; read before _C loads '
            '(build_record.py)."""\n\n' + "\n".join(lines) + "\n")


def write_build_records(build_ext_cmd):
    """Writes hvd_torch/_build_info.py beside each built extension, and in the source
    tree only for the builds whose .so lands there (in-place builds, editable
    installs): a wheel built from this tree (make wheel, make wheel-cuda) leaves the
    tree's record, which describes the tree's .so, alone.

    Each write replaces the file whole (a new file renamed over the old), and an
    unchanged record is not written: a test importing hvd_torch from the tree while
    a wheel builds never reads a half-written record."""
    here = os.path.dirname(os.path.abspath(__file__))
    into_tree = build_ext_cmd.inplace or getattr(build_ext_cmd, "editable_mode", False)
    for ext in build_ext_cmd.extensions:
        directories = {os.path.abspath(os.path.dirname(build_ext_cmd.get_ext_fullpath(ext.name)))}
        if into_tree:
            directories.add(os.path.join(here, "hvd_torch"))
        text = build_record(ext)
        for directory in directories:
            path = os.path.join(directory, "_build_info.py")
            if os.path.exists(path):
                with open(path) as f:
                    if f.read() == text:
                        continue
            tmp = f"{path}.{os.getpid()}.tmp"
            with open(tmp, "w") as f:
                f.write(text)
            os.replace(tmp, path)


def refuse_private_libstdcxx(build_ext_cmd):
    """Fails the build, and removes what it built, when the compiler linked its own
    copy of libstdc++ into the extension: that extension crashes at its first
    error message (build_config.private_libstdcxx)."""
    for ext in build_ext_cmd.extensions:
        path = build_ext_cmd.get_ext_fullpath(ext.name)
        found = private_libstdcxx(path) if os.path.exists(path) else []
        if found:
            # Both copies, so that nothing can import it: build/lib's and, in place, the tree's.
            built = os.path.join(build_ext_cmd.build_lib, build_ext_cmd.get_ext_filename(ext.name))
            for copy in {path, built}:
                if os.path.exists(copy):
                    os.remove(copy)
            compiler = os.environ.get("CXX", "c++")
            raise SystemExit(
                f"hvd-torch: the compiler {compiler} linked a private copy of libstdc++ into "
                f"{os.path.basename(path)} (it defines {found[0]}, among {len(found)} such "
                "symbols): that copy is never initialised and the extension would crash at its "
                "first error message. The compiler found only libstdc++'s static archive. "
                "Build with a compiler that links the shared libstdc++, e.g. "
                "CC=/usr/bin/gcc CXX=/usr/bin/g++ (docs/gpu.md, 'Building').")


if torch is not None:
    class BuildWithRecord(BuildExtension.with_options(use_ninja=True)):
        def run(self):
            super().run()
            refuse_private_libstdcxx(self)
            write_build_records(self)

    ext_modules, cmdclass = [extension()], {"build_ext": BuildWithRecord}
else:
    # An sdist or metadata without torch: the extension's sources are listed, never built.
    ext_modules, cmdclass = [Extension("hvd_torch._C", sources=sources(True))], {}

def requirements():
    """What a built package needs: the very torch it compiled against (a wheel's
    Requires-Dist torch==2.13.0+cpu, so that pip installs that torch or refuses,
    rather than leave an extension that fails on an undefined symbol). An sdist
    builds against whatever torch it finds: any torch hvd-torch supports.

    The pin is the version pip knows torch by, its distribution's: PyPI's CUDA
    torch calls itself 2.14.1+cu130 (torch.__version__) but is installed as 2.14.1,
    which a pin on 2.14.1+cu130 would refuse. ==2.14.1 also admits a 2.14.1+cpu;
    the import-time check refuses that one by its build (build_record.py)."""
    if torch is None or "sdist" in sys.argv[1:]:
        return ["torch>=2.4", "numpy"]
    import importlib.metadata

    try:
        version = importlib.metadata.version("torch")
    except importlib.metadata.PackageNotFoundError:  # a torch built from source, uninstalled
        version = torch.__version__
    return [f"torch=={version}", "numpy"]


setup(
    install_requires=requirements(),
    packages=find_packages(
        include=["hvd_torch", "hvd_torch.*", "hvdrun", "hvdrun.*", "ray_integration",
                 "ray_integration.*"]),
    # The torch.backends entry point (pyproject.toml): outside hvd_torch, so that
    # torch loading it imports nothing of ours.
    py_modules=["hvd_torch_autoload"],
    ext_modules=ext_modules,
    cmdclass=cmdclass,
)
