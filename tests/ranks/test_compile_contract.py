"""The compile contract (hvd_torch/compile_contract.py): every op schema is
traceable (a fake kernel that torch.library.opcheck accepts) or eager-only (a
tracer gets EagerOnlyOp with the reason and never runs it; torch.compile breaks
the graph and runs it eagerly); 2 and 3 ranks."""

import pytest
import torch

from dist_harness import run_ranks  # noqa: E402


def _schemas():
    import hvd_torch  # noqa: F401  (loads the library)

    return sorted(n.split("::", 1)[1] for n in torch._C._dispatch_get_all_op_names()
                  if n.startswith("hvd_torch::"))


@pytest.mark.unit
def test_every_schema_is_traceable_or_eager_only_with_a_reason():
    from hvd_torch.compile_contract import EAGER_ONLY, TRACEABLE

    schemas = _schemas()
    assert len(schemas) == 27, schemas
    assert not set(TRACEABLE) & set(EAGER_ONLY)
    assert sorted(set(TRACEABLE) | set(EAGER_ONLY)) == schemas
    assert all(len(why) > 20 for why in EAGER_ONLY.values())


def _opcheck_traceable():
    import hvd_torch as hvd
    from hvd_torch.compile_contract import TRACEABLE

    hvd.init()
    ops = torch.ops.hvd_torch
    x = torch.arange(6.0).reshape(3, 2) + hvd.rank()
    n = hvd.size()
    samples = {
        "allreduce": (x, "oc.ar", 1, 1.0, 1.0, 0),
        "allreduce_": (x.clone(), "oc.ar_", 1, 1.0, 1.0, 0),
        "allgather": (x, "oc.ag", 0),
        "broadcast": (x, 0, "oc.bc", 0),
        "broadcast_": (x.clone(), 0, "oc.bc_", 0),
        "reducescatter": (torch.ones(2 * n, 2), "oc.rs", 1, 1.0, 1.0, 0),
        "alltoall": (torch.ones(n, 2), None, "oc.a2a", 0),
        "grouped_allreduce": ([x, x + 1], "oc.gar", 1, 1.0, 1.0, 0),
        "grouped_allreduce_": ([x.clone(), x.clone()], "oc.gar_", 1, 1.0, 1.0, 0),
        "grouped_allgather": ([x, x[:1]], "oc.gag", 0),
        "grouped_reducescatter": ([torch.ones(n, 2)], "oc.grs", 1, 1.0, 1.0, 0),
    }
    assert sorted(samples) == sorted(TRACEABLE)
    failures = {}
    for name in TRACEABLE:
        # test_schema runs the op for real (and compares with the fake); the
        # autograd and AOT checks trace it: every rank runs the same checks in
        # the same order, so the real calls pair up across ranks.
        result = torch.library.opcheck(getattr(ops, name).default, samples[name],
                                       test_utils=("test_schema", "test_faketensor",
                                                   "test_autograd_registration"),
                                       raise_exception=False)
        bad = {k: v for k, v in result.items() if v != "SUCCESS"}
        if bad:
            failures[name] = bad
    hvd.shutdown()
    return failures


@pytest.mark.parametrize("nranks", [2, 3])
def test_opcheck_accepts_every_traceable_op(nranks):
    for failures in run_ranks(_opcheck_traceable, nranks, timeout=240):
        assert failures == {}


def _eager_only_under_tracing():
    from torch._subclasses.fake_tensor import FakeTensorMode

    import hvd_torch as hvd
    from hvd_torch.compile_contract import EAGER_ONLY, EagerOnlyOp

    hvd.init()
    ops = torch.ops.hvd_torch
    x = torch.ones(hvd.size(), 2)
    args = {
        "allreduce_async": (x, "e.ar", 1, 1.0, 1.0, 0),
        "allreduce_async_": (x, "e.ar_", 1, 1.0, 1.0, 0),
        "allgather_async": (x, "e.ag", 0),
        "broadcast_async": (x, 0, "e.bc", 0),
        "broadcast_async_": (x, 0, "e.bc_", 0),
        "reducescatter_async": (x, "e.rs", 1, 1.0, 1.0, 0),
        "grouped_allreduce_async": ([x], "e.gar", 1, 1.0, 1.0, 0),
        "grouped_allreduce_async_": ([x], "e.gar_", 1, 1.0, 1.0, 0),
        "grouped_allgather_async": ([x], "e.gag", 0),
        "grouped_reducescatter_async": ([x], "e.grs", 1, 1.0, 1.0, 0),
        "alltoall_async": (x, None, "e.a2a", 0),
        "synchronize_alltoall": (12345,),
        "poll": (12345,),
        "synchronize": (12345,),
        "barrier": (0,),
        "join": (-1,),
    }
    assert sorted(args) == sorted(EAGER_ONLY)
    refused = {}
    with FakeTensorMode(allow_non_fake_inputs=True):
        for name, a in args.items():
            try:
                getattr(ops, name)(*a)
                refused[name] = "ran"
            except EagerOnlyOp as e:
                refused[name] = str(e)
    # Nothing ran for real under the tracer: had rank 0's barrier or join run,
    # the ranks would now disagree and this allreduce would fail or hang.
    total = hvd.allreduce(torch.ones(1), name="after.tracing", op=hvd.Sum).item()

    # torch.compile breaks the graph at eager-only ops and runs them eagerly.
    def step(t):
        hvd.barrier()
        h = hvd.allreduce_async(t * 2, name="compiled.async", op=hvd.Sum)
        return hvd.synchronize(h) + hvd.allreduce(t, name="compiled.sync", op=hvd.Sum)

    compiled = torch.compile(step, backend="aot_eager")
    out = compiled(torch.full((2,), float(hvd.rank() + 1)))
    hvd.shutdown()
    return refused, total, out.tolist()


@pytest.mark.parametrize("nranks", [2, 3])
def test_eager_only_ops_are_refused_by_tracers_and_run_eagerly_when_compiled(nranks):
    s = sum(range(1, nranks + 1))
    for refused, total, out in run_ranks(_eager_only_under_tracing, nranks, timeout=240):
        for name, why in refused.items():
            assert why.startswith(f"torch.ops.hvd_torch.{name} is eager-only: it "), (name, why)
        assert total == nranks
        assert out == [3.0 * s, 3.0 * s]
