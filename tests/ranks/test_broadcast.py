"""broadcast on 1, 2 and 3 real rank processes, from every root rank.

One run_ranks launch per rank count, shared by the tests (_launch): each rank
broadcasts every dtype from every root, in the functional, in-place and both
async forms, and returns the outputs; the tests check them against the root's
input, recomputed here.
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
FORMS = ["broadcast", "broadcast_", "broadcast_async", "broadcast_async_"]
SHAPES = [(), (3, 4), (5000,)]  # (5000,) is > 16 KiB for 4- and 8-byte dtypes
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


def _cases(nranks):
    cases = []
    for root in range(nranks):
        for dtype in DTYPES:
            for shape in SHAPES:
                for form in FORMS:
                    cases.append((len(cases), root, dtype, shape, form))
    return cases


def _wait(hvd, handle):
    deadline = time.monotonic() + 20
    while not hvd.poll(handle):
        assert time.monotonic() < deadline, "poll() never became True"
        time.sleep(0.001)
    return hvd.synchronize(handle)


# ---------------------------------------------------------------- rank side


def _broadcast(hvd):
    rank, size = hvd.rank(), hvd.size()
    res = {}
    for case, root, dtype, shape, form in _cases(size):
        x = _input(rank, dtype, shape, case)
        before = x.clone()
        name = f"bcast.{case}"
        if form == "broadcast":
            y = hvd.broadcast(x, root, name=name)
            assert torch.equal(x, before), "broadcast changed its input"
        elif form == "broadcast_":
            y = hvd.broadcast_(x, root, name=name)
            assert y is x, "broadcast_ must return its argument"
        elif form == "broadcast_async":
            y = _wait(hvd, hvd.broadcast_async(x, root, name=name))
            assert torch.equal(x, before), "broadcast_async changed its input"
        else:
            y = _wait(hvd, hvd.broadcast_async_(x, root, name=name))
            assert y.data_ptr() == x.data_ptr(), "broadcast_async_ must return its argument"
            y = x
        res[case] = y

    # In place on a non-contiguous view: the base tensor sees the root's values.
    base = _input(rank, torch.float32, (6, 4), 1000)
    hvd.broadcast_(base.t(), size - 1, name="transposed")
    res["transposed"] = base
    res["transposed.functional"] = hvd.broadcast(
        _input(rank, torch.int64, (6, 4), 1001).t(), 0, name="transposed.functional"
    )
    # Many async broadcasts in flight, submitted in a different order on odd ranks.
    names = [f"flight.{i}" for i in range(8)]
    order = names if rank % 2 == 0 else list(reversed(names))
    handles = {
        n: hvd.broadcast_async(
            _input(rank, torch.float64, (7,), 1100 + int(n[7:])), int(n[7:]) % size, name=n
        )
        for n in order
    }
    for n in names:
        res[n] = hvd.synchronize(handles[n])
    # torch.ops defaults: root 0.
    res["torch.ops"] = torch.ops.hvd_torch.broadcast(torch.full((2,), rank))

    # A root rank outside [0, size) is refused on the caller's thread.
    refused = {}
    for bad in (size, -1):
        for form in FORMS:
            try:
                getattr(hvd, form)(torch.ones(2), bad, name="bad.root")
                refused[(form, bad)] = None
            except ValueError as e:
                refused[(form, bad)] = str(e)
    res["refused"] = refused
    res["after"] = hvd.broadcast(torch.tensor([rank]), 0, name="after")
    return res


def _grad(hvd):
    rank, size = hvd.rank(), hvd.size()
    out = {}
    for root in range(size):
        for dtype in (torch.float32, torch.float64):
            x = _input(rank, dtype, (3, 2), 10 * root).requires_grad_()
            y = hvd.broadcast(x, root, name=f"grad.{root}.{dtype}")
            assert y.requires_grad
            y.backward(_input(rank, dtype, (3, 2), 10 * root + 1))
            out[(root, dtype)] = (y.detach(), x.grad)
    return out


def _rank_main():
    """Everything this file checks, in one process per rank."""
    import hvd_torch as hvd

    hvd.init()
    out = {"main": _broadcast(hvd), "grad": _grad(hvd)}
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
def test_broadcast(nranks):
    results = [out["main"] for out in _launch(nranks)]
    for rank, res in enumerate(results):
        what = f"rank {rank} of {nranks}"
        for case, root, dtype, shape, form in _cases(nranks):
            _check(
                res[case],
                _input(root, dtype, shape, case),
                f"{what}: {form} of {dtype}{list(shape)} from root {root}",
            )
        _check(
            res["transposed"],
            _input(nranks - 1, torch.float32, (6, 4), 1000),
            f"{what}: broadcast_ on a transposed view",
        )
        _check(
            res["transposed.functional"],
            _input(0, torch.int64, (6, 4), 1001).t(),
            f"{what}: broadcast of a transposed view",
        )
        for i in range(8):
            _check(
                res[f"flight.{i}"],
                _input(i % nranks, torch.float64, (7,), 1100 + i),
                f"{what}: in flight {i}",
            )
        _check(res["torch.ops"], torch.zeros(2, dtype=torch.int64), f"{what}: torch.ops defaults")
        for (form, bad), message in res["refused"].items():
            assert message is not None, f"{what}: {form} with root_rank {bad} was accepted"
            assert f"root_rank {bad}" in message and f"{nranks} ranks" in message, message
            assert "'bad.root'" in message, message
        _check(res["after"], torch.tensor([0]), f"{what}: broadcast after the refused ones")


@pytest.mark.parametrize("nranks", NRANKS)
def test_gradient_is_averaged_on_the_root_and_zero_elsewhere(nranks):
    # Horovod's rule: Average-allreduce of the incoming gradient on the root, zero elsewhere.
    results = [out["grad"] for out in _launch(nranks)]
    for rank, out in enumerate(results):
        for root in range(nranks):
            for dtype in (torch.float32, torch.float64):
                what = f"rank {rank} of {nranks}, root {root}, {dtype}"
                y, grad = out[(root, dtype)]
                _check(y, _input(root, dtype, (3, 2), 10 * root), f"{what}: forward")
                if rank == root:
                    summed = sum(
                        _input(r, dtype, (3, 2), 10 * root + 1).double() for r in range(nranks)
                    )
                    torch.testing.assert_close(
                        grad, (summed / nranks).to(dtype), msg=lambda m, what=what: f"{what}: {m}"
                    )
                else:
                    _check(grad, torch.zeros(3, 2, dtype=dtype), f"{what}: non-root gradient")
