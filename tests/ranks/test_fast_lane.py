"""The fast lane (csrc/core/fast_lane.h): a blocking op of a cached name, every rank on
one host, runs in one pass through shared memory. Results match the engine's for every
op, dtype, scaling and in-place form; async and blocking submissions of one name mix;
a late rank, a joined rank and rank 0's timeline send ops back to the engine and the
lane resumes; mismatches still raise on every rank; HVD_TORCH_FAST_LANE=0 turns it
off. 2 and 3 ranks (spinning forced on, so 3 ranks on 2 cores use the lane too). A rank
killed between lane ops: tests/ranks/test_callers_drive.py, whose cached blocking
allreduces run on the lane."""

import json
import os
import time

import pytest
import torch

from dist_harness import run_ranks
from spin_env import PATIENT, SPIN

ROUNDS = 6


def _every_op_and_dtype():
    import hvd_torch as hvd
    from hvd_torch import _C

    hvd.init()
    r, n = hvd.rank(), hvd.size()
    wrong = []

    def expect(what, got, want):
        if not torch.equal(got, want):
            wrong.append((what, got.tolist(), want.tolist()))

    for step in range(ROUNDS):
        for dtype in (torch.float32, torch.float64, torch.int32, torch.int64, torch.bfloat16,
                      torch.float16, torch.uint8):
            tag = f"{dtype}".split(".")[1]
            x = torch.arange(6, dtype=torch.int64).to(dtype) + r + step
            total = sum(torch.arange(6, dtype=torch.int64) + k + step for k in range(n)).to(dtype)
            expect(f"sum.{tag}", hvd.allreduce(x, name=f"sum.{tag}", op=hvd.Sum), total)
            expect(f"max.{tag}", hvd.allreduce(x, name=f"max.{tag}", op=hvd.Max),
                   (torch.arange(6) + n - 1 + step).to(dtype))
            y = x.clone()
            hvd.allreduce_(y, name=f"min.{tag}", op=hvd.Min)
            expect(f"min.{tag}", y, (torch.arange(6) + step).to(dtype))
            b = torch.full((3, 2), r * 10 + step).to(dtype)
            expect(f"bcast.{tag}", hvd.broadcast(b, n - 1, name=f"bcast.{tag}"),
                   torch.full((3, 2), (n - 1) * 10 + step).to(dtype))
            hvd.broadcast_(b, 0, name=f"bcast_.{tag}")
            expect(f"bcast_.{tag}", b, torch.full((3, 2), step).to(dtype))
            g = torch.full((r + 1, 2), r + step).to(dtype)
            expect(f"gather.{tag}", hvd.allgather(g, name=f"gather.{tag}"),
                   torch.cat([torch.full((k + 1, 2), k + step) for k in range(n)]).to(dtype))
        # Average of integers truncates sum * (1 / n); floats with both scalings.
        a = torch.tensor([r + 1, 7 * r], dtype=torch.int32)
        expect("avg.int", hvd.allreduce(a, name="avg.int"),
               (sum(torch.tensor([k + 1, 7 * k]) for k in range(n)).double() * (1.0 / n))
               .to(torch.int32))
        f = torch.tensor([1.5 * r, 3.0 + step])
        got = hvd.allreduce(f, name="scaled", op=hvd.Sum, prescale_factor=0.5,
                            postscale_factor=3.0)
        want = sum(torch.tensor([1.5 * k, 3.0 + step]) * 0.5 for k in range(n)) * 3.0
        if not torch.allclose(got, want):
            wrong.append(("scaled", got.tolist(), want.tolist()))
        bools = torch.tensor([r == 0, True, False])
        expect("or", hvd.allreduce(bools, name="or", op=hvd.Sum), torch.tensor([True, True, False]))
        # Alltoall with uneven splits: rank r sends r + d + 1 rows to rank d.
        rows = [r + d + 1 for d in range(n)]
        send = torch.cat([torch.full((k, 2), 100 * r + d) for d, k in enumerate(rows)]).float()
        out, received = hvd.alltoall(send, splits=torch.tensor(rows), name="a2a")
        expect("a2a", out, torch.cat([torch.full((s + r + 1, 2), 100 * s + r)
                                      for s in range(n)]).float())
        expect("a2a.received", received, torch.tensor([s + r + 1 for s in range(n)],
                                                       dtype=torch.int32))
        rs = hvd.reducescatter(torch.arange(2 * n * 3, dtype=torch.float32).reshape(2 * n, 3) + r,
                               name="rs", op=hvd.Average)
        full = torch.arange(2 * n * 3, dtype=torch.float32).reshape(2 * n, 3) + (n - 1) / 2
        expect("rs", rs, full[2 * r:2 * r + 2])
        # A non-contiguous in-place input comes back through its copy.
        m = torch.arange(12, dtype=torch.float32).reshape(3, 4) + r
        col = m[:, 1]
        hvd.allreduce_(col, name="column", op=hvd.Sum)
        expect("column", m[:, 1], (torch.arange(3) * 4 + 1) * n + float(n * (n - 1) // 2))
    res = {"wrong": wrong[:5], "lane": _C.lane_ops(), "gave_up": _C.lane_gave_up(),
           "off": _C.lane_off()}
    hvd.shutdown()
    return res


@pytest.mark.parametrize("nranks", [2, 3])
def test_every_op_and_dtype_gives_the_engines_results(nranks):
    for res in run_ranks(_every_op_and_dtype, nranks, env=PATIENT, timeout=120):
        assert res["wrong"] == [], res
        # 48 names, each cached from its second call on: on a quiet machine
        # nearly all of their 240 later calls run on the lane (the serial test
        # below counts that); ranks short of cores give up more often.
        assert res["lane"] > 0, res


def _async_and_blocking_of_one_name():
    import hvd_torch as hvd
    from hvd_torch import _C

    hvd.init()
    r, n = hvd.rank(), hvd.size()
    sums = []
    for i in range(300):
        x = torch.tensor([float(r + i)])
        # Each rank takes the async path on its own rounds: the others wait on the
        # lane for a rank that went to the engine.
        if i % (n + 2) == r:
            hvd.allreduce_(x, name="mixed", op=hvd.Sum)
        elif i % 7 == r:
            hvd.synchronize(hvd.allreduce_async_(x, name="mixed", op=hvd.Sum))
        else:
            hvd.allreduce_(x, name="mixed", op=hvd.Sum)
        sums.append(x.item())
    res = {"ok": sums == [float(n * i + n * (n - 1) // 2) for i in range(300)],
           "lane": _C.lane_ops()}
    hvd.shutdown()
    return res


@pytest.mark.parametrize("nranks", [2, 3])
def test_async_and_blocking_submissions_of_one_name_mix(nranks):
    for res in run_ranks(_async_and_blocking_of_one_name, nranks, env=PATIENT, timeout=120):
        assert res["ok"], res
        assert res["lane"] > 0, res


def _late_ranks():
    import hvd_torch as hvd
    from hvd_torch import _C

    hvd.init()
    r, n = hvd.rank(), hvd.size()
    sums = []
    for i in range(60):
        if i % 10 == 5 and r == n - 1:
            time.sleep(0.01)  # far past the others' 100 us patience
        sums.append(hvd.allreduce(torch.tensor([float(i)]), name="late", op=hvd.Sum).item())
    gave_up = _C.lane_gave_up()
    # The lane resumes: on a loaded machine, perhaps only after more calls.
    more, _ = _until_every_rank_used_the_lane(
        hvd, lambda: hvd.allreduce(torch.tensor([1.0]), name="late", op=hvd.Sum).item(), least=1)
    res = {"ok": sums == [float(n * i) for i in range(60)] and more == [float(n)] * len(more),
           "lane": _C.lane_ops(), "gave_up": gave_up}
    hvd.shutdown()
    return res


@pytest.mark.parametrize("nranks", [2, 3])
def test_a_late_rank_sends_one_op_to_the_engine_and_the_lane_resumes(nranks):
    results = run_ranks(_late_ranks, nranks, env=SPIN, timeout=120)
    for res in results:
        assert res["ok"], res
        assert res["lane"] > 0, res
    # The ranks that waited gave up on the late rounds (5 of them).
    assert sum(res["gave_up"] for res in results[:-1]) >= 5, results


def _join_then_more():
    import hvd_torch as hvd
    from hvd_torch import _C

    hvd.init()
    r, n = hvd.rank(), hvd.size()
    for _ in range(5):
        hvd.allreduce(torch.ones(2), name="j", op=hvd.Sum)
    during = []
    if r == 0:
        # The others have joined: they take part with zeros.
        for i in range(20):
            during.append(hvd.allreduce(torch.full((2,), float(i)), name="j", op=hvd.Sum)
                          .tolist())
        # A name first used while the others have joined (reduced inline by
        # rank 0): they learn its slot too, so its later calls stay in step.
        for _ in range(3):
            during.append(hvd.allreduce(torch.ones(1), name="fresh", op=hvd.Sum).tolist())
    last = hvd.join()
    after, lane_after = _until_every_rank_used_the_lane(
        hvd, lambda: hvd.allreduce(torch.ones(2), name="j", op=hvd.Sum).tolist())
    fresh, lane_fresh = _until_every_rank_used_the_lane(
        hvd, lambda: hvd.allreduce(torch.ones(1), name="fresh", op=hvd.Sum).item())
    res = {"during": during, "last": last, "after": after, "fresh": fresh,
           "lane_after": lane_after, "lane_fresh": lane_fresh}
    hvd.shutdown()
    return res


def _until_every_rank_used_the_lane(hvd, call, least=20, most=400):
    """Calls `call` at least `least` times, then until every rank ran one of its
    calls on the lane (at most `most`): a loaded machine makes ranks give up on
    some calls, never on all of them unless the lane stays off. The ranks agree
    on when to stop through an allreduce of their own counts."""
    from hvd_torch import _C

    results, on_lane = [], 0
    for i in range(most):
        before = _C.lane_ops()
        results.append(call())
        on_lane += _C.lane_ops() - before
        if i + 1 >= least and hvd.allreduce(torch.tensor([min(on_lane, 1)]), name="stop?",
                                            op=hvd.Min).item() == 1:
            break
    return results, on_lane


@pytest.mark.parametrize("nranks", [2, 3])
def test_joined_ranks_take_part_and_the_lane_resumes_after_join(nranks):
    for r, res in enumerate(run_ranks(_join_then_more, nranks, env=PATIENT, timeout=120)):
        if r == 0:
            assert res["during"] == [[float(i)] * 2 for i in range(20)] + [[1.0]] * 3, res
        assert res["last"] == 0, res
        assert res["after"] == [[float(nranks)] * 2] * len(res["after"]), res
        assert res["fresh"] == [float(nranks)] * len(res["fresh"]), res
        # Counts of "fresh" out of step would turn the lane off (after a 2 s
        # wait) at its first call: none of its calls would run there, however
        # many there were.
        assert res["lane_after"] > 0 and res["lane_fresh"] > 0, res


def _with_timeline(path):
    import hvd_torch as hvd
    from hvd_torch import _C

    hvd.init()
    for _ in range(5):
        hvd.allreduce(torch.ones(1), name="traced", op=hvd.Sum)
    hvd.start_timeline(path)
    before = _C.lane_ops()
    for _ in range(30):
        hvd.allreduce(torch.ones(1), name="traced", op=hvd.Sum)
    during = _C.lane_ops() - before
    hvd.stop_timeline()
    hvd.barrier()
    before = _C.lane_ops()
    for _ in range(30):
        hvd.allreduce(torch.ones(1), name="traced", op=hvd.Sum)
    res = {"during": during, "after": _C.lane_ops() - before}
    hvd.shutdown()
    return res


def test_the_timeline_sees_every_op_while_it_records(tmp_path):
    path = str(tmp_path / "timeline.json")
    results = run_ranks(_with_timeline, 2, args=(path,), env=PATIENT, timeout=120)
    for res in results:
        # The pause reaches the others with rank 0's next cycle: the first op
        # may still run on the lane.
        assert res["during"] <= 1, res
        assert res["after"] > 0, res
    with open(path) as f:
        events = json.load(f)
    pid = next(e["pid"] for e in events
               if e.get("name") == "process_name" and e["args"]["name"] == "allreduce.traced")
    negotiated = [e for e in events
                  if e["pid"] == pid and e["ph"] == "B" and e["name"] == "NEGOTIATE_ALLREDUCE"]
    # Every op recorded but the one that may have run on the lane.
    assert len(negotiated) >= 29, len(negotiated)


def _mismatched_shapes():
    import hvd_torch as hvd

    hvd.init()
    r = hvd.rank()
    for _ in range(5):
        hvd.allreduce(torch.ones(3), name="shape", op=hvd.Sum)
    try:
        hvd.allreduce(torch.ones(3 + r), name="shape", op=hvd.Sum)
    except ValueError as e:
        error = str(e)
    else:
        error = None
    ok = hvd.allreduce(torch.ones(3), name="shape", op=hvd.Sum).tolist()
    hvd.shutdown()
    return {"error": error, "ok": ok}


@pytest.mark.parametrize("nranks", [2, 3])
def test_a_mismatch_after_cached_rounds_raises_on_every_rank(nranks):
    for res in run_ranks(_mismatched_shapes, nranks, env=SPIN, timeout=120):
        assert res["error"] is not None and "mismatched shapes" in res["error"], res
        assert res["ok"] == [float(nranks)] * 3, res


@pytest.mark.serial  # counts lane ops: ranks short of cores give up more often
@pytest.mark.parametrize("nranks", [2, 3])
def test_on_a_quiet_machine_nearly_every_cached_call_runs_on_the_lane(nranks):
    # The default patience where every rank has a core; with more ranks than
    # cores even a quiet machine's scheduler keeps one waiting longer.
    env = SPIN if nranks <= (os.cpu_count() or 1) else PATIENT
    for res in run_ranks(_every_op_and_dtype, nranks, env=env, timeout=120):
        assert res["wrong"] == [], res
        assert res["lane"] >= 48 * (ROUNDS - 1) * 3 // 4, res
    for res in run_ranks(_async_and_blocking_of_one_name, nranks, env=env, timeout=120):
        # Rounds where every rank blocks (about 5 of 7 on 2 ranks, 4 of 7 on 3)
        # still meet on the lane: an async submission costs its own round only.
        assert res["ok"] and res["lane"] >= 100, res


def _count_lane_ops():
    import hvd_torch as hvd
    from hvd_torch import _C

    hvd.init()
    sums = [hvd.allreduce(torch.ones(1), name="off", op=hvd.Sum).item() for _ in range(50)]
    res = {"lane": _C.lane_ops(), "ok": sums == [float(hvd.size())] * 50}
    hvd.shutdown()
    return res


def test_rank_0_turns_the_lane_off_for_the_job():
    env = {**SPIN, "HVD_TORCH_FAST_LANE": "0"}
    for res in run_ranks(_count_lane_ops, 2, env=env, timeout=120):
        assert res == {"lane": 0, "ok": True}, res
