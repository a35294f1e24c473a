"""bench/report.py's verdicts on issue #32's goals against Open MPI, from rows as
collectives_bench.py writes them (no run)."""

import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "bench"))

import report  # noqa: E402


def _row(op, nbytes, mpi_over_hvd):
    return {"op": op, "bytes": nbytes, "ratios": {"mpi/hvd allreduce_": mpi_over_hvd,
                                                  "torch/hvd allreduce_": 10.0}}


def _result(small, large, k_async=None, np=2):
    rows = [_row("allreduce", 4 << i, r) for i, r in enumerate(small)]
    rows += [_row("allreduce", (1 << 20) << i, r) for i, r in enumerate(large)]
    many = [] if k_async is None else [{"bytes": 1024, "ratios": {"mpi K/hvd K": k_async}}]
    return {"np": np, "rows": rows, "many": many}


def _verdicts(result):
    return [(t["passed"], t["measured"]) for t in report.mpi_targets(result)]


def test_each_goal_needs_ninety_percent_of_its_cells():
    # 10 small cells, one under 0.5: 90 % met. 9 large cells (1..256 MiB), two under 1.
    small = [0.6] * 9 + [0.45]
    large = [1.1] * 7 + [0.9, 0.95]
    (small_ok, small_text), (large_ok, large_text), (mean_ok, _) = _verdicts(
        _result(small, large))
    assert small_ok is True and small_text.startswith("9 of 10 (90%); worst 0.45")
    assert large_ok is False and large_text.startswith("7 of 9 (78%); worst 0.90")
    assert mean_ok is False  # the small ops pull the mean under 1


def test_the_k_async_form_counts_among_the_small_cells_and_the_mean():
    (small_ok, text), _, (mean_ok, mean_text) = _verdicts(
        _result([0.6] * 9, [2.0] * 9, k_async=0.3))
    assert small_ok is True and "worst 0.30 (hvd K 1K)" in text and text.startswith("9 of 10")
    assert mean_text.endswith("over 19 cells")


def test_judged_on_two_ranks_only_and_not_measured_without_mpi():
    assert all(ok is None for ok, _ in _verdicts(_result([0.6] * 3, [2.0] * 3, np=4)))
    assert _verdicts({"np": 2, "rows": [], "many": []}) == [
        (None, "not measured (needs --mpi)")] * 2


def test_each_hvd_form_meets_mpis_same_form():
    # In place against MPI in place; out of place against MPI's out-of-place form,
    # which for a broadcast includes the root's copy into its output.
    results = {"hvd broadcast_": {"time_us": 2.0}, "hvd broadcast": {"time_us": 3.0},
               "torch": {"time_us": 30.0}, "mpi": {"time_us": 1.5},
               "mpi out": {"time_us": 2.4}}
    r = report.ratios(results)
    assert r["mpi/hvd broadcast_"] == 1.5 / 2.0
    assert r["mpi/hvd broadcast"] == 2.4 / 3.0
    assert r["torch/hvd broadcast"] == 30.0 / 3.0
    # The out-of-place form against MPI in place is kept, not judged.
    assert report.in_place_mpi_ratios(results) == {"hvd broadcast": 1.5 / 3.0}
    row = {"op": "broadcast", "bytes": 4, "ratios": r,
           "in_place_mpi_ratios": report.in_place_mpi_ratios(results)}
    verdicts = report.mpi_targets({"np": 2, "rows": [row], "many": []})
    assert verdicts[-1]["passed"] is None
    assert verdicts[-1]["measured"].startswith("small >= 0.5: 1 of 1, large >= 1: 0 of 0")


def test_without_an_out_of_place_mpi_form_every_hvd_form_meets_mpi():
    results = {"hvd allgather": {"time_us": 4.0}, "mpi": {"time_us": 2.0}}
    assert report.ratios(results) == {"mpi/hvd allgather": 0.5}
    assert report.in_place_mpi_ratios(results) == {}


def test_synthetic_verdict_quotes_the_spread_and_the_sync_bound(tmp_path, monkeypatch):
    monkeypatch.setattr(report, "HERE", str(tmp_path))
    (tmp_path / "results").mkdir()
    saved = {"date": "2026-11-28T11:00:00+00:00", "ratio_hvd_ddp": 1.06,
             "ratio_hvd_ddp_per_iter": [0.97, 1.05, 1.10],
             "results": {"hvd": {"of_sync_bound": 0.96}, "ddp": {"of_sync_bound": 0.9}}}
    (tmp_path / "results" / "synthetic_2.json").write_text(json.dumps(saved))
    t = report.synthetic_target(2)
    assert t["passed"] is True
    assert t["measured"].startswith(
        "hvd/ddp 1.060 (per iteration: median 1.050, 0.970-1.100); "
        "of the sync bound: hvd 96.0%, ddp 90.0%")
    saved["ratio_hvd_ddp"] = 0.99
    (tmp_path / "results" / "synthetic_2.json").write_text(json.dumps(saved))
    assert report.synthetic_target(2)["passed"] is False
    assert "missing" in report.synthetic_target(3)["measured"]
