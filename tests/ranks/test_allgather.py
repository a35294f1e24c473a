"""allgather on 1, 2 and 3 real rank processes, checked against torch.cat.

Rank r contributes r + 1 rows (first dimensions differ across ranks), so the
output's row offsets are not a multiple of any one rank's count.  One
run_ranks launch per rank count is shared by the tests (_launch); the expected
values are computed in the test process from the same deterministic inputs.
"""

import time

import pytest
import torch

from dist_harness import launch_once

DTYPES = [
    torch.float16,
    torch.bfloat16,
    torch.float32,
    torch.float64,
    torch.uint8,
    torch.int8,
    torch.int16,
    torch.int32,
    torch.int64,
    torch.bool,
]
TIMEOUT = 120
NRANKS = [1, 2, 3]


def _input(rank, dtype, shape, seed):
    g = torch.Generator().manual_seed(seed * 7919 + rank)
    if dtype == torch.bool:
        return torch.randint(0, 2, shape, generator=g).bool()
    if dtype.is_floating_point:
        return torch.randn(shape, generator=g, dtype=torch.float64).to(dtype)
    lo = 0 if dtype == torch.uint8 else -100
    return torch.randint(lo, 100, shape, generator=g).to(dtype)


def _cases():
    """(case id, dtype, row shape, rows of rank r as a function name)."""
    cases = []
    for dtype in DTYPES:
        for row_shape in [(), (3,), (2, 5), (2000,)]:  # the last makes > 16 KiB
            cases.append((len(cases), dtype, row_shape))
    return cases


def _rows(rank):
    return rank + 1


def _gathered(inputs):
    return torch.cat(inputs, dim=0)


# ---------------------------------------------------------------- rank side


def _gather(hvd):
    rank = hvd.rank()
    res = {}
    for case, dtype, row_shape in _cases():
        x = _input(rank, dtype, (_rows(rank),) + row_shape, case)
        res[case] = hvd.allgather(x, name=f"gather.{case}")

    # Rank 0 contributes no rows; the others r + 1.
    x = _input(rank, torch.float32, (0 if rank == 0 else _rows(rank), 4), 100)
    res["empty.rank0"] = hvd.allgather(x, name="empty.rank0")
    # Every rank contributes no rows.
    res["empty.all"] = hvd.allgather(torch.zeros(0, 3, dtype=torch.int32), name="empty.all")
    # A 0-d tensor gathers as one row per rank.
    res["scalar"] = hvd.allgather(
        torch.tensor(float(rank) + 0.5, dtype=torch.float64), name="scalar"
    )
    # A non-contiguous input: a transposed view.
    base = _input(rank, torch.float32, (4, _rows(rank)), 101)
    res["transposed"] = hvd.allgather(base.t(), name="transposed")
    # Async: several in flight at once, in a different order on odd ranks.
    names = [f"async.{i}" for i in range(6)]
    order = names if rank % 2 == 0 else list(reversed(names))
    handles = {}
    for name in order:
        i = int(name.split(".")[1])
        x = _input(rank, DTYPES[i], (_rows(rank), 3 + i), 200 + i)
        handles[name] = hvd.allgather_async(x, name=name)
    for name in names:
        h = handles[name]
        deadline = time.monotonic() + 20
        while not hvd.poll(h):
            assert time.monotonic() < deadline, "poll() never became True"
            time.sleep(0.001)
        res[name] = hvd.synchronize(h)
    # Unnamed ops match by submission order.
    res["unnamed"] = hvd.allgather(torch.full((_rows(rank), 2), rank, dtype=torch.int16))
    res["torch.ops"] = torch.ops.hvd_torch.allgather(torch.tensor([rank]))
    return res


def _grad(hvd):
    rank, size = hvd.rank(), hvd.size()
    total = sum(_rows(r) for r in range(size))
    out = {}
    for dtype in (torch.float32, torch.float64):
        x = _input(rank, dtype, (_rows(rank), 3), 300).requires_grad_()
        y = hvd.allgather(x, name=f"grad.{dtype}")
        assert y.requires_grad and y.shape == (total, 3)
        y.backward(_input(rank, dtype, (total, 3), 301))
        out[dtype] = x.grad
    # 0-d input: its gradient is 0-d too.
    s = torch.tensor(2.0 + rank, dtype=torch.float64, requires_grad=True)
    (
        hvd.allgather(s, name="grad.scalar") * torch.arange(1.0, size + 1, dtype=torch.float64)
    ).sum().backward()
    out["scalar"] = s.grad
    # Rank 0 contributes no rows: an empty gradient there, offsets shifted elsewhere.
    x = _input(rank, torch.float64, (0 if rank == 0 else _rows(rank), 2), 302).requires_grad_()
    y = hvd.allgather(x, name="grad.empty.rank0")
    y.backward(_input(rank, torch.float64, tuple(y.shape), 303))
    out["empty.rank0"] = x.grad
    return out


