"""What hvd_torch._C was compiled against, compared with the running torch before
_C is loaded.

A C++ extension only works with the torch it was compiled against: after a torch
upgrade the old `.so` fails to load with `undefined symbol: ...` (or worse, loads
and crashes). setup.py writes hvd_torch/_build_info.py beside the extension (the
torch version, the build of torch (CPU, or CUDA and its version), the CUDA version
compiled and the C++ ABI); `import hvd_torch` calls stale() first, which imports
torch (not our extension); on a difference it raises an ImportError naming each one
and what to do.

A binary wheel (make wheel, docs/toolbox.md) pins its torch in its metadata
(Requires-Dist torch==VERSION), but a CPU torch and a CUDA torch can share a
version (2.14.1 and 2.14.1+cpu satisfy ==2.14.1 alike): the torch build is compared
here, so a CPU wheel under a CUDA torch, or the reverse, is refused by name.

`python -m hvd_torch.doctor` must still run when the build is stale: it is the
tool that explains it. When stale() finds a problem and the doctor is the
program being run, hvd_torch/__init__.py hands over to the doctor, which reports
and exits, instead of raising (doctor_is_main()). This module never imports the
doctor, which imports it.
"""

from __future__ import annotations

import importlib
import importlib.util
import os
import sys

__all__ = ["problems", "rebuild_hint", "recorded", "running", "stale", "doctor_is_main",
           "torch_build"]

_PACKAGE_DIR = os.path.dirname(os.path.abspath(__file__))


def recorded() -> dict | None:
    """The build's record (torch_version, torch_cuda, cuda_version, cxx11_abi,
    cuda_built, nccl_built), or None when there is none (not built, or built before
    records). torch_cuda is the compiling torch's CUDA version, None for a CPU build
    (absent from records written before it); cuda_version is set only when CUDA
    sources were compiled."""
    try:
        info = importlib.import_module("hvd_torch._build_info")
    except ImportError:
        return None
    return {k: v for k, v in vars(info).items() if not k.startswith("_")}


def running() -> dict:
    """The same facts for the torch this process runs."""
    import torch

    return {
        "torch_version": torch.__version__,
        "cuda_version": torch.version.cuda,
        "cxx11_abi": bool(torch._C._GLIBCXX_USE_CXX11_ABI),
    }


def extension_present() -> bool:
    """Whether _C is built beside this package, where _build_info.py describes it
    (an editable install of another checkout could otherwise supply its own)."""
    spec = importlib.util.find_spec("hvd_torch._C")
    return (spec is not None and spec.origin is not None
            and os.path.dirname(os.path.abspath(spec.origin)) == _PACKAGE_DIR)


def torch_build(facts: dict) -> str:
    """Which torch, in words: 'torch 2.14.1 (a CUDA 13.0 build)', 'torch 2.13.0+cpu
    (a CPU build)'; for a record from before torch_cuda, what it compiled."""
    cuda = facts.get("torch_cuda", facts.get("cuda_version"))
    kind = f"a CUDA {cuda} build" if cuda else "a CPU build"
    return f"torch {facts.get('torch_version')} ({kind})"


def rebuild_hint() -> str:
    source = os.path.dirname(_PACKAGE_DIR)
    if os.path.exists(os.path.join(source, "setup.py")):
        # A source checkout used in place (editable install or build_ext --inplace).
        return (f"rebuild it against the running torch: cd {source} && "
                f"pip install --no-build-isolation -e .  (or python setup.py build_ext --inplace)")
    hint = ("rebuild it against the running torch: from hvd-torch's source directory, "
            "pip install --no-build-isolation .")
    record = recorded()
    if record:  # an installed build, a binary wheel's perhaps
        hint += ("; or install the hvd_torch wheel built for the running torch, or run this "
                 f"one with the torch it was built for ({torch_build(record)})")
    return hint


def problems(record: dict | None = None, now: dict | None = None) -> list[str]:
    """One line per fact in which the build and the running torch differ."""
    record = recorded() if record is None else record
    if record is None:
        return []
    now = running() if now is None else now
    out = []
    if record.get("torch_version") != now["torch_version"]:
        out.append(f"torch version: built with {record.get('torch_version')}, "
                   f"running {now['torch_version']}")
    if "torch_cuda" in record:
        if record["torch_cuda"] != now["cuda_version"]:
            out.append(f"torch build: built against {torch_build(record)}, "
                       f"running {torch_build(now)}")
    elif record.get("cuda_built") and record.get("cuda_version") != now["cuda_version"]:
        # A record from before torch_cuda: only a CUDA build knew its torch's CUDA.
        out.append(f"CUDA version: built with {record.get('cuda_version')}, "
                   f"running torch's {now['cuda_version']}")
    if record.get("cxx11_abi") != now["cxx11_abi"]:
        built_abi = int(bool(record.get("cxx11_abi")))
        out.append(f"C++ ABI (_GLIBCXX_USE_CXX11_ABI): built with {built_abi}, "
                   f"running {int(now['cxx11_abi'])}")
    return out


def mismatch_message(found: list[str]) -> str:
    return ("hvd_torch's C++ extension was built for another torch than the one running, "
            "and would fail to load (undefined symbol) or misbehave:\n  " + "\n  ".join(found) +
            f"\n{rebuild_hint()}\n(python -m hvd_torch.doctor checks the whole installation)")


def doctor_is_main() -> bool:
    """Whether the program being run is `python -m hvd_torch.doctor`."""
    argv = getattr(sys, "orig_argv", [])  # Python 3.10+; older ones just raise
    return any(a == "-m" and b == "hvd_torch.doctor" for a, b in zip(argv, argv[1:]))


def stale() -> tuple[list[str], str]:
    """What keeps _C from loading: (the differences found, the ImportError's message);
    ([], "") when _C is present and built for the running torch."""
    if not extension_present():
        return (["hvd_torch._C is not built"],
                f"hvd_torch's C++ extension (hvd_torch._C) is not built; "
                f"{rebuild_hint().replace('rebuild it', 'build it')}")
    found = problems()
    return (found, mismatch_message(found)) if found else ([], "")
