"""What tracing may do with each torch.ops.hvd_torch op (docs/architecture.md,
"The compile contract").

Every schema in csrc/torch/ops.cpp is either TRACEABLE, with a fake kernel here
(shapes and dtypes without communication, for FakeTensor, torch.library.opcheck,
torch.export and torch.compile), or EAGER_ONLY, with the reason.  An eager-only
op's fake kernel raises EagerOnlyOp (a FakeTensor "unsupported operator"
with the reason), so a tracer never runs it for real and torch.compile breaks
the graph there and runs it eagerly.

tests/ranks/test_compile_contract.py checks that every schema is in exactly one
of the two tables, runs opcheck over the traceable ones and checks each
eager-only op's refusal.
"""

import torch
from torch._subclasses.fake_tensor import UnsupportedOperatorException

_lib = "hvd_torch::"

# Ops that return a handle: the collective completes after the call returns,
# outside anything a graph could describe.
_HANDLE = ("returns a handle that completes after the call, outside any graph; in "
           "compiled code use the synchronous op (hvd.{sync})")
# Ops with no tensor to trace that exist for their effect on the other ranks.
_EFFECT = "has no tensor to trace and acts on the other ranks; it runs eagerly"

EAGER_ONLY = {
    "allreduce_async": _HANDLE.format(sync="allreduce"),
    "allreduce_async_": _HANDLE.format(sync="allreduce_"),
    "allgather_async": _HANDLE.format(sync="allgather"),
    "broadcast_async": _HANDLE.format(sync="broadcast"),
    "broadcast_async_": _HANDLE.format(sync="broadcast_"),
    "reducescatter_async": _HANDLE.format(sync="reducescatter"),
    "grouped_allreduce_async": _HANDLE.format(sync="grouped_allreduce"),
    "grouped_allreduce_async_": _HANDLE.format(sync="grouped_allreduce_"),
    "grouped_allgather_async": _HANDLE.format(sync="grouped_allgather"),
    "grouped_reducescatter_async": _HANDLE.format(sync="grouped_reducescatter"),
    "alltoall_async": _HANDLE.format(sync="alltoall"),
    "synchronize_alltoall": "completes a handle (see alltoall_async); " + _EFFECT,
    "poll": "asks about a handle (see allreduce_async); " + _EFFECT,
    "synchronize": "completes a handle (see allreduce_async); " + _EFFECT,
    "barrier": _EFFECT,
    "join": _EFFECT,
}


class EagerOnlyOp(UnsupportedOperatorException):
    """A tracer met an eager-only op. torch.compile breaks the graph there and
    runs the op eagerly (fullgraph=True reports this error instead)."""

    def __init__(self, op):
        super().__init__(getattr(torch.ops.hvd_torch, op).default)
        self.reason = (f"torch.ops.hvd_torch.{op} is eager-only: it {EAGER_ONLY[op]}. "
                       "Tracing (FakeTensor, torch.export, torch.compile's graph) never "
                       "runs it; call it outside the traced code")

    def __str__(self):
        return self.reason


def _refuse(op):
    def fake(*args, **kwargs):
        raise EagerOnlyOp(op)
    return fake


for _op in EAGER_ONLY:
    torch.library.register_fake(_lib + _op)(_refuse(_op))


def _like(tensor):
    return torch.empty_like(tensor, memory_format=torch.contiguous_format)


def _dynamic_rows(tensor):
    # A first dimension known only at run time (the sum over ranks, or this
    # rank's share): a new unbacked size for each output.
    rows = torch.library.get_ctx().new_dynamic_size()
    return tensor.new_empty((rows,) + tuple(tensor.shape[1:]))


def _alltoall(tensor):
    received = tensor.new_empty((torch.library.get_ctx().new_dynamic_size(),),
                                dtype=torch.int32)
    return _dynamic_rows(tensor), received


# The output of each traceable op from its first argument alone: no other
# argument (name, op, scaling, process set, or an option appended to a schema
# later) changes a shape, so a new schema argument touches nothing here.
# grouped_X maps X's rule over its list; an in-place op (its schema returns
# nothing) returns None.
_SHAPES = {"allreduce": _like, "broadcast": _like, "allgather": _dynamic_rows,
           "reducescatter": _dynamic_rows, "alltoall": _alltoall}


def _fake(op):
    grouped = op.startswith("grouped_")
    rule = _SHAPES[op.removeprefix("grouped_").rstrip("_")]
    in_place = not getattr(torch.ops.hvd_torch, op).default._schema.returns

    def fake(first, *args, **kwargs):
        if in_place:
            return None
        return [rule(t) for t in first] if grouped else rule(first)
    return fake


TRACEABLE = ("allreduce", "allreduce_", "allgather", "broadcast", "broadcast_", "reducescatter",
             "alltoall", "grouped_allreduce", "grouped_allreduce_", "grouped_allgather",
             "grouped_reducescatter")  # fmt: skip

for _op in TRACEABLE:
    torch.library.register_fake(_lib + _op)(_fake(_op))