def _rank_main():
    """Everything this file checks, in one process per rank."""
    import hvd_torch as hvd

    hvd.init()
    out = {"main": _gather(hvd), "grad": _grad(hvd)}
    hvd.shutdown()
    return out


def _launch(nranks):
    """One launch per rank count, shared by every test below."""
    return launch_once(_rank_main, nranks, timeout=TIMEOUT)


# ---------------------------------------------------------------- tests


def _check(out, expected, what):
    assert out.dtype == expected.dtype, f"{what}: dtype {out.dtype} != {expected.dtype}"
    assert out.shape == expected.shape, (
        f"{what}: shape {tuple(out.shape)} != {tuple(expected.shape)}"
    )
    assert torch.equal(out, expected), f"{what}: got {out}, expected {expected}"


@pytest.mark.parametrize("nranks", NRANKS)
def test_allgather(nranks):
    results = [out["main"] for out in _launch(nranks)]
    ranks = range(nranks)
    for rank, res in enumerate(results):
        what = f"rank {rank} of {nranks}"
        for case, dtype, row_shape in _cases():
            expected = _gathered([_input(r, dtype, (_rows(r),) + row_shape, case) for r in ranks])
            _check(res[case], expected, f"{what}, {dtype} rows {row_shape}")
        expected = _gathered(
            [_input(r, torch.float32, (0 if r == 0 else _rows(r), 4), 100) for r in ranks]
        )
        _check(res["empty.rank0"], expected, f"{what}, rank 0 sends no rows")
        _check(res["empty.all"], torch.zeros(0, 3, dtype=torch.int32), f"{what}, no rows at all")
        expected = torch.tensor([r + 0.5 for r in ranks], dtype=torch.float64)
        _check(res["scalar"], expected, f"{what}, 0-d input")
        expected = _gathered([_input(r, torch.float32, (4, _rows(r)), 101).t() for r in ranks])
        _check(res["transposed"], expected, f"{what}, transposed input")
        for i in range(6):
            expected = _gathered([_input(r, DTYPES[i], (_rows(r), 3 + i), 200 + i) for r in ranks])
            _check(res[f"async.{i}"], expected, f"{what}, async {i}")
        expected = _gathered([torch.full((_rows(r), 2), r, dtype=torch.int16) for r in ranks])
        _check(res["unnamed"], expected, f"{what}, unnamed")
        _check(res["torch.ops"], torch.arange(nranks), f"{what}, torch.ops.hvd_torch.allgather")


@pytest.mark.parametrize("nranks", NRANKS)
def test_gradient_is_the_averaged_gradient_narrowed_to_own_rows(nranks):
    # Horovod's rule: Average-allreduce of the incoming gradient, then this rank's rows.
    results = [out["grad"] for out in _launch(nranks)]
    ranks = range(nranks)
    total = sum(_rows(r) for r in ranks)
    for rank, out in enumerate(results):
        what = f"rank {rank} of {nranks}"
        offset = sum(_rows(r) for r in range(rank))
        for dtype in (torch.float32, torch.float64):
            summed = sum(_input(r, dtype, (total, 3), 301).double() for r in ranks)
            expected = (summed / nranks)[offset : offset + _rows(rank)].to(dtype)
            torch.testing.assert_close(
                out[dtype], expected, msg=lambda m, what=what, dtype=dtype: f"{what} {dtype}: {m}"
            )
        # d/ds sum_k (k + 1) * s_k, averaged over ranks: rank + 1.
        expected = torch.tensor(float(rank + 1), dtype=torch.float64)
        assert out["scalar"].shape == () and torch.equal(out["scalar"], expected), (
            f"{what}: 0-d gradient {out['scalar']} != {expected}"
        )
        rows = [0 if r == 0 else _rows(r) for r in ranks]
        summed = sum(_input(r, torch.float64, (sum(rows), 2), 303) for r in ranks)
        start = sum(rows[:rank])
        torch.testing.assert_close(
            out["empty.rank0"],
            (summed / nranks)[start : start + rows[rank]],
            msg=lambda m, what=what: f"{what} rank 0 sends no rows: {m}",
        )
