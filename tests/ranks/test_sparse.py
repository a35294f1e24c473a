"""Sparse gradients as Horovod reduces them, on 2 and 3 ranks:
sparse_allreduce_async (an allgather of indices and values, Average dividing
the values by the set's size) and DistributedOptimizer with
nn.Embedding(sparse=True) without sparse_as_dense, which must train exactly
like sparse_as_dense=True (the same sums, another layout)."""

import pytest
import torch

from dist_harness import launch_once

AVERAGE, SUM = 0, 1


def _sparse(rank):
    """Rank r has r + 1 entries (one repeated index), at rows that overlap between ranks."""
    idx = torch.tensor([[(rank + k) % 5 for k in range(rank + 1)] + [rank % 5],
                        [k % 3 for k in range(rank + 1)] + [0]])
    vals = torch.arange(1.0, rank + 3, dtype=torch.float64) * (rank + 1)
    return torch.sparse_coo_tensor(idx, vals, (5, 3), check_invariants=True)


def _train(hvd, sparse_as_dense):
    torch.manual_seed(0)
    emb = torch.nn.Embedding(6, 2, sparse=True, dtype=torch.float64)
    opt = hvd.DistributedOptimizer(torch.optim.SGD(emb.parameters(), lr=0.5),
                                   named_parameters=emb.named_parameters(),
                                   sparse_as_dense=sparse_as_dense)
    r = hvd.rank()
    layouts = []
    for step in range(3):
        opt.zero_grad()
        ids = torch.tensor([(r + step) % 6, (2 * r + 1) % 6, r % 6])
        (emb(ids) * (r + 1)).sum().backward()
        opt.synchronize()
        layouts.append(emb.weight.grad.is_sparse)
        with opt.skip_synchronize():
            opt.step()
    return emb.weight.detach().clone(), layouts


def _rank_main():
    import hvd_torch as hvd

    torch.set_num_threads(1)
    hvd.init()
    r = hvd.rank()
    out = {}
    for op in (AVERAGE, SUM):
        h = hvd.sparse_allreduce_async(_sparse(r), f"sp.{op}", op)
        out[("named", op)] = hvd.synchronize(h)
    h = hvd.sparse_allreduce_async(_sparse(r), None, SUM)
    out["unnamed_poll"] = h.poll() in (True, False)
    out["unnamed"] = h()  # Horovod's handle is callable
    out["bad_op"] = None
    try:
        hvd.sparse_allreduce_async(_sparse(r), "sp.max", hvd.Max)
    except ValueError as e:
        out["bad_op"] = str(e)
    out["sparse"] = _train(hvd, sparse_as_dense=False)
    out["dense"] = _train(hvd, sparse_as_dense=True)
    hvd.shutdown()
    return out


@pytest.mark.parametrize("nranks", [2, 3])
def test_sparse_allreduce_and_optimizer(nranks):
    dense_sum = sum(_sparse(r).to_dense() for r in range(nranks))
    nnz = sum(_sparse(r)._nnz() for r in range(nranks))
    for rank, out in enumerate(launch_once(_rank_main, nranks, timeout=120)):
        for op, want in ((SUM, dense_sum), (AVERAGE, dense_sum / nranks)):
            got = out[("named", op)]
            assert got.is_sparse and got._nnz() == nnz, (rank, op, got)  # every rank's entries
            assert torch.allclose(got.to_dense(), want), (rank, op, got.to_dense(), want)
        assert torch.allclose(out["unnamed"].to_dense(), dense_sum), rank
        assert out["unnamed_poll"]
        assert "op 4 is not supported" in out["bad_op"], out["bad_op"]
        w_sparse, layouts_sparse = out["sparse"]
        w_dense, layouts_dense = out["dense"]
        assert layouts_sparse == [True] * 3 and layouts_dense == [True] * 3, (rank, out)
        assert torch.allclose(w_sparse, w_dense), (rank, w_sparse, w_dense)
    # Every rank ends with the same weights, and they moved.
    results = launch_once(_rank_main, nranks, timeout=120)
    first = results[0]["sparse"][0]
    for out in results[1:]:
        assert torch.equal(out["sparse"][0], first)
    torch.manual_seed(0)
    start = torch.nn.Embedding(6, 2, sparse=True, dtype=torch.float64).weight.detach()
    assert not torch.allclose(first, start)
