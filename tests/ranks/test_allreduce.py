"""allreduce on 1, 2 and 3 real rank processes, checked against plain PyTorch.

There is one run_ranks launch per rank count, shared by the tests (_launch):
each rank runs every case and returns the raw outputs; each test recomputes
every rank's input (deterministic in rank and case) and the expected result
here, in the test process.  Inputs are small integers so that sums and products are exact in
every dtype, float16 and bfloat16 included; only Average on 3 ranks rounds.
"""

import math
import time
import warnings

import pytest
import torch

from dist_harness import launch_once

AVERAGE, SUM, MIN, MAX, PRODUCT = 0, 1, 3, 4, 5
OPS = {"Average": AVERAGE, "Sum": SUM, "Min": MIN, "Max": MAX, "Product": PRODUCT}
FLOATS = [torch.float16, torch.bfloat16, torch.float32, torch.float64]
INTS = [torch.uint8, torch.int8, torch.int16, torch.int32, torch.int64]
DTYPES = FLOATS + INTS + [torch.bool]
SMALL = 37  # bytes <= 16 KiB for every dtype: reduced inline by the coordinator
LARGE = 20_000  # bytes > 16 KiB for every dtype (uint8 included): the Gloo path
TIMEOUT = 120
NRANKS = [1, 2, 3]


def _input(rank, dtype, n, seed):
    """Rank `rank`'s tensor for case `seed`: small integers, exact in every dtype."""
    g = torch.Generator().manual_seed(seed * 7919 + rank)
    if dtype == torch.bool:
        return torch.randint(0, 2, (n,), generator=g).bool()
    if dtype == torch.uint8:
        lo, hi = 0, 3
    elif dtype.is_floating_point:
        lo, hi = -3, 4
    else:
        lo, hi = -2, 3  # int8 Product with prescale 2 on 3 ranks stays within range
    return torch.randint(lo, hi, (n,), generator=g).to(dtype)


def _horovod_scale(x, factor):
    """Horovod's CPU ScaleBuffer in plain PyTorch: float64 in double, float32 by
    float32(factor) in float32, float16/bfloat16 widened to float32 and rounded
    once, integers in double truncated toward zero."""
    if factor == 1.0:
        return x
    if x.dtype == torch.float64:
        return x * factor
    if x.dtype.is_floating_point:
        return (x.float() * torch.tensor(factor, dtype=torch.float32)).to(x.dtype)
    return (x.double() * factor).trunc().to(x.dtype)


def _reference(inputs, op, pre=1.0, post=1.0):
    """Horovod's allreduce in plain PyTorch: prescale each input, reduce, then
    scale by postscale (Average: postscale / size, one multiplication, so an
    integer Average truncates sum * (1.0 / size) toward zero)."""
    dtype = inputs[0].dtype
    size = len(inputs)
    if dtype == torch.bool:
        stack = torch.stack(inputs)
        return stack.any(0) if op in (SUM, MAX) else stack.all(0)
    wide = torch.float64 if dtype.is_floating_point else torch.int64
    stack = torch.stack([_horovod_scale(x, pre).to(wide) for x in inputs])
    if op in (SUM, AVERAGE):
        out = stack.sum(0)
    elif op == MIN:
        out = stack.min(0).values
    elif op == MAX:
        out = stack.max(0).values
    else:
        out = stack.prod(0)
    return _horovod_scale(out.to(dtype), post / size if op == AVERAGE else post)


def _assert_matches(out, expected, what):
    assert out.dtype == expected.dtype, what
    assert out.shape == expected.shape, what
    if expected.dtype.is_floating_point:
        torch.testing.assert_close(out, expected, msg=lambda m: f"{what}: {m}")
    else:
        assert torch.equal(out, expected), f"{what}: got {out}, expected {expected}"


