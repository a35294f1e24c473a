"""Installing: the build record checked at import (before _C loads), the sdist's
contents, and setup.py's refusal without torch. The full `pip install .` into a
fresh virtual environment takes minutes: scripts/check_install.sh does it."""

import os
import subprocess
import sys
import tarfile
from pathlib import Path

import pytest

from test_doctor import stale_copy  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]


def _import(pythonpath, code="import hvd_torch"):
    env = {k: v for k, v in os.environ.items() if not k.startswith("HOROVOD_")}
    env["PYTHONPATH"] = str(pythonpath)
    return subprocess.run([sys.executable, "-c", code], cwd="/", env=env, capture_output=True,
                          text=True, timeout=120)


def test_import_refuses_another_torch_version_before_loading_the_extension(tmp_path):
    import torch

    tree = stale_copy(tmp_path, torch_version="2.12.0+cpu")
    proc = _import(tree, "import sys\ntry:\n    import hvd_torch\nexcept ImportError as e:\n"
                         "    print(e)\n    print('_C loaded:', 'hvd_torch._C' in sys.modules)")
    out = proc.stdout
    assert proc.returncode == 0, out + proc.stderr
    assert "was built for another torch than the one running" in out, out
    assert f"torch version: built with 2.12.0+cpu, running {torch.__version__}" in out, out
    assert "pip install --no-build-isolation ." in out, out
    assert "_C loaded: False" in out, out  # the check ran before the extension was loaded


@pytest.mark.parametrize("facts,expected", [
    ({"cxx11_abi": False}, "C++ ABI (_GLIBCXX_USE_CXX11_ABI): built with 0, running 1"),
    # A CUDA wheel of this very torch release under its CPU build (issue #48).
    ({"cuda_built": True, "cuda_version": "12.8", "torch_cuda": "12.8"},
     "torch build: built against torch {v} (a CUDA 12.8 build), running torch {v} (a CPU build)"),
])
def test_import_refuses_another_abi_or_torch_build(tmp_path, facts, expected):
    import torch

    if facts.get("cxx11_abi") is False and not torch._C._GLIBCXX_USE_CXX11_ABI:
        pytest.skip("this torch uses the old ABI")
    if facts.get("torch_cuda") and torch.version.cuda is not None:
        pytest.skip("this torch is a CUDA build")
    proc = _import(stale_copy(tmp_path, **facts))
    expected = expected.format(v=torch.__version__)
    assert proc.returncode == 1 and expected in proc.stderr, proc.stderr
    # A copy outside a source tree, as a wheel installs it: the hint names the
    # torch it was built for beside the rebuild.
    if facts.get("torch_cuda"):
        assert "; or install the hvd_torch wheel built for the running torch, or run this " \
            f"one with the torch it was built for (torch {torch.__version__} (a CUDA 12.8 " \
            "build))" in proc.stderr, proc.stderr


def test_import_without_the_extension_says_how_to_build(tmp_path):
    tree = stale_copy(tmp_path)
    for so in (tree / "hvd_torch").glob("_C*.so"):
        so.unlink()
    proc = _import(tree)
    assert proc.returncode == 1, proc.stderr
    assert "hvd_torch's C++ extension (hvd_torch._C) is not built; build it against the " \
        "running torch" in proc.stderr, proc.stderr


def test_sdist_has_every_source_and_header_and_no_build_record(tmp_path):
    proc = subprocess.run([sys.executable, "setup.py", "-q", "sdist", "--dist-dir", str(tmp_path)],
                          cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    (sdist,) = tmp_path.glob("hvd_torch-0.1.0.tar.gz")
    with tarfile.open(sdist) as tar:
        names = {n.split("/", 1)[1] for n in tar.getnames() if "/" in n}
    wanted = {str(p.relative_to(ROOT)) for p in (ROOT / "csrc").rglob("*")
              if p.suffix in (".h", ".cc", ".cpp", ".cu")}
    assert "csrc/core/log.h" in wanted and "csrc/core/engine.h" in wanted
    assert wanted <= names, sorted(wanted - names)
    assert {"setup.py", "build_config.py", "pyproject.toml", "hvd_torch/doctor.py",
            "hvdrun/launch.py"} <= names
    assert "hvd_torch/_build_info.py" not in names
    assert not any(n.endswith(".so") for n in names)


def test_setup_without_torch_explains_what_to_do():
    """An interpreter with setuptools and no torch (this venv's base Python, which
    also stands for `python -m build`'s isolated environment) is refused with the
    commands to use, not a bare ModuleNotFoundError."""
    base = getattr(sys, "_base_executable", None)
    probe = subprocess.run([base, "-c", "import setuptools, importlib.util as u; "
                            "assert u.find_spec('torch') is None"],
                           capture_output=True, timeout=60) if base else None
    if probe is None or probe.returncode != 0:
        pytest.skip("no base interpreter with setuptools and without torch")
    proc = subprocess.run([base, str(ROOT / "setup.py"), "build_ext"], cwd=ROOT,
                          capture_output=True, text=True, timeout=60,
                          env={"PATH": os.environ["PATH"]})
    assert proc.returncode != 0
    assert "hvd-torch: no torch found" in proc.stderr, proc.stderr
    assert "then `pip install .`" in proc.stderr, proc.stderr
    assert "python -m build --no-isolation" in proc.stderr, proc.stderr
