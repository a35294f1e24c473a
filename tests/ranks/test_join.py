"""join(): ranks with fewer batches join, the others finish, nobody hangs; while
some ranks have joined, allreduce, reducescatter, allgather and broadcast run
(Horovod's rules, Average over the whole set unless HVD_TORCH_JOIN_AVERAGE says
otherwise) and the rest refuse clearly (2 and 3 ranks)."""

import sys
from pathlib import Path

import pytest
import torch

from dist_harness import init_refusal, launch_once, run_ranks  # noqa: E402


def _steps(rank):
    return 2 + 2 * rank  # uneven: rank r has 2 + 2r batches


def _rank_main():
    import hvd_torch as hvd

    torch.set_num_threads(1)
    hvd.init()
    r = hvd.rank()
    res = {"small": [], "big": [], "scatter": [], "horovod_average": []}
    for s in range(_steps(r)):
        # Horovod's Average with joined ranks divides by the whole set's size:
        # the same number as a Sum scaled by 1 / size.
        res["horovod_average"].append(hvd.allreduce(
            torch.full((2,), float(r + 1)), name=f"hvdavg.{s}", op=hvd.Sum,
            postscale_factor=1.0 / hvd.size()))
        res["small"].append(hvd.allreduce(torch.full((2,), float(r + 1)), name=f"small.{s}"))
        res["big"].append(hvd.allreduce(torch.full((50000,), float(r + 1)), name=f"big.{s}",
                                        op=hvd.Sum)[:3])
        res["scatter"].append(hvd.reducescatter(torch.full((6,), float(r + 1)), name=f"rs.{s}",
                                                op=hvd.Sum))
    res["last"] = hvd.join()
    res["after"] = hvd.allreduce(torch.ones(1), op=hvd.Sum)
    # Rank 0 joins; the others allgather (rank 0 gives no rows), broadcast
    # from a rank that has not joined, and are refused what cannot run.
    if r > 0:
        res["gather_while_joined"] = hvd.allgather(torch.full((r, 2), float(r)),
                                                   name="gather.while.joined")
        res["bcast_while_joined"] = hvd.broadcast(torch.full((3,), float(r)), root_rank=1,
                                                  name="bcast.while.joined")
        for key, call in (("bcast_from_joined", lambda: hvd.broadcast(
                              torch.ones(2), root_rank=0, name="bcast.from.joined")),
                          ("alltoall_while_joined", lambda: hvd.alltoall(
                              torch.ones(hvd.size()), name="a2a.while.joined"))):
            try:
                call()
                res[key] = None
            except ValueError as e:
                res[key] = str(e)
    res["last.gather"] = hvd.join()
    res["after.gather"] = hvd.allgather(torch.ones(1), name="gather.after")
    res["train"] = _train_uneven(hvd)
    return res


def _train_uneven(hvd):
    """DistributedOptimizer over uneven batches: the short ranks join, training finishes."""
    torch.manual_seed(0)
    model = torch.nn.Linear(4, 1)
    hvd.broadcast_parameters(model.state_dict(), root_rank=0)
    opt = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1),
                                   named_parameters=model.named_parameters())
    for _ in range(_steps(hvd.rank())):
        opt.zero_grad()
        model(torch.randn(8, 4)).pow(2).mean().backward()
        opt.step()
    return hvd.join()


def _launch(nranks):
    """One launch per rank count, shared by every test below."""
    return launch_once(_rank_main, nranks, timeout=120)


@pytest.mark.parametrize("nranks", [2, 3])
def test_joined_ranks_contribute_zeros_and_average_divides_by_the_whole_set(nranks):
    results = _launch(nranks)
    for rank, res in enumerate(results):
        assert len(res["small"]) == _steps(rank)
        for s in range(_steps(rank)):
            active = [q for q in range(nranks) if _steps(q) > s]  # ranks still stepping
            total = float(sum(q + 1 for q in active))
            # Horovod's Average: the joined ranks count as zeros, over all ranks.
            assert torch.allclose(res["small"][s], torch.full((2,), total / nranks)), (rank, s)
            assert torch.equal(res["big"][s], torch.full((3,), total)), (rank, s)
            horovod = torch.full((2,), total) * torch.tensor(1.0 / nranks, dtype=torch.float32)
            assert torch.equal(res["horovod_average"][s], horovod), (rank, s)
            assert torch.equal(res["scatter"][s], torch.full((6 // nranks,), total)), (rank, s)
        assert res["last"] == nranks - 1  # the rank with the most batches joins last
        assert torch.equal(res["after"], torch.tensor([float(nranks)]))
        if rank > 0:
            rows = [torch.full((q, 2), float(q)) for q in range(1, nranks)]
            assert torch.equal(res["gather_while_joined"], torch.cat(rows)), rank
            assert torch.equal(res["bcast_while_joined"], torch.full((3,), 1.0)), rank
            assert "'bcast.from.joined': its root rank 0 has joined" in res["bcast_from_joined"]
            assert ("'a2a.while.joined' cannot run while some ranks have joined"
                    in res["alltoall_while_joined"])
        assert res["last.gather"] in range(1, nranks)
        assert torch.equal(res["after.gather"], torch.ones(nranks))


@pytest.mark.parametrize("nranks", [2, 3])
def test_uneven_training_with_distributed_optimizer_finishes(nranks):
    for res in _launch(nranks):
        assert res["train"] == nranks - 1


def _average_while_joined():
    import hvd_torch as hvd

    hvd.init()
    r = hvd.rank()
    out = [hvd.allreduce(torch.full((2,), float(r + 1)), name=f"avg.{s}").tolist()
           for s in range(r + 1)]  # rank r steps r + 1 times, then joins
    hvd.join()
    hvd.shutdown()
    return out


@pytest.mark.parametrize("nranks", [2, 3])
@pytest.mark.parametrize("rule", ["size", "contributors"])
def test_join_average_rule_is_horovods_unless_asked(nranks, rule):
    results = run_ranks(_average_while_joined, nranks, timeout=120,
                        env={"HVD_TORCH_JOIN_AVERAGE": rule})
    for r, out in enumerate(results):
        for s, got in enumerate(out):
            live = [q + 1 for q in range(s, nranks)]  # ranks that have not joined at step s
            want = sum(live) / (nranks if rule == "size" else len(live))
            assert got == pytest.approx([want, want]), (r, s)


def test_an_unknown_join_average_rule_is_refused_at_init():
    for msg in run_ranks(init_refusal, 2, timeout=60, env={"HVD_TORCH_JOIN_AVERAGE": "mean"}):
        assert msg and "HVD_TORCH_JOIN_AVERAGE=mean" in msg and "'contributors'" in msg
