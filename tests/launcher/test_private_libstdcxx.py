"""A compiler that finds only libstdc++'s static archive links a private copy of
it into the extension, whose locale is never initialised: error messages come
out cut short or the process crashes (SIGSEGV on the GPU machine's /opt/gcc
wrapper). setup.py refuses such a build (build_config.private_libstdcxx)."""

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from build_config import private_libstdcxx  # noqa: E402

needs_tools = pytest.mark.skipif(not (shutil.which("g++") and shutil.which("nm")),
                                 reason="needs g++ and nm")

# What the torch layer does when it raises: format an integer into a message.
SOURCE = r"""
#include <sstream>
#include <string>
extern "C" int message_length(long handle) {
  std::ostringstream os;
  os << "unknown handle " << handle << " (already synchronized)";
  return static_cast<int>(os.str().size());
}
"""


def _shared_library(tmp_path, *flags):
    src = tmp_path / "message.cc"
    src.write_text(SOURCE)
    lib = tmp_path / f"libmessage{len(flags)}.so"
    subprocess.run(["g++", "-shared", "-fPIC", "-O2", str(src), "-o", str(lib), *flags],
                   check=True, timeout=120)
    return lib


@needs_tools
def test_a_library_linked_with_its_own_libstdcxx_is_found(tmp_path):
    found = private_libstdcxx(str(_shared_library(tmp_path, "-static-libstdc++")))
    assert found and all(name.startswith("_ZNSt6locale") for name in found), found


@needs_tools
def test_a_library_linked_with_the_shared_libstdcxx_is_not(tmp_path):
    assert private_libstdcxx(str(_shared_library(tmp_path))) == []


@needs_tools
def test_the_built_extension_uses_the_shared_libstdcxx():
    import hvd_torch._C as ext

    assert private_libstdcxx(ext.__file__) == []