def _grid_cases():
    """(case id, dtype, op, prescale, postscale, numel) for every combination."""
    cases = []
    for dtype in DTYPES:
        if dtype == torch.bool:
            ops, scales = [SUM, MIN, MAX, PRODUCT], [(1.0, 1.0)]
        elif dtype.is_floating_point:
            ops, scales = list(OPS.values()), [(1.0, 1.0), (0.5, 4.0), (2.0, 3.0)]
        else:
            ops, scales = list(OPS.values()), [(1.0, 1.0), (2.0, 1.0), (1.0, 3.0)]
        for op in ops:
            for pre, post in scales:
                for n in (SMALL, LARGE):
                    cases.append((len(cases), dtype, op, pre, post, n))
    return cases


# ---------------------------------------------------------------- rank side


def _grid(hvd):
    out = []
    for case, dtype, op, pre, post, n in _grid_cases():
        x = _input(hvd.rank(), dtype, n, case)
        before = x.clone()
        y = hvd.allreduce(x, name=f"grid.{case}", op=op, prescale_factor=pre, postscale_factor=post)
        assert torch.equal(x, before), f"case {case}: allreduce changed its input"
        out.append(y)
    return out


def _misc(hvd):
    rank = hvd.rank()
    res = {}

    # allreduce_: the result lands in the argument, which is returned.
    x = _input(rank, torch.float32, 50, 1)
    ptr = x.data_ptr()
    y = hvd.allreduce_(x, name="inplace", op=hvd.Sum)
    res["inplace"] = (x.clone(), y is x, x.data_ptr() == ptr)

    # In place on a large tensor (Gloo path), default op (Average).
    x = _input(rank, torch.float64, LARGE, 2)
    hvd.allreduce_(x, name="inplace.large")
    res["inplace.large"] = x

    # Non-contiguous inputs: a transposed view.
    base = _input(rank, torch.int32, 6 * 5, 3).reshape(6, 5)
    t = base.t()
    y = hvd.allreduce(t, name="transposed", op=hvd.Sum)
    res["transposed"] = (t.clone(), y)
    base = _input(rank, torch.float32, 6 * 5, 4).reshape(6, 5)
    t = base.t()
    y = hvd.allreduce_(t, name="transposed.inplace", op=hvd.Max)
    res["transposed.inplace"] = (base.clone(), y is t)
    base = _input(rank, torch.float32, 200 * 30, 5).reshape(200, 30)
    t = base.t()
    h = hvd.allreduce_async_(t, name="transposed.async_", op=hvd.Sum)
    hvd.synchronize(h)
    res["transposed.async_"] = base.clone()

    # allreduce_async + poll + synchronize.
    x = _input(rank, torch.float32, 1000, 6)
    before = x.clone()
    h = hvd.allreduce_async(x, name="async", op=hvd.Sum)
    deadline = time.monotonic() + 20
    while not hvd.poll(h):
        assert time.monotonic() < deadline, "poll() never became True"
        time.sleep(0.001)
    assert hvd.poll(h)  # stays True until synchronized
    y = hvd.synchronize(h)
    res["async"] = (y, torch.equal(x, before))

    # allreduce_async_: in place, synchronize returns the argument.
    x = _input(rank, torch.int64, 5000, 7)
    h = hvd.allreduce_async_(x, name="async_", op=hvd.Min)
    y = hvd.synchronize(h)
    res["async_"] = (x.clone(), y.data_ptr() == x.data_ptr())

    # Many ops in flight, submitted in a different order on odd ranks.
    specs = _in_flight_specs()
    order = list(specs) if rank % 2 == 0 else list(reversed(specs))
    handles = {}
    for name in order:
        case, dtype, op, n = specs[name]
        handles[name] = hvd.allreduce_async(_input(rank, dtype, n, case), name=name, op=op)
    res["in_flight"] = {name: hvd.synchronize(handles[name]) for name in specs}

    # The inline threshold's edge (16 KiB here): 4096 float32 fit on 2 ranks, 4097 do not.
    for n in (4096, 4097):
        res[f"edge.{n}"] = hvd.allreduce(
            _input(rank, torch.float32, n, 8), name=f"edge.{n}", op=hvd.Sum
        )
    res["huge"] = hvd.allreduce(_input(rank, torch.float32, 100_000, 9), name="huge", op=hvd.Sum)

    # Integer Average truncates sum * (1.0 / size) toward zero, as in Horovod.
    x = torch.tensor([-7, -5, -1, 0, 1, 5, 7], dtype=torch.int64) + rank
    res["int.average"] = hvd.allreduce(x, name="int.average", op=hvd.Average)

    # The deprecated `average` flag.
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        x = _input(rank, torch.float64, 10, 10)
        res["average.true"] = hvd.allreduce(x, average=True, name="average.true")
        res["average.false"] = hvd.allreduce(x, average=False, name="average.false")
    res["average.warnings"] = [w.category.__name__ for w in caught]
    try:
        hvd.allreduce(x, average=True, op=hvd.Sum, name="average.both")
        res["average.both"] = None
    except ValueError as e:
        res["average.both"] = str(e)

    # bool has no Average and no scaling: refused before any communication.
    refused = []
    for kwargs in ({"op": hvd.Average}, {"op": hvd.Sum, "prescale_factor": 2.0}):
        try:
            hvd.allreduce(torch.ones(3, dtype=torch.bool), name="bool.bad", **kwargs)
            refused.append(None)
        except ValueError as e:
            refused.append(str(e))
    res["bool.refused"] = refused

    # The default op and no name: averages; unnamed ops match by order.
    x = _input(rank, torch.float32, 12, 11)
    res["defaults"] = torch.ops.hvd_torch.allreduce(x)
    res["unnamed"] = [
        hvd.allreduce(_input(rank, torch.float32, 5, 12 + i), op=hvd.Sum) for i in range(3)
    ]

    # A 0-d tensor, an empty tensor, and one name reused (served from the cache).
    res["scalar"] = hvd.allreduce(torch.tensor(float(rank + 1)), name="scalar", op=hvd.Product)
    res["empty"] = hvd.allreduce(torch.zeros(0, 3), name="empty", op=hvd.Sum)
    res["repeat"] = [
        hvd.allreduce(_input(rank, torch.float32, n, 20 + i), name="repeat", op=hvd.Sum)
        for i, n in enumerate([9, 9, 9, LARGE, LARGE, 9])
    ]
    # A handle is gone once synchronized.
    h = hvd.allreduce_async(torch.ones(1), name="handle")
    hvd.synchronize(h)
    gone = []
    for fn in (hvd.poll, hvd.synchronize):
        try:
            fn(h)
            gone.append(None)
        except ValueError as e:
            gone.append(str(e))
    res["handle.gone"] = gone

    # Still in step after everything above.
    res["after"] = hvd.allreduce(torch.full((3,), float(rank)), name="after", op=hvd.Sum)
    return res


