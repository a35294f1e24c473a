"""Process sets used the wrong way, on 2 and 3 ranks, as a Horovod user might:
an op called by a rank outside the set, remove_process_set() while another
member still has an op on the set (either order of arrival), and
DistributedOptimizer(process_set=...) on a subset, with ranks outside it.

Every misuse is an error on the ranks that made or suffered it, within
seconds, and the job goes on; none is a stall (docs/compat.md, process sets).
"""

import time

import pytest
import torch

from dist_harness import attempt, launch_once

FAST = 10.0  # seconds: "at once" for an error every rank must see




def _outsider_ops(hvd, sub, outsider):
    """The outsider calls every op on a set it is not in; members do nothing."""
    res = {}
    if hvd.rank() != outsider:
        return res
    t = torch.ones(len(sub.ranks) * 2, 2)
    calls = {
        "allreduce": lambda: hvd.allreduce(t, name="out.ar", process_set=sub),
        "allreduce_async_": lambda: hvd.allreduce_async_(t, name="out.ari", process_set=sub),
        "allgather": lambda: hvd.allgather(t, name="out.ag", process_set=sub),
        "broadcast": lambda: hvd.broadcast(t, sub.ranks[0], name="out.bc", process_set=sub),
        "alltoall": lambda: hvd.alltoall(t, name="out.a2a", process_set=sub),
        "reducescatter": lambda: hvd.reducescatter(t, name="out.rs", process_set=sub),
        "grouped_allreduce": lambda: hvd.grouped_allreduce([t, t], name="out.g", process_set=sub),
        "barrier": lambda: hvd.barrier(process_set=sub),
    }
    for what, fn in calls.items():
        res[what] = attempt(fn)
    return res


def _remove_while_in_use(hvd, order):
    """Rank 0 has an op on `busy` ([0, last]) in flight; the last rank, a member,
    removes the set without submitting it. order "op_first": the op reaches rank 0's
    coordinator first; "remove_first": the removal does. Needs 3 ranks: on 2,
    the only set with two members is the global set, which is never removed."""
    r, last = hvd.rank(), hvd.size() - 1
    busy = hvd.add_process_set([0, last])
    out = {}
    if r == 0:
        if order == "remove_first":
            time.sleep(0.5)  # rank 1's removal is at the coordinator by now
        h = hvd.allreduce_async(torch.ones(3), name=f"busy.{order}", process_set=busy)
        out["op"] = attempt(lambda: hvd.synchronize(h))
    elif r == last and order == "op_first":
        time.sleep(0.5)  # rank 0's op is at the coordinator by now
    out["removed"] = attempt(lambda: hvd.remove_process_set(busy))
    out["after"] = hvd.allreduce(torch.ones(1), name=f"after.{order}", op=hvd.Sum)
    return out


def _subset_optimizer(hvd, sub):
    """Horovod's pattern: every rank wraps its optimizer with the subset; the
    members average over the subset, the others step on their own gradients."""
    r = hvd.rank()
    model = torch.nn.Linear(2, 1, bias=False)
    torch.nn.init.ones_(model.weight)
    opt = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1),
                                   named_parameters=model.named_parameters(), process_set=sub)
    for _ in range(2):
        opt.zero_grad()
        model(torch.full((1, 2), float(r + 1))).sum().backward()
        opt.step()
    opt.zero_grad()
    model(torch.full((1, 2), float(r + 1))).sum().backward()
    opt.synchronize()  # a rank outside the set: nothing to wait for, no error
    grad = model.weight.grad.clone()
    with opt.skip_synchronize():
        opt.step()
    return {"weight": model.weight.detach().clone(), "grad": grad}


