"""Errors Horovod raises as RuntimeError are RuntimeErrors here too, on 2 and 3 ranks.

Horovod reports ranks that disagree (shapes, first dimensions, dtypes, reduce
ops, root ranks, alltoall shapes, reducescatter dimensions, one name used for
two ops) from synchronize() as HorovodInternalError, a RuntimeError, and
refuses reducescatter with Adasum with a RuntimeError; scripts written for it
catch RuntimeError.  hvd-torch raises them as hvd_torch.exceptions.RefusedError,
a ValueError (as before: tests/ranks/test_errors.py) and a RuntimeError, and
never a HorovodInternalError, which elastic training would retry forever.
A mistake the calling rank sees alone (bad splits, a root rank out of range)
stays the built-in ValueError, as in Horovod.  docs/errors.md.
"""

import builtins

import pytest
import torch

from dist_harness import launch_once

FAST = 10.0  # seconds: "at once" for an error every rank must see


def _classify(fn):
    """What `except RuntimeError` and `except ValueError` make of fn's error."""
    import time

    from hvd_torch import HorovodInternalError

    start = time.monotonic()
    try:
        fn()
    except RuntimeError as e:  # the Horovod user's except clause
        caught = "RuntimeError"
        error = e
    except builtins.ValueError as e:
        caught = "ValueError"
        error = e
    else:
        return None
    return {
        "caught": caught,
        "class": f"{type(error).__module__}.{type(error).__qualname__}",
        "name": type(error).__name__,
        "value_error": isinstance(error, builtins.ValueError),
        "runtime_error": isinstance(error, RuntimeError),
        "internal": isinstance(error, HorovodInternalError),
        "message": str(error),
        "seconds": time.monotonic() - start,
    }


def _rank_main():
    import hvd_torch as hvd

    torch.set_num_threads(1)
    hvd.init()
    r, n = hvd.rank(), hvd.size()
    rows = torch.ones(n * 2, 3)

    def async_mismatch():
        hvd.synchronize(hvd.allreduce_async(torch.ones(r + 1), name="rt.async"))

    disagree = {
        "allreduce.shape": lambda: hvd.allreduce(torch.ones(r + 1), name="rt.shape"),
        "allreduce.dtype": lambda: hvd.allreduce(
            torch.ones(2, dtype=torch.float32 if r == 0 else torch.float64), name="rt.dtype"),
        "allreduce.op": lambda: hvd.allreduce(
            torch.ones(2), name="rt.op", op=hvd.Sum if r == 0 else hvd.Max),
        "allreduce_.shape": lambda: hvd.allreduce_(torch.ones(r + 1), name="rt.inplace"),
        "allreduce_async.shape": async_mismatch,
        "allgather.shape": lambda: hvd.allgather(torch.ones(2, r + 1), name="rt.gather"),
        "allgather.dtype": lambda: hvd.allgather(
            torch.ones(2, dtype=torch.int32 if r == 0 else torch.int64), name="rt.gdtype"),
        "broadcast.root": lambda: hvd.broadcast(torch.ones(2), r, name="rt.root"),
        "broadcast.shape": lambda: hvd.broadcast(torch.ones(r + 1), 0, name="rt.bshape"),
        "alltoall.shape": lambda: hvd.alltoall(torch.ones(n, r + 1), name="rt.a2a"),
        "reducescatter.first_dim": lambda: hvd.reducescatter(
            torch.ones(n + r, 2), name="rt.rsdim", op=hvd.Sum),
        "reducescatter.shape": lambda: hvd.reducescatter(
            torch.ones(n, r + 1), name="rt.rsshape", op=hvd.Sum),
        "grouped_allreduce.shape": lambda: hvd.grouped_allreduce(
            [torch.ones(2), torch.ones(r + 1)], name="rt.group"),
        "optype": lambda: (hvd.allreduce(torch.ones(2), name="rt.optype") if r == 0
                           else hvd.allgather(torch.ones(2), name="rt.optype")),
        "raw_op.shape": lambda: torch.ops.hvd_torch.allreduce(torch.ones(r + 1), "rt.raw", 1,
                                                              1.0, 1.0, 0),
        # Every rank makes this mistake itself: refused at submission.
        "reducescatter.adasum": lambda: hvd.reducescatter(rows, name="rt.rsadasum",
                                                          op=hvd.Adasum),
        "grouped_reducescatter.adasum": lambda: hvd.grouped_reducescatter(
            [rows], name="rt.grsadasum", op=hvd.Adasum),
    }
    res = {}
    for what, fn in disagree.items():
        res[what] = _classify(fn)
        # The job goes on after each.
        res[what + ".after"] = hvd.allreduce(torch.ones(1), name="rt.after." + what, op=hvd.Sum)
    # Mistakes the calling rank sees alone stay the built-in ValueError, as in Horovod.
    local = {
        "splits.sum": lambda: hvd.alltoall(rows, splits=[1] * (n - 1) + [n + 2]),
        "root.range": lambda: hvd.broadcast(torch.ones(1), n, name="rt.badroot"),
        "dtype": lambda: hvd.allreduce(torch.ones(2, dtype=torch.complex64), name="rt.cplx"),
    }
    for what, fn in local.items():
        res["local." + what] = _classify(fn)

    # Elastic training restores and retries on HorovodInternalError only: a
    # mismatch inside hvd.elastic.run reaches the caller after one attempt.
    calls = []

    @hvd.elastic.run
    def train(state):
        calls.append(1)
        hvd.allreduce(torch.ones(r + 1), name=f"rt.elastic.{len(calls)}")

    state = hvd.elastic.ObjectState(epoch=0)
    res["elastic"] = _classify(lambda: train(state))
    res["elastic.calls"] = len(calls)
    res["end"] = hvd.allreduce(torch.ones(1), name="rt.end", op=hvd.Sum)
    hvd.shutdown()
    return res


