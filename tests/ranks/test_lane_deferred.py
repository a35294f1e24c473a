"""Deferred async ops (csrc/core/lane.h): an async op of a cached name waits
for its caller to synchronize and then runs on the fast lane, where the other ranks'
callers meet it in one pass. Results match for every async op; the lane runs them; a
rank whose caller waits elsewhere (not in hvd) does not hold the others (the watch
thread sends its op on after HVD_TORCH_FAST_LANE_DEFER_US); poll() makes its op
progress; a blocking op submitted next sends the deferred ones first; shutdown fails
them; a mismatch still raises on every rank. 2 and 3 ranks (spinning forced on)."""

import os
import time

import pytest
import torch

from dist_harness import run_ranks
from spin_env import PATIENT, SPIN

# No watch thread in practice: only the callers send deferred ops on.
NO_WATCH = {**SPIN, "HVD_TORCH_FAST_LANE_DEFER_US": "600000000"}


def _every_async_op():
    import hvd_torch as hvd
    from hvd_torch import _C

    hvd.init()
    r, n = hvd.rank(), hvd.size()
    wrong, on_lane = [], 0
    for step in range(12):
        before = _C.lane_ops()
        x = torch.arange(4, dtype=torch.float32) + r + step
        y = x.clone()
        b = torch.full((3,), float(r * 10 + step))
        g = torch.full((r + 1, 2), float(r + step))
        rows = [r + d + 1 for d in range(n)]
        send = torch.cat([torch.full((k, 2), float(100 * r + d)) for d, k in enumerate(rows)])
        rs = torch.arange(2 * n * 3, dtype=torch.float32).reshape(2 * n, 3) + r
        handles = {
            "sum": hvd.allreduce_async(x, name="d.sum", op=hvd.Sum),
            "sum_": hvd.allreduce_async_(y, name="d.sum_", op=hvd.Sum),
            "bcast_": hvd.broadcast_async_(b, n - 1, name="d.bcast_"),
            "gather": hvd.allgather_async(g, name="d.gather"),
            "a2a": hvd.alltoall_async(send, splits=torch.tensor(rows), name="d.a2a"),
            "rs": hvd.reducescatter_async(rs, name="d.rs", op=hvd.Average),
        }
        total = sum(torch.arange(4, dtype=torch.float32) + k + step for k in range(n))
        want = {
            "sum": total,
            "sum_": total,
            "bcast_": torch.full((3,), float((n - 1) * 10 + step)),
            "gather": torch.cat([torch.full((k + 1, 2), float(k + step)) for k in range(n)]),
            "a2a": torch.cat([torch.full((s + r + 1, 2), float(100 * s + r)) for s in range(n)]),
            "rs": (torch.arange(2 * n * 3, dtype=torch.float32).reshape(2 * n, 3)
                   + (n - 1) / 2)[2 * r:2 * r + 2],
        }
        for key, h in handles.items():
            got = hvd.synchronize(h)
            got = got[0] if key == "a2a" else got
            if not torch.equal(got, want[key]):
                wrong.append((step, key, got.tolist(), want[key].tolist()))
        if not torch.equal(y, total):
            wrong.append((step, "in place", y.tolist()))
        on_lane += _C.lane_ops() - before
    res = {"wrong": wrong[:5], "on_lane": on_lane, "gave_up": _C.lane_gave_up(),
           "off": _C.lane_off()}
    hvd.shutdown()
    return res


@pytest.mark.parametrize("nranks", [2, 3])
def test_every_async_op_gives_the_engines_results_and_runs_on_the_lane(nranks):
    for res in run_ranks(_every_async_op, nranks, env=PATIENT, timeout=120):
        assert res["wrong"] == [], res
        # Cached from each name's second step: async ops reach the lane too (a
        # loaded machine gives up on some, never on all of 66).
        assert res["on_lane"] > 0, res


