"""Process sets on 2, 3 and 4 ranks: registration, every op inside a set, gradients,
the optimizer, concurrent disjoint sets, and the errors a user can cause."""

import os
import sys
import tempfile
import time
from pathlib import Path

import pytest
import torch

from dist_harness import launch_once  # noqa: E402

DTYPES = [torch.uint8, torch.int8, torch.int16, torch.int32, torch.int64, torch.float16,
          torch.bfloat16, torch.float32, torch.float64]


def _error(fn):
    try:
        fn()
    except (RuntimeError, ValueError) as e:
        return f"{type(e).__name__}: {e}"
    return None


def _values(hvd, mine, r):
    """Every op inside this rank's set; results to compare with the test's reference."""
    res = {}
    for dtype in DTYPES:
        x = torch.full((4,), r + 1).to(dtype)
        res[f"sum.{dtype}"] = hvd.allreduce(x, op=hvd.Sum, process_set=mine)
    res["avg"] = hvd.allreduce(torch.full((3,), float(r)), process_set=mine)
    res["gather"] = hvd.allgather(torch.full((r + 1, 2), r), process_set=mine)
    res["bcast"] = {root: hvd.broadcast(torch.full((3,), float(r)), root, process_set=mine)
                    for root in mine.ranks}
    n = mine.size()
    res["alltoall"] = hvd.alltoall(torch.arange(n) + 10 * r, process_set=mine)
    res["scatter"] = hvd.reducescatter(torch.arange(5.0), op=hvd.Sum, process_set=mine)
    res["grouped"] = hvd.grouped_allreduce([torch.ones(2) * r, torch.ones(3)], op=hvd.Sum,
                                           process_set=mine)
    # Both sets use the same user name at once: names are scoped by set.
    res["shared_name"] = hvd.allreduce(torch.ones(1), op=hvd.Sum, name="shared", process_set=mine)
    x = torch.ones(r + 1, 2, dtype=torch.float64, requires_grad=True)
    y = hvd.allgather(x, process_set=mine)
    (y * torch.arange(y.shape[0], dtype=torch.float64).view(-1, 1)).sum().backward()
    res["grad.allgather"] = x.grad
    x = torch.ones(4, dtype=torch.float64, requires_grad=True)
    hvd.reducescatter(x, op=hvd.Average, process_set=mine).sum().backward()
    res["grad.reducescatter"] = x.grad
    return res


def _train_one_step(hvd, mine, r):
    """One SGD step of a linear model, gradients averaged over this rank's set."""
    torch.manual_seed(0)
    model = torch.nn.Linear(3, 1, bias=False)
    torch.nn.init.ones_(model.weight)
    opt = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1),
                                   named_parameters=model.named_parameters(), process_set=mine)
    data = torch.full((2, 3), float(r + 1))
    model(data).sum().backward()
    opt.step()
    return model.weight.detach().clone()


def _errors(hvd, mine, other, r, n):
    res = {}
    res["not_member"] = _error(lambda: hvd.allreduce(torch.ones(1), process_set=other))
    res["unregistered"] = _error(lambda: hvd.allreduce(torch.ones(1),
                                                       process_set=hvd.ProcessSet([0])))
    res["root_outside"] = _error(lambda: hvd.broadcast(torch.ones(1), other.ranks[0],
                                                       process_set=mine))
    # Every rank names a different set: refused on every rank.
    res["mismatch"] = _error(lambda: hvd.add_process_set([r]))
    res["duplicate"] = _error(lambda: hvd.add_process_set(list(range(0, n, 2))))
    res["out_of_range"] = _error(lambda: hvd.add_process_set([0, n]))
    res["remove_global"] = hvd.remove_process_set(hvd.global_process_set)
    return res