def _in_flight_specs():
    """name -> (case, dtype, op, numel): mixed dtypes, ops and both paths."""
    specs = {}
    dtypes = [torch.float32, torch.int32, torch.float16, torch.int64, torch.bfloat16, torch.float64]
    for i in range(24):
        dtype = dtypes[i % len(dtypes)]
        op = [SUM, AVERAGE, MAX, MIN][i % 4]
        n = LARGE if i % 3 == 0 else 17 + i
        specs[f"flight.{i}"] = (100 + i, dtype, op, n)
    return specs


def _grad_cases():
    return [
        (dtype, op, pre, post)
        for dtype in (torch.float32, torch.float64)
        for op in OPS.values()
        for pre, post in ((1.0, 1.0), (0.5, 4.0))
    ]


def _grad(hvd):
    rank = hvd.rank()
    out = []
    for i, (dtype, op, pre, post) in enumerate(_grad_cases()):
        x = _input(rank, dtype, 16, 200 + i).requires_grad_()
        y = hvd.allreduce(x, name=f"grad.{i}", op=op, prescale_factor=pre, postscale_factor=post)
        assert y.requires_grad
        y.backward(_input(rank, dtype, 16, 300 + i))
        out.append((y.detach(), x.grad))
    # Through a larger graph: loss = sum(allreduce(w * 2)) so dloss/dw = 2 * allreduce(1).
    w = torch.ones(4, dtype=torch.float64, requires_grad=True)
    hvd.allreduce(w * 2, name="grad.chain", op=hvd.Sum).sum().backward()
    out.append(w.grad)
    return out


