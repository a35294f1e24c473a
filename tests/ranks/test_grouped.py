"""Grouped allreduce/allgather/reducescatter on 1, 2 and 3 ranks: values, async, gradients,
all-or-none, every dtype."""

import sys
from pathlib import Path

import pytest
import torch

from dist_harness import launch_once  # noqa: E402

SUM, AVERAGE = 1, 0
DTYPES = [torch.uint8, torch.int8, torch.int16, torch.int32, torch.int64, torch.float16,
          torch.bfloat16, torch.float32, torch.float64, torch.bool]


def _members(rank):
    """Mixed dtypes and sizes (inline and Gloo paths) in one group."""
    return [torch.full((3,), float(rank + 1)), torch.full((2, 2), rank, dtype=torch.int32),
            torch.full((5000,), float(rank), dtype=torch.float64)]


def _rank_main():
    import hvd_torch as hvd

    torch.set_num_threads(1)
    hvd.init()
    r, n = hvd.rank(), hvd.size()
    res = {}
    res["sum"] = hvd.grouped_allreduce(_members(r), op=hvd.Sum, name="g.sum")
    res["avg"] = hvd.grouped_allreduce(_members(r), name="g.avg")
    inplace = _members(r)
    res["inplace_is_same"] = hvd.grouped_allreduce_(inplace, op=hvd.Sum) is inplace
    res["inplace"] = inplace
    h = hvd.grouped_allreduce_async(_members(r), op=hvd.Sum)
    res["async"] = hvd.synchronize(h)
    h = hvd.grouped_allreduce_async_(_members(r), op=hvd.Max)
    res["async_"] = hvd.synchronize(h)
    res["gather"] = hvd.grouped_allgather([torch.full((r + 1, 2), r), torch.full((1,), r)])
    h = hvd.grouped_allgather_async([torch.full((r + 1, 2), r)])
    res["gather_async"] = hvd.synchronize(h)
    res["scatter"] = hvd.grouped_reducescatter([torch.arange(7.0), torch.arange(4.0)], op=SUM)
    h = hvd.grouped_reducescatter_async([torch.arange(5.0)], op=AVERAGE)
    res["scatter_async"] = hvd.synchronize(h)
    xs = [torch.ones(3, dtype=torch.float64, requires_grad=True),
          torch.ones(2, dtype=torch.float64, requires_grad=True)]
    ys = hvd.grouped_allreduce(xs, op=hvd.Sum)
    (ys[0].sum() * (r + 1) + ys[1].sum()).backward()
    res["grad.allreduce"] = [x.grad for x in xs]
    x = torch.ones(r + 1, 2, dtype=torch.float64, requires_grad=True)
    (y,) = hvd.grouped_allgather([x])
    (y * torch.arange(y.shape[0], dtype=torch.float64).view(-1, 1)).sum().backward()
    res["grad.allgather"] = x.grad
    x = torch.ones(5, dtype=torch.float64, requires_grad=True)
    (y,) = hvd.grouped_reducescatter([x], op=SUM)
    (y * (r + 1)).sum().backward()
    res["grad.reducescatter"] = x.grad
    if n > 1:
        try:
            hvd.grouped_allreduce([torch.ones(2), torch.ones(2 + r)], name="bad")
            res["bad"] = None
        except ValueError as e:
            res["bad"] = str(e)
    # One member per supported dtype, in one group each.
    res["dtypes.allreduce"] = hvd.grouped_allreduce(
        [torch.full((3,), r + 1).to(dt) for dt in DTYPES], op=hvd.Sum)
    res["dtypes.allgather"] = hvd.grouped_allgather(
        [torch.full((r + 1,), r).to(dt) for dt in DTYPES])
    res["dtypes.scatter"] = hvd.grouped_reducescatter(
        [torch.arange(5).to(dt) for dt in DTYPES], op=SUM)
    res["after"] = hvd.allreduce(torch.ones(1), op=hvd.Sum)
    return res


def _launch(nranks):
    """One launch per rank count, shared by every test below."""
    return launch_once(_rank_main, nranks, timeout=120)


def _slice(rows, size, rank):
    base, extra = divmod(rows, size)
    return rank * base + min(rank, extra), base + (1 if rank < extra else 0)


