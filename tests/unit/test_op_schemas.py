"""The import check that holds each op's schema to its options (csrc/core/op_options.h,
csrc/torch/op_call.h): hvd_torch's import runs it on every registered schema, and
_C.options_mismatch runs it on a schema's text, so a drifted copy of a real schema
shows what the import would refuse: an argument without its field, a field without
its argument, a rename, another type, another default, another tensor input."""

import pytest
import torch

from hvd_torch import _C

ALLREDUCE = str(torch.ops.hvd_torch.allreduce.default._schema)


def _kernel_ops():
    """The ops with an eager entry: every row of the kernels' table (kernels.h)."""
    ops = [name[len("eager_"):] for name in dir(_C) if name.startswith("eager_")]
    return sorted(op for op in ops if op not in ("poll", "synchronize"))


def test_every_registered_schema_fits_its_options():
    ops = _kernel_ops()
    assert len(ops) == 22, ops
    for op in ops:
        schema = str(getattr(torch.ops.hvd_torch, op).default._schema)
        assert _C.options_mismatch(op, schema) == "", (op, schema)


@pytest.mark.parametrize("change, why", [
    ((', str timeline_label=""', ""), "field timeline_label has no argument"),
    ((', str timeline_label=""', ', str timeline_label="", int extra=0'),
     "argument extra has no field"),
    (("int op=0", "int reduce_op=0"), "argument reduce_op where the options have field op"),
    (("float prescale_factor=1.", "int prescale_factor=1"), "argument prescale_factor's type"),
    (("int op=0", "int op=1"), "argument op's default differs"),
    (("Tensor tensor", "Tensor[] tensor"), "argument tensor is not the runner's input"),
])
def test_a_drifted_schema_is_refused_naming_the_argument(change, why):
    old, new = change
    assert old in ALLREDUCE, ALLREDUCE
    assert why in _C.options_mismatch("allreduce", ALLREDUCE.replace(old, new))


def test_an_op_outside_the_table_is_a_caller_mistake():
    with pytest.raises(ValueError, match="no kernel named barrier"):
        _C.options_mismatch("barrier", "hvd_torch::barrier(int process_set_id=0) -> Tensor")
