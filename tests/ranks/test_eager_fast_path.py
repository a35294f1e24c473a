"""Eager allreduces of plain CPU tensors (blocking and async), blocking broadcasts and
allgathers, synchronize and poll skip the dispatcher (csrc/python/eager_fast_path.cpp):
the fast path is taken exactly where the dispatcher would add nothing but a version
bump, gives the same results, version counters and errors as the torch op, and every
other case (autograd, subclasses, tracing, dispatch and torch-function modes, inference
mode, conjugate views) goes through the torch op with its usual behaviour. Every
entry says "not taken" the same way, NotImplemented, which no result can be. 1 and 2
ranks (broadcast and allgather: 2 and 3, the last rank the broadcast's root)."""

import sys
from pathlib import Path

import pytest
import torch

from dist_harness import run_ranks  # noqa: E402


def _outcome(result):
    """An eager entry's return as the test compares it: "not taken" for
    NotImplemented, None or an int (in-place ops, handles) as they are, "result"
    for anything else (tensors, tuples, lists)."""
    if result is NotImplemented:
        return "not taken"
    return result if result is None or type(result) is int else "result"


def _error_of(call):
    """(exception type, first line of its message), or None when call() raises nothing."""
    try:
        call()
        return None
    except Exception as e:  # noqa: BLE001 (the type is what we compare)
        return type(e).__name__, str(e).split("\n")[0]


def _which_path_and_results():
    import hvd_torch as hvd
    from hvd_torch import _C
    from torch.utils._python_dispatch import TorchDispatchMode

    hvd.init()
    r, n = hvd.rank(), hvd.size()
    res = {}
    args = ("probe", 1, 1.0, 1.0, 0)

    def taken(t):
        return _outcome(_C.eager_allreduce_(t.clone() if not t.requires_grad else t, *args))

    class Sub(torch.Tensor):
        pass

    class Passthrough(TorchDispatchMode):
        def __torch_dispatch__(self, func, types, a=(), kw=None):
            return func(*a, **(kw or {}))

    res["plain"] = taken(torch.ones(2))
    res["int"] = taken(torch.ones(2, dtype=torch.int64))
    res["needs_grad"] = taken(torch.ones(2, requires_grad=True))
    res["subclass"] = _outcome(_C.eager_allreduce_(torch.ones(2).as_subclass(Sub), *args))
    res["conj"] = _outcome(_C.eager_allreduce_(torch.ones(2, dtype=torch.complex64).conj(),
                                               *args))
    with Passthrough():
        res["dispatch_mode"] = _outcome(_C.eager_allreduce_(torch.ones(2), *args))
    with torch.inference_mode():
        res["inference"] = _outcome(_C.eager_allreduce_(torch.ones(2), *args))
    res["functional_subclass"] = _outcome(
        _C.eager_allreduce(torch.ones(2).as_subclass(Sub), *args))
    res["functional_plain"] = _outcome(_C.eager_allreduce(torch.ones(2), *args))
    res["grouped_mixed"] = _outcome(_C.eager_grouped_allreduce_(
        [torch.ones(1), torch.ones(1, requires_grad=True)], *args))
    res["grouped_plain"] = _outcome(
        _C.eager_grouped_allreduce_([torch.ones(1), torch.ones(2)], *args))
    res["grouped_functional_mixed"] = _outcome(_C.eager_grouped_allreduce(
        [torch.ones(1), torch.ones(1, requires_grad=True)], *args))

    # Same results and version counters as the torch op.
    x = torch.full((3,), float(r + 1))
    v0 = x._version
    hvd.allreduce_(x, name="ip", op=hvd.Sum)
    res["inplace"] = (x.tolist(), x._version - v0)
    y = torch.full((3,), float(r + 1))
    torch.ops.hvd_torch.allreduce_(y, "ip.op", 1)
    res["inplace_op_version"] = y._version - v0
    ts = [torch.full((k + 1,), float(r + 1)) for k in range(3)]
    versions = [t._version for t in ts]
    hvd.grouped_allreduce_(ts, name="g", op=hvd.Sum)
    res["grouped"] = ([t.tolist() for t in ts], [t._version - v for t, v in zip(ts, versions)])
    res["functional"] = hvd.allreduce(torch.full((2,), float(r + 1)), name="f").tolist()
    res["grouped_functional"] = [t.tolist() for t in hvd.grouped_allreduce(
        [torch.ones(1) * (r + 1), torch.ones(2) * (r + 1)], name="gf", op=hvd.Sum)]
    # Cases that fall back still compute, through the torch op.
    sub = torch.full((2,), float(r + 1)).as_subclass(Sub)
    hvd.allreduce_(sub, name="sub", op=hvd.Sum)
    res["subclass_result"] = (type(sub).__name__, sub.tolist())
    with Passthrough():
        res["mode_result"] = hvd.allreduce(torch.full((2,), float(r + 1)), name="m",
                                           op=hvd.Sum).tolist()
    w = torch.full((2,), float(r + 1), requires_grad=True)
    out = hvd.allreduce(w, name="grad", op=hvd.Sum)
    out.sum().backward()
    res["grad"] = (out.requires_grad, w.grad.tolist())
    traced = torch.jit.trace(lambda t: hvd.allreduce(t, name="traced", op=hvd.Sum),
                             torch.ones(2), check_trace=False)
    res["traced_calls_op"] = "hvd_torch::allreduce" in str(traced.graph)

    # The bump lets autograd refuse a saved tensor that the op overwrote.
    w, x = torch.ones(2, requires_grad=True), torch.ones(2)
    y = (w * x).sum()  # saves x for w's gradient
    hvd.allreduce_(x, name="saved", op=hvd.Sum)
    try:
        y.backward()
        res["saved_overwritten"] = "backward ran"
    except RuntimeError as e:
        res["saved_overwritten"] = "modified by an inplace operation" in str(e)

    # A caller's mistake raises the same error either way.
    res["errors"] = [_error_of(lambda: hvd.allreduce_(torch.ones(1), name="bad", op=7)),
                     _error_of(lambda: torch.ops.hvd_torch.allreduce_(torch.ones(1), "bad", 7))]
    hvd.shutdown()
    return res