OPCHECK_UTILS = (
    "test_schema",
    "test_autograd_registration",
    "test_faketensor",
    "test_aot_dispatch_dynamic",
)


def _opcheck(hvd):
    """torch.library.opcheck on each op and each of its checks separately, so a
    failure names the check.  Every rank runs the same sequence of unnamed ops."""
    x = torch.arange(6, dtype=torch.float32).reshape(2, 3) + hvd.rank()
    ops = torch.ops.hvd_torch
    failures = {}
    for op, args in [
        (ops.allreduce.default, (x, "", SUM)),
        (ops.allreduce_.default, (x.clone(), "", SUM)),
        (ops.allgather.default, (x,)),
        (ops.broadcast.default, (x, 0)),
        (ops.broadcast_.default, (x.clone(), 0)),
    ]:
        for util in OPCHECK_UTILS:
            try:
                torch.library.opcheck(op, args, test_utils=util)
            except Exception as e:  # noqa: BLE001  (reported by the test, not hidden)
                cause = e.__cause__ or e
                failures[f"{op} {util}"] = (
                    f"{type(cause).__name__}: {str(cause).splitlines()[0][:300]}"
                )
    return failures


def _rank_main():
    """Everything this file checks, in one process per rank."""
    import hvd_torch as hvd

    hvd.init()
    out = {"grid": _grid(hvd), "misc": _misc(hvd), "grad": _grad(hvd)}
    if hvd.size() == 2:  # opcheck is slow to import: once is enough
        out["opcheck"] = _opcheck(hvd)
    hvd.shutdown()
    return out


def _launch(nranks):
    """One launch per rank count, shared by every test below."""
    # A 16 KiB inline budget, so SMALL goes through the coordinator and LARGE
    # through Gloo on every rank count.
    env = {"HVD_TORCH_INLINE_THRESHOLD": "16384"}
    return launch_once(_rank_main, nranks, timeout=TIMEOUT, env=env)


# ---------------------------------------------------------------- tests


@pytest.mark.parametrize("nranks", NRANKS)
def test_every_dtype_op_scale_and_size(nranks):
    results = [out["grid"] for out in _launch(nranks)]
    for case, dtype, op, pre, post, n in _grid_cases():
        inputs = [_input(r, dtype, n, case) for r in range(nranks)]
        expected = _reference(inputs, op, pre, post)
        for rank in range(nranks):
            what = (
                f"rank {rank} of {nranks}, case {case}: {dtype} op={op} "
                f"prescale={pre} postscale={post} numel={n}"
            )
            _assert_matches(results[rank][case], expected, what)


