"""bench/ab_builds.py's arithmetic: which cells it compares and how (no run)."""

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "bench"))

import ab_builds  # noqa: E402


def _result(scale):
    """A collectives_bench.py JSON with hvd-torch's times multiplied by scale."""
    def summary(us):
        return {"time_us": us}
    return {"rows": [{"op": "allreduce", "bytes": 4,
                      "results": {"hvd allreduce_": summary(10 * scale), "torch": summary(99)}}],
            "many": [{"tensors": 100, "bytes": 1024,
                      "results": {"hvd allreduce_async_": summary(4 * scale)}}]}


def test_only_hvd_columns_are_compared_as_a_over_b_per_round():
    rounds = [(ab_builds.cells(_result(1.0)), ab_builds.cells(_result(0.5))),
              (ab_builds.cells(_result(1.0)), ab_builds.cells(_result(0.8))),
              (ab_builds.cells(_result(1.0)), ab_builds.cells(_result(1.0)))]
    table = ab_builds.compare(rounds)
    assert [(r["op"], r["bytes"], r["column"]) for r in table] == [
        ("allreduce", 4, "hvd allreduce_"), ("many 100x", 1024, "hvd allreduce_async_")]
    for row in table:  # B took 0.5, 0.8 and 1.0 of A's time
        assert row["ratio_median"] == pytest.approx(1.25)
        assert (row["ratio_min"], row["ratio_max"]) == pytest.approx((1.0, 2.0))
    assert ab_builds.geomean([2.0, 0.5]) == pytest.approx(1.0)


def test_arguments_after_the_separator_go_to_the_bench():
    args = ab_builds.parse_args(["--a", "x", "--b", "y", "--", "-np", "2", "-b", "4"])
    assert (args.a, args.b, args.rounds) == ("x", "y", 3)
    assert args.bench_args == ["-np", "2", "-b", "4"]


def test_each_build_runs_its_own_bench_script(tmp_path):
    # The bench puts its own repository first on the ranks' PYTHONPATH: A's run must
    # start A's script, or both runs measure one build.
    cmd = ab_builds.bench_command(str(tmp_path / "a"), ["-np", "2"], str(tmp_path / "a0.json"))
    assert cmd[1] == str(tmp_path / "a" / "bench" / "collectives_bench.py")
    assert cmd[2:4] == ["-np", "2"] and cmd[cmd.index("--json") + 1] == str(tmp_path / "a0.json")
