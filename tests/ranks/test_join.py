"""join(): ranks with fewer batches join, the others finish, nobody hangs (2 and 3 ranks)."""

import sys
from pathlib import Path

import pytest
import torch

from dist_harness import launch_once  # noqa: E402


def _steps(rank):
    return 2 + 2 * rank  # uneven: rank r has 2 + 2r batches


def _rank_main():
    import hvd_torch as hvd

    torch.set_num_threads(1)
    hvd.init()
    r = hvd.rank()
    res = {"small": [], "big": [], "scatter": [], "horovod_average": []}
    for s in range(_steps(r)):
        # Horovod's Average with joined ranks divides by the whole set's size
        # (postscale / size); a script that wants that number asks for it.
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
    # Other ops fail clearly while a rank has joined; then everything works again.
    if r > 0:
        try:
            hvd.allgather(torch.ones(1), name="gather.while.joined")
            res["gather_while_joined"] = None
        except ValueError as e:
            res["gather_while_joined"] = str(e)
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
def test_joined_ranks_contribute_zeros_and_average_over_the_others(nranks):
    results = _launch(nranks)
    for rank, res in enumerate(results):
        assert len(res["small"]) == _steps(rank)
        for s in range(_steps(rank)):
            active = [q for q in range(nranks) if _steps(q) > s]  # ranks still stepping
            avg = sum(q + 1 for q in active) / len(active)
            assert torch.allclose(res["small"][s], torch.full((2,), avg)), (rank, s)
            total = float(sum(q + 1 for q in active))
            assert torch.equal(res["big"][s], torch.full((3,), total)), (rank, s)
            # The other side of the difference (docs/compat.md, join): Horovod
            # divides by all ranks, joined ones included.
            horovod = torch.full((2,), total) * torch.tensor(1.0 / nranks, dtype=torch.float32)
            assert torch.equal(res["horovod_average"][s], horovod), (rank, s)
            if len(active) < nranks:
                assert not torch.allclose(res["small"][s], horovod), (rank, s)
            assert torch.equal(res["scatter"][s], torch.full((6 // nranks,), total)), (rank, s)
        assert res["last"] == nranks - 1  # the rank with the most batches joins last
        assert torch.equal(res["after"], torch.tensor([float(nranks)]))
        if rank > 0:
            msg = res["gather_while_joined"]
            assert msg and "'gather.while.joined' cannot run while some ranks have joined" in msg
        assert torch.equal(res["after.gather"], torch.ones(nranks))


@pytest.mark.parametrize("nranks", [2, 3])
def test_uneven_training_with_distributed_optimizer_finishes(nranks):
    for res in _launch(nranks):
        assert res["train"] == nranks - 1