def _rank_main():
    import hvd_torch as hvd

    torch.set_num_threads(1)
    hvd.init()
    n = hvd.size()
    sub = hvd.add_process_set([0] if n == 2 else [0, 1])
    outsider = n - 1
    res = {"outsider": _outsider_ops(hvd, sub, outsider)}
    res["in_step"] = hvd.allreduce(torch.ones(1), name="in.step", op=hvd.Sum)
    res["optimizer"] = _subset_optimizer(hvd, sub)
    if n >= 3:
        res["op_first"] = _remove_while_in_use(hvd, "op_first")
        res["remove_first"] = _remove_while_in_use(hvd, "remove_first")
    # A removed set: the object is invalidated, its id is unknown to the engine.
    set_id = sub.process_set_id
    res["removed"] = hvd.remove_process_set(sub)
    res["use_removed"] = attempt(lambda: hvd.allreduce(torch.ones(1), process_set=sub))
    res["use_removed_id"] = attempt(lambda: torch.ops.hvd_torch.allreduce(torch.ones(1), "x", 1,
                                                                           1.0, 1.0, set_id))
    res["after_remove"] = hvd.allreduce(torch.ones(1), name="after.remove", op=hvd.Sum)
    hvd.shutdown()
    return res


def _launch(nranks):
    return launch_once(_rank_main, nranks, timeout=120)


@pytest.mark.parametrize("nranks", [2, 3])
def test_an_op_by_a_rank_outside_the_set_raises_valueerror_at_once(nranks):
    results = _launch(nranks)
    members = [0] if nranks == 2 else [0, 1]
    outsider = nranks - 1
    for what, (exc_type, message, elapsed) in results[outsider]["outsider"].items():
        assert exc_type == "ValueError", (what, exc_type, message)
        assert f"rank {outsider} is not in process set" in message, (what, message)
        assert f"(ranks {members})" in message, (what, message)
        assert elapsed < 1.0, (what, elapsed)
    assert len(results[outsider]["outsider"]) == 8
    for rank, res in enumerate(results):
        assert torch.equal(res["in_step"], torch.tensor([float(nranks)])), rank


@pytest.mark.parametrize("nranks", [2, 3])
def test_distributed_optimizer_on_a_subset(nranks):
    results = _launch(nranks)
    members = [0] if nranks == 2 else [0, 1]
    for rank, res in enumerate(results):
        # d/dw sum(w . x) with x = (r + 1, r + 1): the gradient is r + 1 per weight.
        own = float(rank + 1)
        mean = sum(m + 1 for m in members) / len(members)
        g = mean if rank in members else own
        want = torch.full((1, 2), 1.0 - 3 * 0.1 * g)
        assert torch.allclose(res["optimizer"]["weight"], want), (rank, res["optimizer"], want)
        assert torch.allclose(res["optimizer"]["grad"], torch.full((1, 2), g)), (rank, res)


@pytest.mark.parametrize("nranks", [2, 3])
def test_ops_on_a_removed_set_raise_valueerror(nranks):
    for rank, res in enumerate(_launch(nranks)):
        assert res["removed"] is True
        exc_type, message, elapsed = res["use_removed"]
        assert exc_type == "ValueError" and "is not registered" in message, res["use_removed"]
        exc_type, message, elapsed = res["use_removed_id"]
        assert exc_type == "ValueError" and "does not exist" in message, res["use_removed_id"]
        assert elapsed < 1.0
        assert torch.equal(res["after_remove"], torch.tensor([float(nranks)])), rank


@pytest.mark.parametrize("nranks", [3])  # on 2 ranks no removable set has two members
@pytest.mark.parametrize("order", ["op_first", "remove_first"])
def test_remove_process_set_while_a_member_waits_fails_its_op(nranks, order):
    results = _launch(nranks)
    exc_type, message, elapsed = results[0][order]["op"]
    assert exc_type == "RefusedError", results[0][order]
    remover = nranks - 1
    assert f"rank {remover} called remove_process_set() for this set without submitting it" in (
        message)
    assert "(ranks [0] did)" in message and f"'busy.{order}'" in message, message
    assert elapsed < FAST, elapsed
    for rank, res in enumerate(results):
        assert res[order]["removed"][0] is None, (rank, res[order]["removed"])
        assert torch.equal(res[order]["after"], torch.tensor([float(nranks)])), rank
