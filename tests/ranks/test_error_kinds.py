"""Which exception a failure raises, on 2 and 3 ranks, decided by the failure's
kind and never by its message (docs/errors.md):

- a caller's mistake is ValueError, where Horovod raises ValueError: bad
  alltoall splits (negative, wrong sum, wrong length, not integers), a first
  dimension that does not divide without splits, a rank outside the process
  set, a bad root rank, an unsupported dtype; raised at once on the rank that
  made it, and the job goes on;
- ranks that disagree (shapes, ops, ...) get ValueError on every rank too;
- a dead peer is HorovodInternalError (tests/ranks/test_errors.py kills ranks for
  real); a message that merely contains "HorovodInternalError: " stays a
  ValueError.
"""


import pytest
import torch

from dist_harness import attempt, launch_once




def _rank_main():
    import hvd_torch as hvd

    torch.set_num_threads(1)
    hvd.init()
    r, n = hvd.rank(), hvd.size()
    rows = torch.arange(2.0 * n).view(n, 2)
    solo = hvd.add_process_set([0])  # every other rank is outside it
    local = {
        "splits.negative": lambda: hvd.alltoall(rows, splits=[-1] + [1] * (n - 2) + [n]),
        "splits.sum": lambda: hvd.alltoall(rows, splits=[1] * (n - 1) + [2]),
        "splits.length": lambda: hvd.alltoall(rows, splits=[n]),
        "splits.dtype": lambda: hvd.alltoall(rows, splits=torch.ones(n)),
        "splits.list_ok": lambda: hvd.alltoall(rows, splits=[1] * n, name="ok.list"),
        "indivisible": lambda: hvd.alltoall(torch.ones(n + 1, 2)),
        "root.range": lambda: hvd.broadcast(torch.ones(1), n, name="bad.root"),
        "root.negative": lambda: hvd.broadcast(torch.ones(1), -1, name="bad.root2"),
        "dtype": lambda: hvd.allreduce(torch.ones(2, dtype=torch.complex64), name="cplx"),
        "op": lambda: hvd.allreduce(torch.ones(2), name="badop", op=7),
        "not.member": lambda: hvd.allreduce(torch.ones(1), process_set=solo),
    }
    res = {}
    for what, fn in local.items():
        if what == "not.member" and r == 0:
            continue
        res[what] = attempt(fn)
    # Ranks that disagree: ValueError on every rank. The name contains the
    # old text marker, which must not turn the error into HorovodInternalError.
    res["mismatch"] = attempt(
        lambda: hvd.allreduce(torch.ones(r + 1), name="HorovodInternalError: not one"))
    res["after"] = hvd.allreduce(torch.ones(1), name="after", op=hvd.Sum)
    hvd.shutdown()
    return res


def _launch(nranks):
    return launch_once(_rank_main, nranks, timeout=90)


@pytest.mark.parametrize("nranks", [2, 3])
def test_callers_mistakes_are_valueerror_at_once(nranks):
    expected = {
        "splits.negative": "negative split -1",
        "splits.sum": f"splits sum to {nranks + 1} but the tensor's first dimension is {nranks}",
        "splits.length": f"one entry per rank ({nranks})",
        "splits.dtype": "splits must be an integer tensor, got Float",
        "indivisible": f"without splits the first dimension ({nranks + 1}) must be divisible",
        "root.range": f"root_rank {nranks} is out of range for {nranks} ranks",
        "root.negative": f"root_rank -1 is out of range for {nranks} ranks",
        "dtype": "unsupported dtype",
        "op": "unsupported reduce op 7",
        "not.member": "is not in process set",
    }
    for rank, res in enumerate(_launch(nranks)):
        for what, text in expected.items():
            if what == "not.member" and rank == 0:
                continue
            exc_type, message, elapsed = res[what]
            assert exc_type == "ValueError", (rank, what, res[what])
            assert text in message, (rank, what, message)
            assert elapsed < 1.0, (rank, what, elapsed)
        assert res["splits.list_ok"][0] is None, res["splits.list_ok"]
        exc_type, message, _ = res["mismatch"]
        assert exc_type == "RefusedError" and "mismatched shapes" in message, res["mismatch"]
        assert torch.equal(res["after"], torch.tensor([float(nranks)]))
