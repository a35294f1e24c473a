"""What hvd_torch._C was compiled against, compared with the running torch before
_C is loaded.

A C++ extension only works with the torch it was compiled against: after a torch
upgrade the old `.so` fails to load with `undefined symbol: ...` (or worse, loads
and crashes). setup.py writes hvd_torch/_build_info.py beside the extension (the
torch version, CUDA version and C++ ABI of the build); `import hvd_torch` calls
stale() first, which imports torch (not our extension); on a difference it raises
an ImportError naming each one and the command that rebuilds.

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

__all__ = ["problems", "rebuild_hint", "recorded", "running", "stale", "doctor_is_main"]

_PACKAGE_DIR = os.path.dirname(os.path.abspath(__file__))


def recorded() -> dict | None:
    """The build's record (torch_version, cuda_version, cxx11_abi, cuda_built,
    nccl_built), or None when there is none (not built, or built before records)."""
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


def rebuild_hint() -> str:
    source = os.path.dirname(_PACKAGE_DIR)
    if os.path.exists(os.path.join(source, "setup.py")):
        # A source checkout used in place (editable install or build_ext --inplace).
        return (f"rebuild it against the running torch: cd {source} && "
                f"pip install --no-build-isolation -e .  (or python setup.py build_ext --inplace)")
    return ("rebuild it against the running torch: from hvd-torch's source directory, "
            "pip install --no-build-isolation .")


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
    if record.get("cuda_built") and record.get("cuda_version") != now["cuda_version"]:
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
