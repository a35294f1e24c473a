"""A grouped allreduce of CPU tensors of one dtype travels as one op (a bundle): values
of every member, in-place with a non-contiguous member, scaling, bool, the inline and
collective paths, the response cache, joined ranks, and mismatches named by member; on
the shared-memory and the Gloo plane, 1, 2 and 3 ranks."""

import sys
from pathlib import Path

import pytest
import torch

from dist_harness import run_ranks  # noqa: E402

# Sizes that put one bundle across the inline cap, the shm slots and the fusion buffer.
SHAPES = [(3,), (2, 5), (1000,), (70000,), (4, 4), (1,)]


def _members(rank):
    return [torch.full(s, float(rank + 1 + i)) for i, s in enumerate(SHAPES)]


def _rank_main():
    import hvd_torch as hvd
    from hvd_torch import _C

    torch.set_num_threads(1)
    hvd.init()
    r, n = hvd.rank(), hvd.size()
    res = {"plane": _C.backend_name() if n > 1 else "local"}
    res["sum"] = [hvd.grouped_allreduce(_members(r), name="b.sum", op=hvd.Sum)
                  for _ in range(4)]  # the same name again: the response cache's path
    res["scaled"] = hvd.grouped_allreduce(_members(r), name="b.avg", prescale_factor=2.0,
                                          postscale_factor=0.25)
    strided = (torch.arange(12.0).view(3, 4) * (r + 1)).t()  # not contiguous
    group = [strided, torch.full((5,), float(r))]
    res["inplace_same"] = hvd.grouped_allreduce_(group, op=hvd.Sum) is group
    res["inplace"] = group
    res["small"] = hvd.grouped_allreduce([torch.full((2,), float(r + 1)) for _ in range(3)],
                                         op=hvd.Sum)
    res["bool"] = hvd.grouped_allreduce([torch.tensor([r == 0, False]), torch.tensor([True])],
                                        op=hvd.Max)
    h = hvd.grouped_allreduce_async(_members(r), name="b.async", op=hvd.Min)
    res["async"] = hvd.synchronize(h)
    if n > 1:
        try:
            hvd.grouped_allreduce([torch.ones(2)] * (2 + (r == 1)), name="b.count")
            res["count"] = None
        except ValueError as e:
            res["count"] = str(e)
        # Rank 0 joins at once; the others' bundle runs with its zeros.
        if r > 0:
            res["joined"] = hvd.grouped_allreduce(
                [torch.full((3,), float(r + 1)), torch.full((50000,), float(r + 1))],
                name="b.joined", op=hvd.Sum)
        res["last"] = hvd.join()
    res["after"] = hvd.allreduce(torch.ones(1), op=hvd.Sum)
    return res


@pytest.mark.parametrize("nranks,plane", [(1, "local"), (2, "shm"), (3, "shm"), (2, "gloo"),
                                          (3, "gloo")])
def test_bundle(nranks, plane):
    env = {"HVD_TORCH_SHM": "0"} if plane == "gloo" else None
    results = run_ranks(_rank_main, nranks, timeout=120, env=env)
    ranks = range(nranks)
    for rank, res in enumerate(results):
        assert res["plane"] == plane
        for got in res["sum"]:
            for i, (g, s) in enumerate(zip(got, SHAPES)):
                want = torch.full(s, float(sum(q + 1 + i for q in ranks)))
                assert torch.equal(g, want), (rank, i, g.flatten()[:4], want.flatten()[:4])
        for i, (g, s) in enumerate(zip(res["scaled"], SHAPES)):
            mean = sum(q + 1 + i for q in ranks) / nranks
            assert torch.allclose(g, torch.full(s, mean * 0.5)), (rank, i)
        assert res["inplace_same"]
        total = sum(q + 1 for q in ranks)
        assert torch.equal(res["inplace"][0], (torch.arange(12.0).view(3, 4) * total).t())
        assert torch.equal(res["inplace"][1], torch.full((5,), float(sum(ranks))))
        for g in res["small"]:
            assert torch.equal(g, torch.full((2,), float(total)))
        assert res["bool"][0].tolist() == [True, False] and res["bool"][1].tolist() == [True]
        for i, (g, s) in enumerate(zip(res["async"], SHAPES)):
            assert torch.equal(g, torch.full(s, float(1 + i))), (rank, i)  # rank 0's values
        assert torch.equal(res["after"], torch.tensor([float(nranks)]))
        if nranks == 1:
            continue
        msg = res["count"]
        assert msg and "group 'b.count' failed: mismatched group sizes" in msg, msg
        assert "rank 0 2 tensors, rank 1 3 tensors" in msg, msg
        if rank > 0:
            joined = float(sum(q + 1 for q in ranks if q > 0))  # rank 0 adds zeros
            assert torch.equal(res["joined"][0], torch.full((3,), joined))
            assert torch.equal(res["joined"][1], torch.full((50000,), joined))
        assert res["last"] in range(1, nranks)  # a rank that submitted the bundle joined last


