"""The Python side of handles (hvd_torch/handles.py): poll() and synchronize()
dispatch by type, an engine int handle to the C++ table and anything else by
the Handle protocol, which sparse and Adasum handles follow; no import circle.
The table itself is tested in tests/cpp/test_handle_table.cc."""

import ast
from pathlib import Path

import pytest
import torch

import hvd_torch as hvd
from hvd_torch import adasum, handles, ops

PACKAGE = Path(hvd.__file__).resolve().parent


class _Counting(handles.Handle):
    def __init__(self):
        self.calls = []

    def poll(self):
        self.calls.append("poll")
        return False

    def synchronize(self):
        self.calls.append("synchronize")
        return "result"


def test_a_handle_object_is_polled_and_synchronized_through_its_own_methods():
    h = _Counting()
    assert hvd.poll(h) is False
    assert hvd.synchronize(h) == "result"
    assert h() == "result"  # calling a handle synchronizes it, as Horovod's sparse handle
    assert h.calls == ["poll", "synchronize", "synchronize"]


def test_sparse_and_adasum_handles_follow_the_protocol():
    assert issubclass(adasum.Handle, handles.Handle)
    assert issubclass(ops._SparseHandle, handles.Handle)
    t = torch.ones(2)
    done = adasum.Handle(t)
    assert hvd.poll(done) is True
    assert hvd.synchronize(done) is t
    assert hvd.synchronize(adasum.Handle([t, t])) == [t, t]  # a grouped Adasum's list


@pytest.mark.parametrize("handle", [12345, -1, 0])
def test_an_unknown_engine_handle_is_a_value_error_naming_it(handle):
    # Before init() the table is empty: every int is unknown, whatever its sign.
    for call in (hvd.poll, hvd.synchronize, hvd._C.handle_kind):
        with pytest.raises(ValueError, match=f"unknown handle {handle}"):
            call(handle)
    with pytest.raises(ValueError, match="cannot group handles"):
        hvd._C.group_handles([handle])


def test_engine_handles_have_three_kinds():
    kinds = hvd._C.HandleKind
    assert set(kinds.__members__) == {"single", "alltoall", "group"}


def _imports(module):
    tree = ast.parse((PACKAGE / f"{module}.py").read_text())
    names = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.module:
            names.add(node.module)
            names.update(f"{node.module}.{a.name}" for a in node.names)
        elif isinstance(node, ast.Import):
            names.update(a.name for a in node.names)
    return names


def test_ops_does_not_import_grouped_and_handles_imports_neither():
    # grouped.py imports ops.py; the other way round was an import circle.
    assert not any("grouped" in name for name in _imports("ops"))
    assert not any(n.startswith(("hvd_torch.ops", "hvd_torch.grouped"))
                   for n in _imports("handles"))
