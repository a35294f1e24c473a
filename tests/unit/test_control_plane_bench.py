"""The control-plane scale bench (bench/cpp/control_plane_scale.cc, `make bench-scale`)
still builds against the engine and runs: N = 2..64 simulated ranks, few iterations.
The binary checks every response it gets while it measures and exits non-zero on a
wrong one; here only the shape of its JSON is checked, never a time."""

import json
import shutil
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
# A make subprocess in tests/cpp's build folder, shared with test_cpp_units.py
# (its libcore.a): the "cpp" marker keeps them on one xdist worker.
pytestmark = pytest.mark.cpp


def test_control_plane_scale_runs(tmp_path):
    if shutil.which("g++") is None or shutil.which("make") is None:
        pytest.skip("needs g++ and make")
    build = subprocess.run(
        ["make", "--no-print-directory", "-C", str(ROOT / "tests/cpp"),
         "build/control_plane_scale"],
        capture_output=True, text=True, timeout=300, check=False)
    assert build.returncode == 0, build.stdout + build.stderr
    out = tmp_path / "scale.json"
    run = subprocess.run(
        [str(ROOT / "tests/cpp/build/control_plane_scale"), "--max-ranks", "64", "--reps", "2",
         "--arrivals", "2000", "--new-arrivals", "500", "--json", str(out)],
        capture_output=True, text=True, timeout=60, check=False)
    assert run.returncode == 0, run.stdout + run.stderr
    result = json.loads(out.read_text())
    points = result["points"]
    assert [p["ranks"] for p in points] == [2, 4, 8, 16, 32, 64]
    per_host = result["per_host"]
    assert per_host == 8, result
    # The kernel's part runs over TCP loopback by default, up to the N whose
    # 2 (N - 1) descriptors fit (far above 64 once the soft limit is raised).
    assert result["kernel_sockets"] == "tcp", result
    assert result["kernel_max_ranks"] >= 64, result
    for p in points:
        for key in ("cached_us_per_op", "new_us_per_op", "bytes_per_rank", "slot_bytes_per_rank",
                    "star_us_per_new_op", "leaders_us_per_new_op", "star_over_leaders",
                    "kernel_star_us_per_new_op", "kernel_leaders_us_per_new_op",
                    "kernel_star_over_leaders", "kernel_star_wall_us_per_new_op",
                    "kernel_leaders_wall_us_per_new_op"):
            assert len(p[key]) == 2 and all(v > 0 for v in p[key]), (p["ranks"], key, p[key])
        assert 1 <= p["kernel_new_ops"] <= p["new_ops"], p
        # Frames per new op at rank 0, which do not depend on time: one per
        # rank without leaders; with them, one link per rank of rank 0's host
        # and per other host's leader, whose relay carries its own frame too.
        n = p["ranks"]
        hosts = -(-n // per_host)
        local = min(n, per_host) - 1
        assert p["star_reads_per_new_op"] == p["star_frames_per_new_op"] == n - 1, p
        assert p["star_writes_per_new_op"] == n - 1, p
        assert p["leaders_reads_per_new_op"] == local + hosts - 1, p
        assert p["leaders_writes_per_new_op"] == local + hosts - 1, p
        assert p["leaders_frames_per_new_op"] == local + hosts - 1, p
    assert "    64  " in run.stdout, run.stdout  # the table's last row


def test_agreement_scale_runs(tmp_path):
    """Issue #47's bench: every simulated rank's outcome is checked by the binary
    (one fused response of every op, in slot order); here the figures' shape and
    what does not depend on time: messages and bytes per rank grow by one message
    per doubling, and the critical path is log2 N messages."""
    if shutil.which("g++") is None or shutil.which("make") is None:
        pytest.skip("needs g++ and make")
    build = subprocess.run(
        ["make", "--no-print-directory", "-C", str(ROOT / "tests/cpp"), "build/agreement_scale"],
        capture_output=True, text=True, timeout=300, check=False)
    assert build.returncode == 0, build.stdout + build.stderr
    out = tmp_path / "agreement.json"
    run = subprocess.run(
        [str(ROOT / "tests/cpp/build/agreement_scale"), "--max-ranks", "256", "--messages", "3000",
         "--json", str(out)],
        capture_output=True, text=True, timeout=60, check=False)
    assert run.returncode == 0, run.stdout + run.stderr
    points = json.loads(out.read_text())["points"]
    assert [p["ranks"] for p in points] == [2, 4, 8, 16, 32, 64, 128, 256]
    for log2n, p in enumerate(points, start=1):
        assert p["messages_per_rank"] == log2n, p
        assert p["path_messages"] == log2n, p
        assert p["bytes_per_rank"] == log2n * points[0]["bytes_per_rank"], p
        assert p["rank0_us_per_op"] > 0 and p["rank0_bytes"] > 0, p
    # Rank 0's memory does not depend on N (the same cache learnt at every size).
    assert max(p["rank0_bytes"] for p in points) < 1.1 * min(p["rank0_bytes"] for p in points)
