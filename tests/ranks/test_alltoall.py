"""alltoall on 1, 2 and 3 ranks: every dtype, even/uneven/zero splits, async, gradients, errors."""

import sys
from pathlib import Path

import pytest
import torch

from dist_harness import launch_once  # noqa: E402

DTYPES = [torch.uint8, torch.int8, torch.int16, torch.int32, torch.int64, torch.float16,
          torch.bfloat16, torch.float32, torch.float64, torch.bool]


def _rows(rank, n, dtype):
    """Rank `rank`'s input: row i holds 10 * rank + i (mod what the dtype can hold)."""
    values = (torch.arange(n) + 10 * rank) % (2 if dtype == torch.bool else 100)
    return values.view(n, 1).repeat(1, 3).to(dtype)


def _splits(rank, size):
    """Uneven splits with zeros: rank r sends (r + d) % 3 rows to rank d."""
    return torch.tensor([(rank + d) % 3 for d in range(size)])


def _rank_main():
    import hvd_torch as hvd

    torch.set_num_threads(1)
    hvd.init()
    r, n = hvd.rank(), hvd.size()
    res = {"even": {}, "uneven": {}}
    for dtype in DTYPES:
        res["even"][str(dtype)] = hvd.alltoall(_rows(r, 2 * n, dtype), name=f"even.{dtype}")
        splits = _splits(r, n)
        x = _rows(r, int(splits.sum()), dtype)
        res["uneven"][str(dtype)] = hvd.alltoall(x, splits, name=f"uneven.{dtype}")
    h = hvd.alltoall_async(_rows(r, n, torch.float32), name="async")
    res["async"] = hvd.synchronize(h)
    x = _rows(r, int(_splits(r, n).sum()), torch.float64).requires_grad_()
    out, _ = hvd.alltoall(x, _splits(r, n), name="grad")
    weights = torch.arange(1.0, out.shape[0] + 1, dtype=torch.float64).view(-1, 1)
    (out * weights).sum().backward()
    res["grad"] = x.grad
    res["errors"] = {}
    for what, args in {
        "indivisible": (torch.ones(n + 1, 2),),
        "bad_sum": (torch.ones(4, 2), torch.tensor([5] + [0] * (n - 1))),
        "bad_len": (torch.ones(4, 2), torch.tensor([4] + [0] * n)),
        "scalar": (torch.tensor(1.0),),
    }.items():
        try:
            hvd.alltoall(*args, name=f"bad.{what}")
            res["errors"][what] = None
        except ValueError as e:
            res["errors"][what] = str(e)
    if n > 1:  # ranks disagree on the row shape
        try:
            hvd.alltoall(torch.ones(n, 2 + r), name="bad.rowshape")
            res["errors"]["rowshape"] = None
        except ValueError as e:
            res["errors"]["rowshape"] = str(e)
    res["after"] = hvd.alltoall(torch.ones(n, 1), name="after")
    return res


def _launch(nranks):
    """One launch per rank count, shared by every test below."""
    return launch_once(_rank_main, nranks, timeout=120)


def _expected(me, size, dtype, splits_of):
    """What rank `me` receives: from each rank s, the rows s sends to `me`, in rank order."""
    parts = []
    for s in range(size):
        splits = splits_of(s)
        x = _rows(s, int(sum(splits)), dtype)
        start = sum(splits[:me])
        parts.append(x[start:start + splits[me]])
    return torch.cat(parts), [splits_of(s)[me] for s in range(size)]


@pytest.mark.parametrize("nranks", [1, 2, 3])
def test_alltoall_values_every_dtype(nranks):
    results = _launch(nranks)
    for me, res in enumerate(results):
        for dtype in DTYPES:
            even, _ = _expected(me, nranks, dtype, lambda s: [2] * nranks)
            assert torch.equal(res["even"][str(dtype)], even), (me, dtype)
            want, counts = _expected(me, nranks, dtype, lambda s: _splits(s, nranks).tolist())
            got, received = res["uneven"][str(dtype)]
            assert got.dtype == dtype and torch.equal(got, want), (me, dtype, got, want)
            assert received.dtype == torch.int32 and received.tolist() == counts, (me, received)
        out, received = res["async"]
        assert torch.equal(out, _expected(me, nranks, torch.float32, lambda s: [1] * nranks)[0])
        assert received.tolist() == [1] * nranks
        assert torch.equal(res["after"], torch.ones(nranks, 1))


@pytest.mark.parametrize("nranks", [1, 2, 3])
def test_alltoall_gradient_goes_back_the_way_the_data_came(nranks):
    results = _launch(nranks)
    # Rank me's output row j has weight j + 1; each input row's gradient is the
    # weight of the output row it landed in.
    for me, res in enumerate(results):
        splits = _splits(me, nranks).tolist()
        grad = []
        for d in range(nranks):
            # Rows from `me` sit in d's output after the rows of ranks < me.
            offset = sum(_splits(s, nranks).tolist()[d] for s in range(me))
            grad += [offset + k + 1 for k in range(splits[d])]
        want = torch.tensor(grad, dtype=torch.float64).view(-1, 1).repeat(1, 3)
        assert torch.equal(res["grad"], want), (me, res["grad"], want)


@pytest.mark.parametrize("nranks", [2, 3])
def test_alltoall_errors_are_clear_and_leave_the_job_usable(nranks):
    for res in _launch(nranks):
        e = res["errors"]
        assert "divisible by the number of ranks" in e["indivisible"], e["indivisible"]
        assert "splits sum to 5" in e["bad_sum"] and "first dimension is 4" in e["bad_sum"]
        assert f"one entry per rank ({nranks})" in e["bad_len"], e["bad_len"]
        assert "at least one dimension" in e["scalar"], e["scalar"]
        assert "mismatched shapes" in e["rowshape"] and "rank 1 [" in e["rowshape"], e["rowshape"]