@pytest.mark.parametrize("nranks", [1, 2])
def test_fast_path_is_taken_exactly_where_the_dispatcher_adds_nothing(nranks):
    for rank, res in enumerate(run_ranks(_which_path_and_results, nranks, timeout=120)):
        total = float(nranks * (nranks + 1) // 2)
        # In-place entries return None once done, functional ones their result.
        assert res["plain"] is None and res["int"] is None, res
        assert res["grouped_plain"] is None and res["functional_plain"] == "result", res
        for case in ("needs_grad", "subclass", "conj", "dispatch_mode", "inference",
                     "grouped_mixed", "functional_subclass", "grouped_functional_mixed"):
            assert res[case] == "not taken", (case, res)
        assert res["inplace"] == ([total] * 3, 1), res
        assert res["inplace_op_version"] == 1, res
        assert res["grouped"] == ([[total] * (k + 1) for k in range(3)], [1, 1, 1]), res
        assert res["functional"] == [total / nranks] * 2, res  # Average
        assert res["grouped_functional"] == [[total], [total, total]], res
        assert res["subclass_result"] == ("Sub", [total, total]), res
        assert res["mode_result"] == [total, total], res
        assert res["grad"] == (True, [float(nranks)] * 2), res
        assert res["traced_calls_op"], res
        assert res["saved_overwritten"] is True, res
        assert res["errors"][0] is not None and res["errors"][0] == res["errors"][1], res
        assert res["errors"][0][0] == "ValueError", res


def _async_paths_and_results():
    import hvd_torch as hvd
    from hvd_torch import _C
    from torch.utils._python_dispatch import TorchDispatchMode

    hvd.init()
    r, n = hvd.rank(), hvd.size()
    res = {}
    args = (1, 1.0, 1.0, 0)

    class Sub(torch.Tensor):
        pass

    class Passthrough(TorchDispatchMode):
        def __torch_dispatch__(self, func, types, a=(), kw=None):
            return func(*a, **(kw or {}))

    def handle_of(t, name):  # the eager path's handle, or "not taken" (nothing submitted)
        h = _C.eager_allreduce_async_(t, name, *args)
        if h is not NotImplemented:
            hvd.synchronize(h)
        return _outcome(h)

    h = handle_of(torch.ones(2), "a.plain")
    res["plain"] = type(h) is int and h > 0
    for case, t in (("needs_grad", torch.ones(2, requires_grad=True)),
                    ("subclass", torch.ones(2).as_subclass(Sub))):
        res[case] = handle_of(t, "a." + case)
    with Passthrough():
        res["dispatch_mode"] = handle_of(torch.ones(2), "a.mode")
        h = hvd.allreduce_async(torch.full((2,), float(r + 1)), name="a.mode.op", op=hvd.Sum)
        res["sync_in_mode"] = _outcome(_C.eager_synchronize(h))
        res["mode_result"] = torch.ops.hvd_torch.synchronize(h).tolist()
    with torch.inference_mode():
        res["inference"] = handle_of(torch.ones(2), "a.inference")

    # Same results, version counters and returned objects as the torch op.
    x = torch.full((3,), float(r + 1))
    h = hvd.allreduce_async_(x, name="a.ip", op=hvd.Sum)
    res["inplace_version"] = x._version
    res["poll_type"] = type(hvd.poll(h)).__name__
    out = hvd.synchronize(h)
    res["inplace"] = (out is x, x.tolist())
    y = torch.full((3,), float(r + 1))
    torch.ops.hvd_torch.synchronize(torch.ops.hvd_torch.allreduce_async_(y, "a.ip.op", 1))
    res["op_version"] = y._version
    z = torch.full((2,), float(r + 1))
    res["functional"] = (hvd.synchronize(hvd.allreduce_async(z, name="a.f")).tolist(),
                         z.tolist())
    sub = torch.full((2,), float(r + 1)).as_subclass(Sub)
    res["subclass_result"] = hvd.synchronize(hvd.allreduce_async_(sub, name="a.sub",
                                                                  op=hvd.Sum)).tolist()
    w = torch.full((2,), float(r + 1), requires_grad=True)
    res["needs_grad_result"] = hvd.synchronize(hvd.allreduce_async(w, name="a.grad",
                                                                   op=hvd.Sum)).tolist()
    # Many in flight at once, synchronized in reverse order.
    vs = [torch.full((k + 1,), float(r + k)) for k in range(50)]
    hs = [hvd.allreduce_async_(v, name=f"a.many.{k}", op=hvd.Sum) for k, v in enumerate(vs)]
    for h in reversed(hs):
        hvd.synchronize(h)
    res["many"] = all(v.tolist() == [float(n * k + n * (n - 1) // 2)] * (k + 1)
                      for k, v in enumerate(vs))

    # A caller's mistake raises the same error either way.
    res["errors"] = [
        (_error_of(lambda: hvd.allreduce_async_(torch.ones(1), name="a.bad", op=7)),
         _error_of(lambda: torch.ops.hvd_torch.allreduce_async_(torch.ones(1), "a.bad", 7))),
        (_error_of(lambda: hvd.synchronize(10**9)),
         _error_of(lambda: torch.ops.hvd_torch.synchronize(10**9))),
        (_error_of(lambda: hvd.poll(10**9)), _error_of(lambda: torch.ops.hvd_torch.poll(10**9))),
    ]
    hvd.shutdown()
    return res


@pytest.mark.parametrize("nranks", [1, 2])
def test_async_fast_path_matches_the_torch_op(nranks):
    for rank, res in enumerate(run_ranks(_async_paths_and_results, nranks, timeout=120)):
        total = float(nranks * (nranks + 1) // 2)
        assert res["plain"] is True, res
        for case in ("needs_grad", "subclass", "dispatch_mode", "inference", "sync_in_mode"):
            assert res[case] == "not taken", (case, res)
        assert res["mode_result"] == [total] * 2, res
        assert res["inplace_version"] == 1 and res["op_version"] == 1, res
        assert res["poll_type"] == "bool", res
        assert res["inplace"] == (True, [total] * 3), res
        assert res["functional"] == ([total / nranks] * 2, [float(rank + 1)] * 2), res
        assert res["subclass_result"] == [total] * 2, res
        assert res["needs_grad_result"] == [total] * 2, res
        assert res["many"], res
        for fast, op in res["errors"]:
            assert fast is not None and fast == op, res
        assert res["errors"][0][0][0] == "ValueError", res


def _broadcast_and_allgather_paths_and_results():
    import hvd_torch as hvd
    from hvd_torch import _C
    from torch.utils._python_dispatch import TorchDispatchMode

    hvd.init()
    r, n = hvd.rank(), hvd.size()
    res = {}

    class Sub(torch.Tensor):
        pass

    class Passthrough(TorchDispatchMode):
        def __torch_dispatch__(self, func, types, a=(), kw=None):
            return func(*a, **(kw or {}))

    res["plain"] = _outcome(_C.eager_broadcast_(torch.ones(2), 0, "b.plain", 0))
    res["needs_grad"] = _outcome(_C.eager_broadcast_(torch.ones(2, requires_grad=True), 0,
                                                     "b.g", 0))
    res["subclass"] = _outcome(_C.eager_broadcast_(torch.ones(2).as_subclass(Sub), 0, "b.s", 0))
    with Passthrough():
        res["dispatch_mode"] = _outcome(_C.eager_broadcast_(torch.ones(2), 0, "b.m", 0))
    with torch.inference_mode():
        res["inference"] = _outcome(_C.eager_broadcast_(torch.ones(2), 0, "b.i", 0))
    res["functional_subclass"] = _outcome(
        _C.eager_broadcast(torch.ones(2).as_subclass(Sub), 0, "b.fs", 0))

    # Same results and version counters as the torch op; the last rank is the root.
    root = n - 1
    x = torch.full((3,), float(r + 1))
    v0 = x._version
    hvd.broadcast_(x, root, name="b.ip")
    res["inplace"] = (x.tolist(), x._version - v0)
    y = torch.full((3,), float(r + 1))
    torch.ops.hvd_torch.broadcast_(y, root, "b.ip.op", 0)
    res["op"] = (y.tolist(), y._version - v0)
    z = torch.full((2,), float(r + 1))
    res["functional"] = (hvd.broadcast(z, root, name="b.f").tolist(), z.tolist())
    sub = torch.full((2,), float(r + 1)).as_subclass(Sub)
    hvd.broadcast_(sub, root, name="b.sub")
    res["subclass_result"] = (type(sub).__name__, sub.tolist())
    w = torch.full((2,), float(r + 1), requires_grad=True)
    out = hvd.broadcast(w, root, name="b.grad")
    res["grad"] = (out.requires_grad, out.tolist())

    # Allgather: rank r gives r + 1 rows.
    rows = torch.full((r + 1, 2), float(r))
    res["allgather_plain"] = _outcome(_C.eager_allgather(rows, "g.probe", 0))
    res["allgather_subclass"] = _outcome(_C.eager_allgather(rows.as_subclass(Sub), "g.sub", 0))
    res["allgather"] = hvd.allgather(rows, name="g").tolist()
    res["allgather_op"] = torch.ops.hvd_torch.allgather(rows, "g.op", 0).tolist()
    g = rows.clone().requires_grad_()
    res["allgather_grad"] = hvd.allgather(g, name="g.grad").requires_grad

    # A caller's mistake raises the same error either way.
    res["errors"] = [_error_of(lambda: hvd.broadcast_(torch.ones(1), n + 5, name="b.bad")),
                     _error_of(lambda: torch.ops.hvd_torch.broadcast_(torch.ones(1), n + 5,
                                                                       "b.bad", 0))]
    hvd.shutdown()
    return res


@pytest.mark.parametrize("nranks", [2, 3])
def test_broadcast_and_allgather_fast_paths_match_the_torch_ops(nranks):
    results = run_ranks(_broadcast_and_allgather_paths_and_results, nranks, timeout=120)
    for rank, res in enumerate(results):
        root_value = float(nranks)
        assert res["plain"] is None, res  # in place: None once done
        for case in ("needs_grad", "subclass", "dispatch_mode", "inference",
                     "functional_subclass"):
            assert res[case] == "not taken", (case, res)
        assert res["inplace"] == ([root_value] * 3, 1), res
        assert res["op"] == ([root_value] * 3, 1), res
        assert res["functional"] == ([root_value] * 2, [float(rank + 1)] * 2), res
        assert res["subclass_result"] == ("Sub", [root_value] * 2), res
        assert res["grad"] == (True, [root_value] * 2), res
        assert res["errors"][0] is not None and res["errors"][0] == res["errors"][1], res
        gathered = [[float(k)] * 2 for k in range(nranks) for _ in range(k + 1)]
        assert res["allgather_plain"] == "result", res
        assert res["allgather_subclass"] == "not taken", res
        assert res["allgather"] == res["allgather_op"] == gathered, res
        assert res["allgather_grad"] is True, res


def _alltoall_and_reducescatter_paths_and_results():
    import hvd_torch as hvd
    from hvd_torch import _C

    hvd.init()
    r, n = hvd.rank(), hvd.size()
    res = {}

    class Sub(torch.Tensor):
        pass

    # Alltoall: rank r sends k + 1 rows of value 10 r + k to rank k.
    x = torch.cat([torch.full((k + 1, 2), float(10 * r + k)) for k in range(n)])
    splits = torch.tensor([k + 1 for k in range(n)], dtype=torch.int32)
    probe = _C.eager_alltoall(x, splits, "a.probe", 0)
    res["alltoall_plain"] = _outcome(probe)
    res["alltoall_subclass"] = _outcome(_C.eager_alltoall(x.as_subclass(Sub), splits, "a.sub", 0))
    res["alltoall_subclass_splits"] = _outcome(_C.eager_alltoall(x, splits.as_subclass(Sub),
                                                                 "a.ss", 0))
    out, received = hvd.alltoall(x, splits=[k + 1 for k in range(n)], name="a")
    op_out, op_received = torch.ops.hvd_torch.alltoall(x, splits, "a.op", 0)
    res["alltoall"] = (out[:, 0].tolist(), received.tolist(), received.dtype == torch.int32)
    res["alltoall_op"] = (op_out[:, 0].tolist(), op_received.tolist())
    even = hvd.alltoall(torch.arange(float(2 * n)) + 100 * r, name="a.even")
    res["alltoall_even"] = even.tolist()
    g = x.clone().requires_grad_()
    res["alltoall_grad"] = hvd.alltoall(g, splits=splits, name="a.grad")[0].requires_grad

    # Reducescatter of 2n rows: rank r gets rows 2r and 2r + 1, summed over ranks.
    rows = torch.arange(float(2 * n)).reshape(2 * n, 1) * (r + 1)
    res["reducescatter_plain"] = _outcome(_C.eager_reducescatter(rows, "rs.probe", 1, 1.0, 1.0,
                                                                 0))
    res["reducescatter_subclass"] = _outcome(_C.eager_reducescatter(rows.as_subclass(Sub),
                                                                    "rs.sub", 1, 1.0, 1.0, 0))
    res["reducescatter"] = hvd.reducescatter(rows, name="rs", op=hvd.Sum).flatten().tolist()
    res["reducescatter_op"] = torch.ops.hvd_torch.reducescatter(rows, "rs.op", 1, 1.0, 1.0,
                                                                0).flatten().tolist()
    res["reducescatter_avg_fp16"] = hvd.reducescatter(
        rows, name="rs.c", compression=hvd.Compression.fp16).flatten().tolist()
    w = rows.clone().requires_grad_()
    res["reducescatter_grad"] = hvd.reducescatter(w, name="rs.grad", op=hvd.Sum).requires_grad

    # A caller's mistake raises the same error either way.
    bad = torch.tensor([1] * (n + 1), dtype=torch.int32)  # one split too many
    res["errors"] = [_error_of(lambda: hvd.alltoall(x, splits=bad, name="a.bad")),
                     _error_of(lambda: torch.ops.hvd_torch.alltoall(x, bad, "a.bad", 0))]
    hvd.shutdown()
    return res


@pytest.mark.parametrize("nranks", [2, 3])
def test_alltoall_and_reducescatter_fast_paths_match_the_torch_ops(nranks):
    results = run_ranks(_alltoall_and_reducescatter_paths_and_results, nranks, timeout=120)
    n = nranks
    total = float(sum(range(1, n + 1)))
    for r, res in enumerate(results):
        assert res["alltoall_plain"] == "result", res
        assert res["alltoall_subclass"] == res["alltoall_subclass_splits"] == "not taken", res
        received = [float(10 * k + r) for k in range(n) for _ in range(r + 1)]
        assert res["alltoall"] == (received, [r + 1] * n, True), res
        assert res["alltoall_op"] == (received, [r + 1] * n), res
        assert res["alltoall_even"] == [float(100 * k + 2 * r + j) for k in range(n)
                                        for j in range(2)], res
        assert res["alltoall_grad"] is True, res
        assert res["reducescatter_plain"] == "result", res
        assert res["reducescatter_subclass"] == "not taken", res
        mine = [total * (2 * r), total * (2 * r + 1)]
        assert res["reducescatter"] == res["reducescatter_op"] == mine, res
        assert res["reducescatter_avg_fp16"] == [v / n for v in mine], res
        assert res["reducescatter_grad"] is True, res
        assert res["errors"][0] is not None and res["errors"][0] == res["errors"][1], res


def _tensor_ops():
    """Every hvd_torch op whose first argument is a tensor or a list of them."""
    import hvd_torch  # noqa: F401  (registers the ops)

    ops = []
    for name in torch._C._dispatch_get_all_op_names():
        if name.startswith("hvd_torch::"):
            op = name.split("::")[1]
            first = getattr(torch.ops.hvd_torch, op).default._schema.arguments[0]
            if str(first.type) in ("Tensor", "List[Tensor]"):
                ops.append(op)
    return sorted(ops)


@pytest.mark.unit
def test_every_tensor_op_has_an_eager_entry():
    """One entry per op, made from the kernels' table (csrc/torch/kernels.h)."""
    from hvd_torch import _C

    ops = _tensor_ops()
    assert "allreduce_async_" in ops and "grouped_reducescatter_async" in ops, ops
    assert [op for op in ops if not hasattr(_C, "eager_" + op)] == []


def _entries_take_the_schema_arguments():
    import hvd_torch as hvd
    from hvd_torch import _C

    hvd.init()
    r, n = hvd.rank(), hvd.size()
    x = torch.full((2 * n, 1), float(r + 1))
    res = {}
    # Trailing arguments left out take the schema's defaults (Average, unnamed, global set).
    res["defaults"] = _C.eager_allreduce(x).flatten().tolist()
    h = _C.eager_allreduce_async_(x.clone(), "e.async_", 1)
    res["async_"] = hvd.synchronize(h).flatten().tolist()
    h = _C.eager_broadcast_async(x, n - 1, "e.bcast_async")
    res["broadcast_async"] = hvd.synchronize(h).flatten().tolist()
    hs = _C.eager_grouped_reducescatter_async([x, 2 * x], "e.grs", 1, 1.0, 1.0, 0)
    res["grouped_reducescatter_async"] = [hvd.synchronize(h).flatten().tolist() for h in hs]
    # Anything the entry does not parse is not taken; the torch op then says what is wrong.
    res["name_none"] = _outcome(_C.eager_allreduce(x, None))
    res["op_float"] = _outcome(_C.eager_allreduce(x, "e.f", 1.0))
    res["too_many"] = _outcome(_C.eager_allreduce(x, "e.m", 1, 1.0, 1.0, 0, 0))
    big = 2 ** 32  # must not wrap to the global set
    res["set_out_of_range"] = _outcome(_C.eager_allreduce(x, "e.big", 1, 1.0, 1.0, big))
    res["set_error"] = _error_of(lambda: torch.ops.hvd_torch.allreduce(x, "e.big", 1, 1.0, 1.0,
                                                                       big))
    res["op_error"] = _error_of(lambda: torch.ops.hvd_torch.allreduce(x, "e.op", 300))
    hvd.shutdown()
    return res


@pytest.mark.parametrize("nranks", [2])
def test_entries_take_the_schema_arguments_and_defaults(nranks):
    n = nranks
    total = float(n * (n + 1) // 2)
    for r, res in enumerate(run_ranks(_entries_take_the_schema_arguments, nranks, timeout=120)):
        assert res["defaults"] == [total / n] * (2 * n), res
        assert res["async_"] == [total] * (2 * n), res
        assert res["broadcast_async"] == [float(n)] * (2 * n), res
        assert res["grouped_reducescatter_async"] == [[total] * 2, [2 * total] * 2], res
        for case in ("name_none", "op_float", "too_many", "set_out_of_range"):
            assert res[case] == "not taken", (case, res)
        assert res["set_error"] == (
            "ValueError", f"hvd_torch::allreduce: process_set_id {2 ** 32} is out of range"), res
        assert res["op_error"] == ("ValueError", "hvd_torch::allreduce: op 300 is out of range"), res