def _rank_main():
    import hvd_torch as hvd

    torch.set_num_threads(1)
    # Static sets are built before init(), from what the launcher says.
    r, n = int(os.environ["HOROVOD_RANK"]), int(os.environ["HOROVOD_SIZE"])
    even = hvd.ProcessSet(list(range(0, n, 2)))
    odd = hvd.ProcessSet(list(range(1, n, 2)))
    hvd.init(process_sets=[even, odd])
    mine, other = (even, odd) if r % 2 == 0 else (odd, even)
    res = {"ids": (even.process_set_id, odd.process_set_id), "repr": str(even),
           "set_rank": mine.rank(), "set_size": mine.size(),
           "included": (even.included(), odd.included()),
           "global_ranks": hvd.global_process_set.ranks}
    res.update(_values(hvd, mine, r))
    res["weights"] = _train_one_step(hvd, mine, r)
    # Unnamed ops in one set (more in the odd set than in the even one) do not
    # shift the names of later global ops.
    for _ in range(1 + r % 2):
        hvd.allreduce(torch.ones(1), process_set=mine)
    res["global_after_sets"] = hvd.allreduce(torch.ones(1), op=hvd.Sum)
    if n >= 3:
        # Overlapping sets: rank 1 is in `odd` and `pair`, and uses both at once.
        pair = hvd.add_process_set([1, 2])
        res["pair_id"] = pair.process_set_id
        h1 = (hvd.allreduce_async(torch.ones(2) * r, op=hvd.Sum, process_set=pair)
              if r in (1, 2) else None)
        h2 = hvd.allreduce_async(torch.ones(2) * r, op=hvd.Sum, process_set=mine)
        res["pair"] = (h1 and hvd.synchronize(h1), hvd.synchronize(h2))
        hvd.remove_process_set(pair)
    if n == 4:
        # Disjoint sets run concurrently: the odd set submits nothing until the
        # even set has finished its ops. Were one set's ops to wait for the
        # other's, the flag would never appear.
        flag = os.environ["PROCESS_SETS_TEST_FLAG"]
        if mine is odd:
            deadline = time.monotonic() + 60
            while not os.path.exists(flag) and time.monotonic() < deadline:
                time.sleep(0.01)
            res["even_finished_first"] = os.path.exists(flag)
        for i in range(30):
            hvd.allreduce(torch.ones(1000), name=f"busy.{i}", process_set=mine)
        if r == 0:
            open(flag, "w").close()
    res.update(_errors(hvd, mine, other, r, n))
    res["removed"] = hvd.remove_process_set(even)
    res["even_after_remove"] = (even.process_set_id, even.ranks)
    res["use_removed"] = _error(lambda: hvd.allreduce(torch.ones(1), process_set=even))
    res["final"] = hvd.allreduce(torch.ones(1), op=hvd.Sum)
    return res


def _launch(nranks):
    # A mistake here shows as a stall: fail fast, with the stall's names.
    env = {"HOROVOD_STALL_CHECK_TIME_SECONDS": "5", "HOROVOD_STALL_SHUTDOWN_TIME_SECONDS": "20",
           "PROCESS_SETS_TEST_FLAG": os.path.join(tempfile.mkdtemp(), "even_set_done")}
    return launch_once(_rank_main, nranks, timeout=180, env=env)


def _slice(rows, size, rank):
    base, extra = divmod(rows, size)
    return rank * base + min(rank, extra), base + (1 if rank < extra else 0)


@pytest.mark.parametrize("nranks", [2, 3, 4])
def test_registration(nranks):
    for rank, res in enumerate(_launch(nranks)):
        members = list(range(rank % 2, nranks, 2))
        assert res["ids"] == (1, 2)
        assert res["repr"] == (f"ProcessSet(process_set_id=1, ranks={list(range(0, nranks, 2))}, "
                               "mpi_comm=None)")
        assert res["set_rank"] == members.index(rank) and res["set_size"] == len(members)
        assert res["included"] == (rank % 2 == 0, rank % 2 == 1)
        assert res["global_ranks"] == list(range(nranks))
        if nranks >= 3:
            assert res["pair_id"] == 3


@pytest.mark.parametrize("nranks", [2, 3, 4])
def test_ops_in_a_set(nranks):
    for rank, res in enumerate(_launch(nranks)):
        members = list(range(rank % 2, nranks, 2))
        me, k = members.index(rank), len(members)
        for dtype in DTYPES:
            want = torch.full((4,), sum(m + 1 for m in members)).to(dtype)
            got = res[f"sum.{dtype}"]
            assert got.dtype == dtype and torch.equal(got, want), (rank, dtype, got)
        assert torch.allclose(res["avg"], torch.full((3,), sum(members) / k))
        assert torch.equal(res["gather"], torch.cat([torch.full((m + 1, 2), m) for m in members]))
        for root, got in res["bcast"].items():
            assert torch.equal(got, torch.full((3,), float(root))), (rank, root, got)
        assert torch.equal(res["alltoall"], torch.tensor([10 * m + me for m in members]))
        start, count = _slice(5, k, me)
        assert torch.equal(res["scatter"], torch.arange(5.0)[start:start + count] * k)
        g0, g1 = res["grouped"]
        assert torch.equal(g0, torch.ones(2) * sum(members)) and torch.equal(g1, torch.ones(3) * k)
        assert torch.equal(res["shared_name"], torch.tensor([float(k)]))
        assert torch.equal(res["global_after_sets"], torch.tensor([float(nranks)]))
        assert torch.equal(res["final"], torch.tensor([float(nranks)]))


