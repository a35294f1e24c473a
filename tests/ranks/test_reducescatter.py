"""reducescatter on 1, 2 and 3 ranks: dtypes, Sum/Average, uneven first dims, scaling, gradients."""

import sys
from pathlib import Path

import pytest
import torch

from dist_harness import launch_once  # noqa: E402

DTYPES = [torch.uint8, torch.int8, torch.int16, torch.int32, torch.int64, torch.float16,
          torch.bfloat16, torch.float32, torch.float64]
SUM, AVERAGE = 1, 0
ROWS = [1, 5, 7, 12]  # divisible and not by 2 and 3; fewer rows than ranks too


def _input(rank, rows, cols, dtype):
    return ((torch.arange(rows * cols).view(rows, cols) + 3 * rank) % 50).to(dtype)


def _rank_main():
    import hvd_torch as hvd

    torch.set_num_threads(1)
    hvd.init()
    r = hvd.rank()
    res = {}
    for dtype in DTYPES:
        for rows in ROWS:
            for op in (SUM, AVERAGE):
                for cols in (3, 5000):  # inline and Gloo paths
                    x = _input(r, rows, cols, dtype)
                    key = (str(dtype), rows, op, cols)
                    res[key] = hvd.reducescatter(x, name=f"rs.{key}", op=op)
    x = _input(r, 7, 2, torch.float64)
    res["scaled"] = hvd.reducescatter(x, op=SUM, prescale_factor=0.5, postscale_factor=3.0)
    h = hvd.reducescatter_async(_input(r, 6, 2, torch.float32), op=SUM, name="async")
    res["async"] = hvd.synchronize(h)
    xg = _input(r, 7, 2, torch.float64).requires_grad_()
    y = hvd.reducescatter(xg, op=AVERAGE, prescale_factor=2.0, name="grad")
    (y * (torch.arange(y.numel(), dtype=torch.float64).view_as(y) + 1)).sum().backward()
    res["grad"] = xg.grad
    try:
        hvd.reducescatter(torch.ones(3), op=hvd.Max)
        res["max"] = None
    except ValueError as e:
        res["max"] = str(e)
    return res


def _rank_main_over_gloo():
    import hvd_torch as hvd
    from hvd_torch import _C

    res = _rank_main()
    res["backend"] = _C.backend_name(0)
    # Blocks of several 1 MiB segments (the ring pipelines them), uneven across ranks.
    res["large"] = hvd.reducescatter(_input(hvd.rank(), 5, 700_000, torch.float32), op=SUM,
                                     name="large")
    # The bytes a reduce-scatter moves, not an allreduce's twice as many: every rank sends
    # (n - 1) / n of the tensor, all of it through loopback.
    x = torch.ones(WIRE_BYTES // 4)
    hvd.barrier()
    before = _loopback_bytes_sent()
    hvd.reducescatter(x, op=SUM, name="wire")
    hvd.barrier()
    res["wire"] = _loopback_bytes_sent() - before
    return res


WIRE_BYTES = 32 << 20


def _loopback_bytes_sent():
    with open("/proc/net/dev") as f:
        for line in f:
            name, _, fields = line.partition(":")
            if name.strip() == "lo":
                return int(fields.split()[8])  # transmitted bytes
    raise AssertionError("no loopback interface in /proc/net/dev")


def _launch(nranks, over_gloo=False):
    """One launch per rank count (and data plane), shared by every test below."""
    if over_gloo:  # Gloo's ring reduce-scatter for every size: no shared memory, nothing inline
        env = {"HVD_TORCH_SHM": "0", "HVD_TORCH_INLINE_THRESHOLD": "0"}
        return launch_once(_rank_main_over_gloo, nranks, timeout=180, env=env)
    return launch_once(_rank_main, nranks, timeout=180)


def _slice(rows, size, rank):
    base, extra = divmod(rows, size)
    start = rank * base + min(rank, extra)
    return start, base + (1 if rank < extra else 0)


def _reference(size, rank, rows, cols, dtype, op, pre=1.0, post=1.0):
    if dtype.is_floating_point:
        total = sum(_input(s, rows, cols, torch.float64) * pre for s in range(size))
        total = (total / size if op == AVERAGE else total) * post
    else:  # the sum wraps in the dtype, then Average truncates sum * (1.0 / size) (Horovod)
        total = sum(_input(s, rows, cols, torch.int64) for s in range(size)).to(dtype)
        if op == AVERAGE:
            total = (total.double() * (1.0 / size)).trunc().to(dtype)
        total = total.to(torch.float64)
    start, n = _slice(rows, size, rank)
    return total[start:start + n]


@pytest.mark.parametrize("nranks", [1, 2, 3])
def test_reducescatter_values(nranks):
    _check_values(_launch(nranks), nranks)


@pytest.mark.serial  # counts every byte on loopback: no other test may send meanwhile
@pytest.mark.parametrize("nranks", [2, 3])
def test_reducescatter_values_over_gloo(nranks):
    results = _launch(nranks, over_gloo=True)
    assert all(res["backend"] == "gloo" for res in results), [res["backend"] for res in results]
    _check_values(results, nranks)
    for rank, res in enumerate(results):
        want = _reference(nranks, rank, 5, 700_000, torch.float32, SUM)
        assert torch.equal(res["large"].double(), want), rank
    # Every rank sends (n - 1) / n of it: (n - 1) x the tensor in all, where an allreduce
    # sends twice that. The margin covers the barriers and TCP headers.
    sent = results[0]["wire"]
    assert (nranks - 1) * WIRE_BYTES <= sent < 1.25 * (nranks - 1) * WIRE_BYTES, sent


def _check_values(results, nranks):
    for rank, res in enumerate(results):
        for dtype in DTYPES:
            for rows in ROWS:
                for op in (SUM, AVERAGE):
                    for cols in (3, 5000):
                        got = res[(str(dtype), rows, op, cols)]
                        want = _reference(nranks, rank, rows, cols, dtype, op)
                        assert got.dtype == dtype and got.shape == want.shape, (rank, dtype, rows)
                        # Average multiplies by 1/size like Horovod: within one
                        # rounding of the dtype, not bit-equal to a division.
                        rtol = {torch.float16: 1e-3, torch.bfloat16: 8e-3}.get(dtype, 1e-6)
                        rtol = rtol if dtype.is_floating_point else 0
                        assert torch.allclose(got.to(torch.float64), want, rtol=rtol, atol=0), (
                            rank, dtype, rows, op)
        want = _reference(nranks, rank, 7, 2, torch.float64, SUM, pre=0.5, post=3.0)
        assert torch.allclose(res["scaled"], want), (rank, res["scaled"], want)
        assert torch.equal(res["async"], _reference(nranks, rank, 6, 2, torch.float32, SUM).float())


@pytest.mark.parametrize("nranks", [1, 2, 3])
def test_reducescatter_gradient_is_the_scaled_allgather_of_the_gradient(nranks):
    # Horovod's rule: the allgather of the upstream gradient times pre * post
    # (and times the set's size for Sum; Average has no size factor). Here
    # Average with prescale 2: 2 times the concatenation of the upstream grads.
    upstream = []
    for rank in range(nranks):
        _, n = _slice(7, nranks, rank)
        upstream.append(torch.arange(n * 2, dtype=torch.float64).view(n, 2) + 1)
    want = torch.cat(upstream) * 2.0
    for res in _launch(nranks):
        assert torch.allclose(res["grad"], want), (res["grad"], want)


def test_reducescatter_refuses_min_max_product():
    for res in _launch(2):
        assert "unsupported reduce op 4" in res["max"], res["max"]
