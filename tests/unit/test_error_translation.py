"""The boundary where the C++ layer's exceptions become Horovod's classes
(hvd_torch/error_translation.py): each kind of failure, as torch raises it out
of csrc/torch/adapter.cc, leaves every form of the translation as the class
and message docs/errors.md promises. The rank tests (tests/ranks/test_errors.py,
test_error_kinds.py) raise the same kinds for real across processes."""

import ast
from pathlib import Path

import pytest
import torch
from torch.distributed import DistNetworkError

import hvd_torch as hvd
from hvd_torch import error_translation, exceptions

PACKAGE = Path(hvd.__file__).resolve().parent

MESSAGE = "allreduce 'x': rank 1 exited or lost its connection"

# What throwStatus raises, as torch raises it in Python: (kind, the error).
KINDS = [
    ("caller's mistake on this rank", lambda: ValueError(MESSAGE)),
    ("caller's mistake across ranks", lambda: exceptions.RefusedError(MESSAGE)),
    ("peer failure or shutdown", lambda: DistNetworkError(MESSAGE)),
    ("broken invariant", lambda: RuntimeError(
        "hvd_torch internal error (a bug in hvd-torch, please report it): " + MESSAGE)),
]
# The class a caller of hvd_torch's functions sees for each kind.
EXPECTED = {
    "caller's mistake on this rank": ValueError,
    "caller's mistake across ranks": exceptions.RefusedError,
    "peer failure or shutdown": hvd.HorovodInternalError,
    "broken invariant": RuntimeError,
}


def _through_decorator(error):
    @error_translation.translate_errors
    def op():
        raise error
    op()


def _through_block(error):
    with error_translation.translated_errors():
        raise error


def _through_inline(error):  # the hot paths' form (ops.py)
    try:
        raise error
    except error_translation.PeerFailure as e:
        raise error_translation.horovod_internal_error(e) from None


FORMS = [_through_decorator, _through_block, _through_inline]


@pytest.mark.parametrize("form", FORMS, ids=lambda f: f.__name__)
@pytest.mark.parametrize("kind,make", KINDS, ids=[k for k, _ in KINDS])
def test_each_kind_leaves_as_its_horovod_class_with_its_message(form, kind, make):
    error = make()
    with pytest.raises(BaseException) as info:
        form(error)
    raised = info.value
    assert type(raised) is EXPECTED[kind]
    assert str(raised) == str(error)
    if kind == "peer failure or shutdown":
        # `from None`: one traceback, not the torch error's under it.
        assert raised.__cause__ is None and raised.__suppress_context__
    else:
        assert raised is error  # untouched: the same object and traceback


def test_the_classes_keep_their_meaning():
    refused = error_translation.Refused
    assert refused is exceptions.RefusedError
    # `except ValueError` and Horovod's `except RuntimeError` both catch a
    # refusal, and elastic training does not retry it.
    assert issubclass(refused, ValueError) and issubclass(refused, RuntimeError)
    assert not issubclass(refused, hvd.HorovodInternalError)
    assert error_translation.PeerFailure is DistNetworkError
    assert issubclass(hvd.HorovodInternalError, RuntimeError)


def test_a_real_cpp_value_error_passes_through_a_decorated_op_and_the_fast_path():
    # Before init() the C++ layer refuses every op with c10::ValueError, whether a
    # decorated op's torch op or the eager fast path raises it.
    for call in (lambda: hvd.allgather_async(torch.ones(1)), lambda: hvd.allgather(torch.ones(1)),
                 lambda: hvd.broadcast_(torch.ones(1), 0)):
        with pytest.raises(ValueError, match="before hvd_torch.init") as info:
            call()
        assert type(info.value) is ValueError


def test_decorated_ops_keep_their_names_and_docs():
    for fn in (hvd.grouped_allreduce, hvd.join, hvd.poll):
        assert fn.__wrapped__.__name__ == fn.__name__
        assert fn.__doc__ == fn.__wrapped__.__doc__


def test_a_peer_failure_through_the_call_helper_is_horovods():
    # Every wrapper calls its op through op_call.call: the eager entry, or the
    # torch op when the entry declines; a lost peer leaves as HorovodInternalError.
    from hvd_torch.op_call import call

    def lost(*args):
        raise DistNetworkError("rank 1 is gone")

    with pytest.raises(hvd.HorovodInternalError, match="rank 1 is gone") as info:
        call(lambda *a: NotImplemented, lost, 1, "name")
    assert info.value.__cause__ is None and info.value.__suppress_context__
    seen = []
    assert call(lambda *a: seen.append(a) or "eager", lost, 1, "name") == "eager"
    assert call(None, lambda *a: a, 1, "name") == (1, "name") and seen == [(1, "name")]


def test_only_the_boundary_names_the_cpp_classes():
    """The mapping is written once: no other module catches DistNetworkError or
    registers the refusal class."""
    offenders = []
    for path in sorted(PACKAGE.rglob("*.py")):
        if path.name == "error_translation.py":
            continue
        nodes = list(ast.walk(ast.parse(path.read_text())))
        names = {n.id for n in nodes if isinstance(n, ast.Name)}
        names |= {n.attr for n in nodes if isinstance(n, ast.Attribute)}
        for name in ("DistNetworkError", "set_refused_error_type"):
            if name in names:
                offenders.append(f"{path.relative_to(PACKAGE)}: {name}")
    assert offenders == []
