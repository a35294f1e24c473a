"""The response cache keeps its slots for names that recur: ops named afresh each time
(an unnamed hvd.allreduce, every torch.distributed op on the "hvd" backend) take no
slot, so with HOROVOD_CACHE_CAPACITY=4 and many such ops first, DistributedOptimizer's
gradients and a named metric are still sent as cache slots from their second step on
(counted by _C.cached_submissions()).  2 and 3 ranks."""

import datetime

import pytest
import torch

from dist_harness import run_ranks

CAPACITY = 4


def _single_use_names_leave_the_cache_to_recurring_names(store_path):
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel as DDP

    import hvd_torch as hvd
    from hvd_torch import _C

    hvd.init()
    r, n = hvd.rank(), hvd.size()
    counts = {}

    before = _C.cached_submissions()
    sums = [hvd.allreduce(torch.tensor([float(r + i)]), op=hvd.Sum).item() for i in range(10)]
    counts["unnamed"] = _C.cached_submissions() - before

    dist.init_process_group("hvd", init_method=f"file://{store_path}", rank=r, world_size=n,
                            timeout=datetime.timedelta(seconds=60))
    try:
        torch.manual_seed(0)
        ddp = DDP(torch.nn.Sequential(torch.nn.Linear(6, 5), torch.nn.Linear(5, 2)),
                  bucket_cap_mb=0.00001)  # one bucket per parameter: several ops a step
        before = _C.cached_submissions()
        for _ in range(3):
            ddp(torch.randn(4, 6)).sum().backward()
        counts["c10d"] = _C.cached_submissions() - before
    finally:
        dist.destroy_process_group()

    # Unnamed parameters: the optimizer names them 'allreduce.noname.<i>' itself,
    # and those names recur every step.
    model = torch.nn.Linear(3, 1)
    opt = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1))
    # A call of a cached name names its slot to rank 0, or runs on the fast lane
    # (one host, spinning callers; an async one when its caller waits): both
    # use the slot.
    before = _C.cached_submissions() + _C.lane_ops()
    for _ in range(3):
        opt.zero_grad()
        model(torch.full((2, 3), float(r))).sum().backward()
        opt.step()
    counts["optimizer"] = _C.cached_submissions() + _C.lane_ops() - before

    before = _C.cached_submissions() + _C.lane_ops()
    losses = [hvd.allreduce(torch.tensor([float(r)]), name="loss", op=hvd.Sum).item()
              for _ in range(2)]
    counts["named"] = _C.cached_submissions() + _C.lane_ops() - before
    hvd.shutdown()
    return {"counts": counts, "sums": sums, "losses": losses}


@pytest.mark.parametrize("nranks", [2, 3])
def test_single_use_names_leave_the_cache_to_recurring_names(nranks, tmp_path):
    results = run_ranks(_single_use_names_leave_the_cache_to_recurring_names, nranks,
                        args=(str(tmp_path / "store"),), timeout=120,
                        env={"HOROVOD_CACHE_CAPACITY": str(CAPACITY)})  # fmt: skip
    ranks_sum = nranks * (nranks - 1) / 2
    for res in results:
        assert res["sums"] == [ranks_sum + nranks * i for i in range(10)], res
        assert res["losses"] == [ranks_sum] * 2, res
        # Two parameters, cached on steps 2 and 3; the metric on its second call.
        assert res["counts"] == {"unnamed": 0, "c10d": 0, "optimizer": 4, "named": 1}, res
