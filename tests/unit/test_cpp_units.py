"""The engine's C++ unit tests (tests/cpp/test_*.cc), built and run once by
`make -C tests/cpp check`. The Makefile prints "== build/<name>" before each
binary runs; each binary's last line is "N passed, M failed" (tests/cpp/check.h).
One pytest case per binary, so a failure points at the piece of the engine."""

import re
import shutil
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
EXPECTED = ["test_autotune", "test_control_frames", "test_coordinator", "test_engine",
            "test_executor", "test_fast_lane", "test_frame_socket", "test_fusion",
            "test_gloo_backend", "test_handle_table", "test_hierarchical_backend",
            "test_host_record", "test_message", "test_reduce", "test_shm_backend",
            "test_shm_sync", "test_slot_writes", "test_stall_inspector", "test_stream_copy",
            "test_timeline"]
CLOSING = re.compile(r"^(\d+) passed, (\d+) failed$")
# make and the test binaries are processes, but no rank or launcher: these are
# the C++ half of the unit tier (conftest.py's "cpp" marker).
pytestmark = pytest.mark.cpp


def _sections(stdout):
    """Maps each binary the Makefile ran to the lines it printed."""
    sections = {}
    current = None
    for line in stdout.splitlines():
        if line.startswith("== build/"):
            current = line[len("== build/") :].strip()
            sections[current] = []
        elif current is not None:
            sections[current].append(line)
    return sections


@pytest.fixture(scope="module")
def make_check():
    if shutil.which("g++") is None or shutil.which("make") is None:
        pytest.skip("needs g++ and make")
    run = subprocess.run(
        ["make", "--no-print-directory", "-C", str(ROOT / "tests/cpp"), "check"],
        capture_output=True,
        text=True,
        timeout=300,
        check=False,  # the binaries' own lines say what failed
    )
    return run, _sections(run.stdout)


def _check_section(name, sections, run):
    assert name in sections, f"{name} did not run:\n{run.stdout}\n{run.stderr}"
    lines = sections[name]
    closing = CLOSING.match(lines[-1]) if lines else None
    assert closing, f"{name} printed no closing line:\n" + "\n".join(lines)
    passed, failed = (int(g) for g in closing.groups())
    assert failed == 0 and passed > 0, f"{name}:\n" + "\n".join(lines)


@pytest.mark.parametrize("name", EXPECTED)
def test_cpp_unit_binary(make_check, name):
    run, sections = make_check
    _check_section(name, sections, run)


def test_cpp_units_all_pass(make_check):
    """Every binary, including ones added after EXPECTED was written, and make's status."""
    run, sections = make_check
    assert sections, f"nothing ran:\n{run.stdout}\n{run.stderr}"
    for name in sections:
        _check_section(name, sections, run)
    assert run.returncode == 0, f"{run.stdout}\n{run.stderr}"