@pytest.mark.parametrize("nranks", [1, 2, 3])
def test_grouped_values(nranks):
    inputs = [_members(r) for r in range(nranks)]
    sums = [sum(m[i] for m in inputs) for i in range(3)]
    for rank, res in enumerate(_launch(nranks)):
        for got, want in zip(res["sum"], sums):
            assert got.dtype == want.dtype and torch.equal(got, want), (rank, got, want)
        for got, s in zip(res["avg"], sums):
            want = ((s.double() * (1.0 / nranks)).trunc().to(s.dtype)  # Horovod's integer Average
                    if not s.dtype.is_floating_point else s / nranks)
            assert torch.allclose(got.double(), want.double()), (rank, got, want)
        assert res["inplace_is_same"]
        for got, want in zip(res["inplace"], sums):
            assert torch.equal(got, want)
        for got, want in zip(res["async"], sums):
            assert torch.equal(got, want)
        maxes = [torch.stack([m[i] for m in inputs]).max(0).values for i in range(3)]
        for got, want in zip(res["async_"], maxes):
            assert torch.equal(got, want)
        rows = torch.cat([torch.full((r + 1, 2), r) for r in range(nranks)])
        assert torch.equal(res["gather"][0], rows)
        assert torch.equal(res["gather"][1], torch.arange(nranks))
        assert torch.equal(res["gather_async"][0], rows)
        for got, total in zip(res["scatter"], (7, 4)):
            start, count = _slice(total, nranks, rank)
            assert torch.equal(got, torch.arange(float(total))[start:start + count] * nranks)
        start, count = _slice(5, nranks, rank)
        assert torch.allclose(res["scatter_async"][0], torch.arange(5.0)[start:start + count])
        assert torch.equal(res["after"], torch.tensor([float(nranks)]))


@pytest.mark.parametrize("nranks", [1, 2, 3])
def test_grouped_every_dtype(nranks):
    total = sum(r + 1 for r in range(nranks))
    gathered = torch.cat([torch.full((r + 1,), r) for r in range(nranks)])
    for rank, res in enumerate(_launch(nranks)):
        start, count = _slice(5, nranks, rank)
        for i, dt in enumerate(DTYPES):
            # bool reduces with or: every value is True.
            want = torch.full((3,), total).to(dt)
            assert torch.equal(res["dtypes.allreduce"][i], want), (dt, res["dtypes.allreduce"][i])
            assert torch.equal(res["dtypes.allgather"][i], gathered.to(dt)), dt
            want = (torch.arange(5) * nranks).to(dt) if dt != torch.bool else torch.arange(5).bool()
            assert torch.equal(res["dtypes.scatter"][i], want[start:start + count]), dt


@pytest.mark.parametrize("nranks", [1, 2, 3])
def test_grouped_gradients(nranks):
    upstream0 = sum(r + 1 for r in range(nranks))  # Sum-allreduce of (r + 1)
    for rank, res in enumerate(_launch(nranks)):
        g0, g1 = res["grad.allreduce"]
        assert torch.equal(g0, torch.full((3,), float(upstream0), dtype=torch.float64))
        assert torch.equal(g1, torch.full((2,), float(nranks), dtype=torch.float64))
        # allgather: output row j has weight j on every rank; the Average over
        # ranks (Horovod's rule) gives j for this rank's rows.
        offset = sum(r + 1 for r in range(rank))
        want = torch.tensor([[offset + k] * 2 for k in range(rank + 1)], dtype=torch.float64)
        assert torch.equal(res["grad.allgather"], want), (rank, res["grad.allgather"], want)
        # reducescatter (Sum): row i lands on rank owner(i), whose upstream is
        # owner + 1; Horovod scales a Sum's gradient by the set's size.
        want = torch.cat([torch.full((_slice(5, nranks, o)[1],), float(nranks * (o + 1)),
                                     dtype=torch.float64) for o in range(nranks)])
        assert torch.equal(res["grad.reducescatter"], want), (rank, res["grad.reducescatter"])


@pytest.mark.parametrize("nranks", [2, 3])
def test_group_fails_as_a_unit_on_every_rank(nranks):
    for res in _launch(nranks):
        assert "group 'bad' failed" in res["bad"], res["bad"]
        assert "'bad.1': mismatched shapes" in res["bad"] and "rank 1 [3]" in res["bad"]
