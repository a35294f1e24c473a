"""The fuzz targets' seeds and saved crashes, replayed in the normal suite (tests/fuzz).

`make -C tests/fuzz replay` builds every target with plain g++ (no libFuzzer, no clang)
against a small main that feeds it each file of tests/fuzz/corpus/<target>/ and
tests/fuzz/regressions/<target>/: every input a fuzzer ever crashed a decoder with stays
fixed, and each target's round-trip and oracle checks hold on the seeds.  The Makefile
prints "== fuzz_<target>" before each; each one's last line is "N passed, M failed"."""

import re
import shutil
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
TARGETS = ["message", "control_frames", "host_record", "frame_socket", "byte_ring",
           "store_client", "shm_peer", "endpoint", "agreement"]
CLOSING = re.compile(r"^(\d+) passed, (\d+) failed$")
# make and the replay binaries are processes, but no rank or launcher: like the C++
# units, they are the C++ half of the unit tier (conftest.py's "cpp" marker).
pytestmark = pytest.mark.cpp


@pytest.fixture(scope="module")
def replay():
    if shutil.which("g++") is None or shutil.which("make") is None:
        pytest.skip("needs g++ and make")
    run = subprocess.run(["make", "--no-print-directory", "-C", str(ROOT / "tests/fuzz"), "replay"],
                         capture_output=True, text=True, timeout=600, check=False)
    sections, current = {}, None
    for line in run.stdout.splitlines():
        if line.startswith("== fuzz_"):
            current = line[len("== fuzz_"):].strip()
            sections[current] = []
        elif current is not None:
            sections[current].append(line)
    return run, sections


@pytest.mark.parametrize("target", TARGETS)
def test_fuzz_target_replays_its_corpus_and_regressions(replay, target):
    run, sections = replay
    assert target in sections, f"fuzz_{target} did not run:\n{run.stdout}\n{run.stderr}"
    lines = sections[target]
    closing = CLOSING.match(lines[-1]) if lines else None
    assert closing, f"fuzz_{target} printed no closing line:\n" + "\n".join(lines)
    passed, failed = (int(g) for g in closing.groups())
    corpus = ROOT / "tests/fuzz/corpus" / target
    regressions = ROOT / "tests/fuzz/regressions" / target
    files = [p for d in (corpus, regressions) if d.is_dir() for p in d.iterdir()]
    assert failed == 0 and passed == len(files), f"fuzz_{target}:\n" + "\n".join(lines)


def test_every_target_has_seeds_and_the_corpus_stays_small():
    total = 0
    for target in TARGETS:
        seeds = list((ROOT / "tests/fuzz/corpus" / target).iterdir())
        assert len(seeds) >= 2, f"{target}: {len(seeds)} seeds"
        total += sum(p.stat().st_size for p in seeds)
    assert total < 100 << 10, f"the seed corpora hold {total} bytes"
    sources = {p.stem[len("fuzz_"):] for p in (ROOT / "tests/fuzz").glob("fuzz_*.cc")}
    assert sources == set(TARGETS), sources