@pytest.mark.parametrize("nranks", [3, 4])
def test_gradients_in_a_set(nranks):
    for rank, res in enumerate(_launch(nranks)):
        members = list(range(rank % 2, nranks, 2))
        me, k = members.index(rank), len(members)
        offset = sum(m + 1 for m in members[:me])
        # allgather: Average over the set of the upstream weights (Horovod's rule).
        want = torch.tensor([[offset + j] * 2 for j in range(rank + 1)], dtype=torch.float64)
        assert torch.equal(res["grad.allgather"], want), (rank, res["grad.allgather"])
        # reducescatter Average: Horovod's gradient is the allgather of the
        # upstream ones with no size factor, whoever owns the row.
        assert torch.equal(res["grad.reducescatter"], torch.ones(4, dtype=torch.float64)), k


@pytest.mark.parametrize("nranks", [3, 4])
def test_optimizer_averages_within_the_set(nranks):
    results = _launch(nranks)
    for rank, res in enumerate(results):
        members = list(range(rank % 2, nranks, 2))
        # d/dw sum(w . x) over 2 rows of (r + 1) is 2 (r + 1) per weight.
        mean_grad = sum(2.0 * (m + 1) for m in members) / len(members)
        want = torch.full((1, 3), 1.0 - 0.1 * mean_grad)
        assert torch.allclose(res["weights"], want), (rank, res["weights"], want)


def test_overlapping_sets():
    results = _launch(3)
    assert torch.equal(results[1]["pair"][0], torch.full((2,), 3.0))  # ranks 1 + 2
    assert torch.equal(results[2]["pair"][0], torch.full((2,), 3.0))
    assert torch.equal(results[1]["pair"][1], torch.full((2,), 1.0))  # odd = [1]
    assert torch.equal(results[2]["pair"][1], torch.full((2,), 2.0))  # even = [0, 2]


def test_disjoint_sets_run_concurrently():
    results = _launch(4)
    assert results[1]["even_finished_first"] and results[3]["even_finished_first"]


@pytest.mark.parametrize("nranks", [2, 3])
def test_errors_on_every_rank(nranks):
    for rank, res in enumerate(_launch(nranks)):
        other = list(range(1 - rank % 2, nranks, 2))
        # Horovod raises ValueError for each of these; the registry's refusals
        # (every rank compared) are RefusedError, a ValueError too.
        for kind in ("not_member", "unregistered", "root_outside"):
            assert res[kind].startswith("ValueError: "), (kind, res[kind])
        for kind in ("mismatch", "duplicate", "out_of_range"):
            assert res[kind].startswith("RefusedError: "), (kind, res[kind])
        assert f"rank {rank} is not in process set" in res["not_member"], res["not_member"]
        assert f"(ranks {other})" in res["not_member"]
        assert "is not registered" in res["unregistered"]
        assert f"root_rank {other[0]} is not in process set" in res["root_outside"]
        assert "mismatched process set ranks" in res["mismatch"], res["mismatch"]
        assert all(f"rank {k} [{k}]" in res["mismatch"] for k in range(nranks))
        assert "already has ranks" in res["duplicate"], res["duplicate"]
        assert f"rank {nranks} is out of range" in res["out_of_range"], res["out_of_range"]
        assert res["remove_global"] is False
        assert res["removed"] is True
        assert res["even_after_remove"] == (None, None)
        assert "is not registered" in res["use_removed"]


@pytest.mark.unit
def test_single_rank():
    import hvd_torch  # noqa: F401  (the set API is importable without a launch)
    from hvd_torch import ProcessSet

    ps = ProcessSet([2, 0])
    assert ps.ranks == [0, 2] and ps.process_set_id is None and ps.size() is None
    with pytest.raises(ValueError, match="list of ranks"):
        ProcessSet(5)