def _k_async_then_synchronize(k):
    import hvd_torch as hvd
    from hvd_torch import _C

    hvd.init()
    r, n = hvd.rank(), hvd.size()
    bufs = [torch.full((8,), float(r + i)) for i in range(k)]
    ok = True
    before = 0
    for step in range(20):
        if step == 1:
            before = _C.lane_ops()  # every name cached
        handles = [hvd.allreduce_async_(b, name=f"k.{i}", op=hvd.Sum) for i, b in enumerate(bufs)]
        for h in handles:
            hvd.synchronize(h)
        ok = ok and all(torch.equal(b, torch.full((8,), float(n * (n - 1) // 2 + n * (i + step))))
                        for i, b in enumerate(bufs))
        for i, b in enumerate(bufs):
            b.fill_(float(r + i + step + 1))
    res = {"ok": ok, "on_lane": _C.lane_ops() - before}
    hvd.shutdown()
    return res


@pytest.mark.serial  # counts lane ops: ranks short of cores give up more often
@pytest.mark.parametrize("nranks", [2, 3])
def test_on_a_quiet_machine_most_of_k_async_ops_run_on_the_lane(nranks):
    # The default patience where every rank has a core (tests/ranks/test_fast_lane.py).
    env = SPIN if nranks <= (os.cpu_count() or 1) else PATIENT
    for res in run_ranks(_k_async_then_synchronize, nranks, args=(50,), env=env, timeout=120):
        assert res["ok"], res
        assert res["on_lane"] >= 19 * 50 // 2, res


def _cached_then_async(name):
    """Starts hvd, caches `name` (three blocking calls) and submits it async once more:
    (hvd, rank, size, the tensor, its handle)."""
    import hvd_torch as hvd

    hvd.init()
    for _ in range(3):
        hvd.allreduce(torch.ones(2), name=name, op=hvd.Sum)
    t = torch.ones(2)
    return hvd, hvd.rank(), hvd.size(), t, hvd.allreduce_async_(t, name=name, op=hvd.Sum)


def _one_rank_waits_elsewhere(flag):
    hvd, r, n, t, h = _cached_then_async("w")
    saw = None
    if r == n - 1:
        # Waits for the others' results before it synchronizes: only its watch
        # thread can send its op on meanwhile.
        deadline = time.monotonic() + 60
        while not os.path.exists(flag) and time.monotonic() < deadline:
            time.sleep(0.005)
        saw = os.path.exists(flag)
        hvd.synchronize(h)
    else:
        hvd.synchronize(h)
        if r == 0:
            with open(flag, "w") as f:
                f.write("done")
    res = {"t": t.tolist(), "saw": saw}
    hvd.shutdown()
    return res


@pytest.mark.parametrize("nranks", [2, 3])
def test_a_rank_waiting_elsewhere_does_not_hold_the_others(nranks, tmp_path):
    results = run_ranks(_one_rank_waits_elsewhere, nranks, args=(str(tmp_path / "flag"),),
                        env=SPIN, timeout=120)
    for res in results:
        assert res["t"] == [float(nranks)] * 2, res
    assert results[-1]["saw"] is True, results


def _poll_then_synchronize():
    hvd, r, n, t, h = _cached_then_async("p")
    polled = None
    if r == n - 1:
        deadline = time.monotonic() + 60
        polled = hvd.poll(h)
        while not polled and time.monotonic() < deadline:
            time.sleep(0.001)
            polled = hvd.poll(h)
    hvd.synchronize(h)
    res = {"t": t.tolist(), "polled": polled}
    hvd.shutdown()
    return res


@pytest.mark.parametrize("nranks", [2, 3])
def test_poll_makes_a_deferred_op_progress(nranks):
    results = run_ranks(_poll_then_synchronize, nranks, env=NO_WATCH, timeout=120)
    for res in results:
        assert res["t"] == [float(nranks)] * 2, res
    assert results[-1]["polled"] is True, results


def _blocking_op_after_a_deferred_one():
    import hvd_torch as hvd

    hvd.init()
    r, n = hvd.rank(), hvd.size()
    for _ in range(3):
        hvd.allreduce(torch.ones(1), name="x", op=hvd.Sum)
        hvd.allreduce(torch.ones(1), name="y", op=hvd.Sum)
    x = torch.ones(1)
    if r == 0:
        # The others' blocking "x" waits for ours: submitting "y" sends it on.
        h = hvd.allreduce_async_(x, name="x", op=hvd.Sum)
        y = hvd.allreduce(torch.ones(1), name="y", op=hvd.Sum)
        hvd.synchronize(h)
    else:
        hvd.allreduce_(x, name="x", op=hvd.Sum)
        y = hvd.allreduce(torch.ones(1), name="y", op=hvd.Sum)
    res = {"x": x.item(), "y": y.item()}
    hvd.shutdown()
    return res


@pytest.mark.parametrize("nranks", [2, 3])
def test_a_blocking_op_sends_the_deferred_ones_first(nranks):
    for res in run_ranks(_blocking_op_after_a_deferred_one, nranks, env=NO_WATCH, timeout=120):
        assert res == {"x": float(nranks), "y": float(nranks)}, res


def _shutdown_with_a_deferred_op():
    hvd, _, _, _, h = _cached_then_async("s")
    hvd.barrier()
    start = time.monotonic()
    hvd.shutdown()
    return {"handle": h >= 0, "shutdown_s": time.monotonic() - start}


@pytest.mark.parametrize("nranks", [2, 3])
def test_shutdown_with_a_deferred_op_returns(nranks):
    for res in run_ranks(_shutdown_with_a_deferred_op, nranks, env=NO_WATCH, timeout=120):
        assert res["handle"], res
        assert res["shutdown_s"] < 30, res


def _deferred_mismatch():
    import hvd_torch as hvd

    hvd.init()
    r = hvd.rank()
    for _ in range(5):
        hvd.allreduce(torch.ones(3), name="shape", op=hvd.Sum)
    h = hvd.allreduce_async(torch.ones(3 + r), name="shape", op=hvd.Sum)
    try:
        hvd.synchronize(h)
    except ValueError as e:
        error = str(e)
    else:
        error = None
    h = hvd.allreduce_async(torch.ones(3), name="shape", op=hvd.Sum)
    ok = hvd.synchronize(h).tolist()
    res = {"error": error, "ok": ok, "n": hvd.size()}
    hvd.shutdown()
    return res


@pytest.mark.parametrize("nranks", [2, 3])
def test_a_deferred_mismatch_raises_on_every_rank(nranks):
    for res in run_ranks(_deferred_mismatch, nranks, env=NO_WATCH, timeout=120):
        assert res["error"] is not None and "shape" in res["error"], res
        assert "[3]" in res["error"] and "[4]" in res["error"], res
        assert res["ok"] == [float(nranks)] * 3, res