def _launch(nranks):
    return launch_once(_rank_main, nranks, timeout=120)


EXPECTED = {
    "allreduce.shape": "mismatched shapes",
    "allreduce.dtype": "mismatched dtypes",
    "allreduce.op": "mismatched reduce ops",
    "allreduce_.shape": "mismatched shapes",
    "allreduce_async.shape": "mismatched shapes",
    "allgather.shape": "mismatched shapes (all dimensions but the first must match)",
    "allgather.dtype": "mismatched dtypes",
    "broadcast.root": "mismatched root ranks",
    "broadcast.shape": "mismatched shapes",
    "alltoall.shape": "mismatched shapes (all dimensions but the first must match)",
    "reducescatter.first_dim": "mismatched shapes",
    "reducescatter.shape": "mismatched shapes",
    "grouped_allreduce.shape": "mismatched",
    "optype": "mismatched operations for tensor 'rt.optype'",
    "raw_op.shape": "mismatched shapes",
    "reducescatter.adasum": "unsupported reduce op 2",
    "grouped_reducescatter.adasum": "unsupported reduce op 2",
}


@pytest.mark.parametrize("nranks", [2, 3])
def test_what_horovod_raises_as_runtimeerror_is_caught_as_runtimeerror(nranks):
    for rank, res in enumerate(_launch(nranks)):
        for what, text in EXPECTED.items():
            got = res[what]
            where = f"rank {rank} of {nranks}, {what}: {got}"
            assert got is not None, f"rank {rank} of {nranks}, {what}: did not raise"
            assert got["caught"] == "RuntimeError", where
            assert got["class"] == "hvd_torch.exceptions.RefusedError", where
            # Still what hvd-torch raised before: a ValueError.
            assert got["value_error"], where
            # Not the error elastic training restores and retries on.
            assert not got["internal"], where
            assert text in got["message"], where
            assert got["seconds"] < FAST, where
            assert torch.equal(res[what + ".after"], torch.tensor([float(nranks)])), where


@pytest.mark.parametrize("nranks", [2, 3])
def test_a_callers_own_argument_error_stays_the_builtin_valueerror(nranks):
    for rank, res in enumerate(_launch(nranks)):
        for what in ("local.splits.sum", "local.root.range", "local.dtype"):
            got = res[what]
            assert got is not None, (rank, what)
            assert got["caught"] == "ValueError", (rank, what, got)
            assert got["class"] == "builtins.ValueError", (rank, what, got)
            assert not got["runtime_error"] and not got["internal"], (rank, what, got)


@pytest.mark.parametrize("nranks", [2, 3])
def test_elastic_run_does_not_retry_ranks_that_disagree(nranks):
    for rank, res in enumerate(_launch(nranks)):
        got = res["elastic"]
        assert got is not None and got["caught"] == "RuntimeError", (rank, got)
        assert got["class"] == "hvd_torch.exceptions.RefusedError", (rank, got)
        assert "mismatched shapes" in got["message"], (rank, got)
        assert res["elastic.calls"] == 1, (rank, res["elastic.calls"])
        assert torch.equal(res["end"], torch.tensor([float(nranks)]))


@pytest.mark.unit
def test_the_class_is_both_and_not_horovods_internal_error():
    from hvd_torch import HorovodInternalError
    from hvd_torch.exceptions import RefusedError

    assert issubclass(RefusedError, builtins.ValueError)
    assert issubclass(RefusedError, RuntimeError)
    assert not issubclass(RefusedError, HorovodInternalError)
    with pytest.raises(RuntimeError):
        raise RefusedError("x")
    with pytest.raises(builtins.ValueError):
        raise RefusedError("x")


@pytest.mark.unit
def test_the_old_name_is_an_alias_that_hides_no_builtin():
    from hvd_torch import exceptions
    from hvd_torch.exceptions import ValueError as old_name

    assert old_name is exceptions.ValueError is exceptions.RefusedError
    # A star import brings the classes, not a name that hides the built-in.
    namespace = {}
    exec("from hvd_torch.exceptions import *", namespace)
    assert "ValueError" not in namespace and namespace["RefusedError"] is old_name
    assert "ValueError" not in vars(exceptions)