def _views_main():
    """Members that are views of one buffer: adjacent ones travel as one span (the
    executor merges them), reversed or gapped ones as several; all exact, gaps untouched."""
    import hvd_torch as hvd

    torch.set_num_threads(1)
    hvd.init()
    r = hvd.rank()
    res = {}

    def buffer():  # element k holds (r + 1) * (k % 13 + 1)
        return (torch.arange(300000.0) % 13 + 1) * (r + 1)

    # 70000-element members cross the shm slots: a merged span spans rounds.
    buf = buffer()
    members = list(buf[:280000].split(70000)) + list(buf[280000:].split(7))
    refs = [sys.getrefcount(t) for t in members]
    versions = [t._version for t in members]
    hvd.grouped_allreduce_(members, name="v.adjacent", op=hvd.Sum)
    res["adjacent"] = buf
    res["refs_kept"] = [sys.getrefcount(t) for t in members] == refs
    res["versions_bumped"] = all(t._version > v for t, v in zip(members, versions))
    buf = buffer()
    hvd.grouped_allreduce_(list(reversed(buf.split(1000))), name="v.reversed", op=hvd.Sum)
    res["reversed"] = buf
    buf = buffer()
    gapped = [buf[k * 1000:k * 1000 + 600] for k in range(300)]  # 400 untouched after each
    hvd.grouped_allreduce_(gapped, name="v.gapped", op=hvd.Sum)
    res["gapped"] = buf
    buf = buffer()
    outs = hvd.grouped_allreduce(list(buf.split(50000)), name="v.functional", op=hvd.Sum)
    res["functional"] = (buf, torch.cat(outs))
    buf = buffer()  # separate ops on adjacent views, fused by the engine
    handles = [hvd.allreduce_async_(v, name=f"v.fused.{i}", op=hvd.Sum)
               for i, v in enumerate(buf.split(3000))]
    for h in handles:
        hvd.synchronize(h)
    res["fused"] = buf
    return res


@pytest.mark.parametrize("nranks,plane", [(2, "shm"), (3, "shm"), (2, "gloo")])
def test_members_viewing_one_buffer(nranks, plane):
    env = {"HVD_TORCH_SHM": "0"} if plane == "gloo" else None
    results = run_ranks(_views_main, nranks, timeout=120, env=env)
    pattern = torch.arange(300000.0) % 13 + 1
    total = pattern * sum(q + 1 for q in range(nranks))
    for rank, res in enumerate(results):
        for key in ("adjacent", "reversed", "fused"):
            assert torch.equal(res[key], total), (rank, key)
        assert res["refs_kept"] and res["versions_bumped"], rank
        inside = (torch.arange(300000) % 1000) < 600
        want = torch.where(inside, total, pattern * (rank + 1))
        assert torch.equal(res["gapped"], want), rank
        buf, out = res["functional"]
        assert torch.equal(buf, pattern * (rank + 1)) and torch.equal(out, total), rank