@pytest.mark.parametrize("nranks", NRANKS)
def test_in_place_async_non_contiguous_and_flags(nranks):
    results = [out["misc"] for out in _launch(nranks)]

    def inputs(dtype, n, case):
        return [_input(r, dtype, n, case) for r in range(nranks)]

    for rank, res in enumerate(results):
        what = f"rank {rank} of {nranks}"
        value, same_object, same_storage = res["inplace"]
        _assert_matches(value, _reference(inputs(torch.float32, 50, 1), SUM), f"{what} allreduce_")
        assert same_object and same_storage, f"{what}: allreduce_ must return its argument"
        _assert_matches(
            res["inplace.large"],
            _reference(inputs(torch.float64, LARGE, 2), AVERAGE),
            f"{what} allreduce_ large",
        )

        t, y = res["transposed"]
        assert t.shape == (5, 6)
        expected = _reference([x.reshape(6, 5).t() for x in inputs(torch.int32, 30, 3)], SUM)
        _assert_matches(y, expected, f"{what} transposed")
        base, same_object = res["transposed.inplace"]
        expected = _reference([x.reshape(6, 5) for x in inputs(torch.float32, 30, 4)], MAX)
        _assert_matches(base, expected, f"{what} allreduce_ on a transposed view")
        assert same_object, f"{what}: allreduce_ on a view must return the view"
        expected = _reference([x.reshape(200, 30) for x in inputs(torch.float32, 6000, 5)], SUM)
        _assert_matches(res["transposed.async_"], expected, f"{what} allreduce_async_ on a view")

        y, input_kept = res["async"]
        _assert_matches(y, _reference(inputs(torch.float32, 1000, 6), SUM), f"{what} async")
        assert input_kept, f"{what}: allreduce_async changed its input"
        x, aliased = res["async_"]
        _assert_matches(x, _reference(inputs(torch.int64, 5000, 7), MIN), f"{what} async_")
        assert aliased, f"{what}: synchronize(allreduce_async_) must return the argument"

        for name, (case, dtype, op, n) in _in_flight_specs().items():
            _assert_matches(
                res["in_flight"][name],
                _reference(inputs(dtype, n, case), op),
                f"{what} in flight {name}",
            )

        for n in (4096, 4097):
            _assert_matches(
                res[f"edge.{n}"], _reference(inputs(torch.float32, n, 8), SUM), f"{what} numel {n}"
            )
        _assert_matches(
            res["huge"], _reference(inputs(torch.float32, 100_000, 9), SUM), f"{what} 100k"
        )

        ints = [torch.tensor([-7, -5, -1, 0, 1, 5, 7]) + r for r in range(nranks)]
        expected = (sum(ints).double() * (1.0 / nranks)).trunc().long()
        assert torch.equal(res["int.average"], expected), (
            f"{what}: integer Average {res['int.average']} != trunc({sum(ints)} / {nranks})"
        )

        floats = inputs(torch.float64, 10, 10)
        _assert_matches(res["average.true"], _reference(floats, AVERAGE), f"{what} average=True")
        _assert_matches(res["average.false"], _reference(floats, SUM), f"{what} average=False")
        assert res["average.warnings"] == ["DeprecationWarning"] * 2
        assert res["average.both"] and "average" in res["average.both"]

        for message in res["bool.refused"]:
            assert message is not None, f"{what}: a bool Average/scaled allreduce was accepted"
            assert "bool" in message and "'bool.bad'" in message, message

        _assert_matches(
            res["defaults"],
            _reference(inputs(torch.float32, 12, 11), AVERAGE),
            f"{what} torch.ops default op",
        )
        for i, y in enumerate(res["unnamed"]):
            _assert_matches(
                y, _reference(inputs(torch.float32, 5, 12 + i), SUM), f"{what} unnamed {i}"
            )
        _assert_matches(res["scalar"], torch.tensor(float(math.factorial(nranks))), f"{what} 0-d")
        _assert_matches(res["empty"], torch.zeros(0, 3), f"{what} empty")
        for i, n in enumerate([9, 9, 9, LARGE, LARGE, 9]):
            _assert_matches(
                res["repeat"][i],
                _reference(inputs(torch.float32, n, 20 + i), SUM),
                f"{what} name reused, call {i}",
            )
        for message in res["handle.gone"]:
            assert message is not None and "unknown handle" in message, res["handle.gone"]
        expected = torch.full((3,), float(sum(range(nranks))))
        _assert_matches(res["after"], expected, f"{what} after")


@pytest.mark.parametrize("nranks", NRANKS)
def test_gradient_is_the_same_allreduce_of_the_gradient(nranks):
    results = [out["grad"] for out in _launch(nranks)]
    for rank, out in enumerate(results):
        for i, (dtype, op, pre, post) in enumerate(_grad_cases()):
            what = f"rank {rank} of {nranks}: {dtype} op={op} prescale={pre} postscale={post}"
            y, grad = out[i]
            xs = [_input(r, dtype, 16, 200 + i) for r in range(nranks)]
            gs = [_input(r, dtype, 16, 300 + i) for r in range(nranks)]
            _assert_matches(y, _reference(xs, op, pre, post), f"{what} forward")
            _assert_matches(grad, _reference(gs, op, pre, post), f"{what} x.grad")
        expected = torch.full((4,), 2.0 * nranks, dtype=torch.float64)
        _assert_matches(out[-1], expected, f"rank {rank} chained graph")


def test_opcheck():
    failures = [out["opcheck"] for out in _launch(2)]
    assert failures == [{}, {}], "\n".join(f"{k}: {v}" for k, v in failures[0].items())
