"""Issue #47: cached ops agreed among the ranks, without rank 0 (HVD_TORCH_AGREEMENT=1;
docs/control_plane_scale.md, "The agreement").  On one host the fast lane runs cached ops
instead, so these jobs use Gloo (HVD_TORCH_SHM=0), as a job across hosts does.  2 and 3
ranks: every op kind over several steps with the same numbers as rank 0's negotiation, a
shape that changes under a cached name, a process set covering part of the job, join, a
mismatch named on every rank, a stall named by rank 0, a killed rank."""

import os
import signal
import time

import pytest
import torch

from dist_harness import run_ranks

# The inline budget off: every cached op takes the agreement (a small one goes to rank 0
# with its data otherwise, as without the agreement: the last test below).
NO_INLINE = {"HVD_TORCH_SHM": "0", "HVD_TORCH_INLINE_THRESHOLD": "0"}
AGREEMENT = dict(NO_INLINE, HVD_TORCH_AGREEMENT="1")
STEPS = 4


def _every_op_agreed():
    import torch

    import hvd_torch as hvd
    from hvd_torch import _C

    hvd.init()
    r, n = hvd.rank(), hvd.size()
    got = {"sum": [], "avg": [], "grouped": [], "gather": [], "bcast": [], "a2a": [],
           "rs": [], "shift": [], "opt": None}
    for step in range(STEPS):
        got["sum"].append(hvd.allreduce(torch.tensor([r, step], dtype=torch.float64),
                                        name="sum", op=hvd.Sum).tolist())
        got["avg"].append(hvd.allreduce(torch.full((3,), float(r + step)), name="avg").tolist())
        handles = [hvd.allreduce_async(torch.full((2,), float(r * i)), name=f"async.{i}",
                                       op=hvd.Sum) for i in range(4)]
        got["grouped"].append([hvd.synchronize(h).tolist() for h in handles]
                              + [t.tolist() for t in hvd.grouped_allreduce(
                                  [torch.ones(2) * r, torch.ones(1)], name="grp", op=hvd.Sum)])
        got["gather"].append(hvd.allgather(torch.full((r + 1, 2), float(r)), name="gather").tolist())
        got["bcast"].append(hvd.broadcast(torch.tensor([float(r + step)]), root_rank=n - 1,
                                          name="bcast").tolist())
        got["a2a"].append(hvd.alltoall(torch.arange(n, dtype=torch.float32) + 10 * r,
                                       name="a2a").tolist())
        got["rs"].append(hvd.reducescatter(torch.ones(2 * n, 2) * (r + 1), name="rs",
                                           op=hvd.Sum).tolist())
        # The same name with another shape from step 2 on: a stale slot, renegotiated.
        length = 2 if step < 2 else 3
        got["shift"].append(hvd.allreduce(torch.ones(length) * r, name="shift", op=hvd.Sum).tolist())
    # Async gradients, the agreement's main traffic.
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(4, 3), torch.nn.Linear(3, 1))
    opt = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1),
                                   named_parameters=model.named_parameters())
    hvd.broadcast_parameters(model.state_dict(), root_rank=0)
    for step in range(STEPS):
        opt.zero_grad()
        model(torch.full((2, 4), float(r + step))).sum().backward()
        opt.step()
    got["opt"] = [p.detach().tolist() for p in model.parameters()]
    counts = {"agreed": _C.agreed_ops(), "rounds": _C.agreement_rounds(),
              "cached_to_rank_0": _C.cached_submissions()}
    hvd.shutdown()
    return got, counts


@pytest.mark.parametrize("nranks", [2, 3])
def test_every_op_kind_is_agreed_and_gives_rank_0s_numbers(nranks):
    agreed = run_ranks(_every_op_agreed, nranks, timeout=120, env=AGREEMENT)
    negotiated = run_ranks(_every_op_agreed, nranks, timeout=120, env=NO_INLINE)
    n = nranks
    ranks_sum = n * (n - 1) / 2
    for rank, ((got, counts), (ref, ref_counts)) in enumerate(zip(agreed, negotiated)):
        # The same numbers as rank 0's negotiation. The optimizer's fused gradients
        # go through Gloo's ring, whose order of addition follows the fused buffer:
        # its float rounding moves with how ops fuse, which depends on timing in
        # either protocol (docs/architecture.md, "One reduction").
        opt, ref_opt = got.pop("opt"), ref.pop("opt")
        assert got == ref, (rank, got, ref)
        for p, q in zip(opt, ref_opt):
            assert torch.allclose(torch.tensor(p), torch.tensor(q), rtol=1e-5, atol=1e-6), (p, q)
        assert got["sum"] == [[ranks_sum, step * n] for step in range(STEPS)], got["sum"]
        assert got["avg"] == [[ranks_sum / n + step] * 3 for step in range(STEPS)]
        assert got["gather"][0] == [[float(q), float(q)] for q in range(n) for _ in range(q + 1)]
        assert got["bcast"] == [[float(n - 1 + step)] for step in range(STEPS)]
        assert got["a2a"][0] == [float(rank + 10 * q) for q in range(n)]
        assert got["rs"][0] == [[ranks_sum + n] * 2] * 2
        assert got["shift"] == [[ranks_sum] * 2] * 2 + [[ranks_sum] * 3] * 2
        # Every op of steps 1..3 of a cached name went by the agreement; none to rank 0
        # by its slot (the old protocol's cached path).
        ops_per_step = 2 + 4 + 2 + 1 + 1 + 1 + 1
        assert counts["agreed"] >= 2 * ops_per_step, counts
        assert counts["cached_to_rank_0"] == 0, counts
        assert ref_counts["agreed"] == 0 and ref_counts["cached_to_rank_0"] > 0, ref_counts


def _part_of_the_job_and_join():
    import torch

    import hvd_torch as hvd
    from hvd_torch import _C

    hvd.init()
    r, n = hvd.rank(), hvd.size()
    members = [0, 1] if n > 2 else [1]  # part of the job
    pair = hvd.add_process_set(members)
    in_pair = []
    if r in members:
        for step in range(STEPS):
            in_pair.append(hvd.allreduce(torch.tensor([float(r + step)]), name="pair",
                                         op=hvd.Sum, process_set=pair).item())
    everyone = [hvd.allreduce(torch.tensor([1.0]), name="all", op=hvd.Sum).item()
                for _ in range(STEPS)]
    # Uneven data: rank r does r + 2 steps, then joins; the others' ops go on without it.
    sums = []
    for step in range(r + 2):
        sums.append(hvd.allreduce(torch.tensor([1.0]), name="uneven", op=hvd.Sum).item())
    last = hvd.join()
    after = hvd.allreduce(torch.tensor([2.0]), name="all", op=hvd.Sum).item()
    counts = {"agreed": _C.agreed_ops()}
    hvd.shutdown()
    return in_pair, everyone, sums, last, after, counts


@pytest.mark.parametrize("nranks", [2, 3])
def test_a_set_of_part_of_the_job_and_join_work_on_the_agreement(nranks):
    results = run_ranks(_part_of_the_job_and_join, nranks, timeout=120, env=AGREEMENT)
    n = nranks
    for rank, (in_pair, everyone, sums, last, after, counts) in enumerate(results):
        members = [0, 1] if n > 2 else [1]
        want = [float(sum(q + s for q in members)) for s in range(STEPS)]
        assert in_pair == (want if rank in members else []), in_pair
        assert everyone == [float(n)] * STEPS
        # Step s has every rank r with r + 2 > s: joined ranks count as zeros.
        assert sums == [float(sum(1 for q in range(n) if q + 2 > s)) for s in range(rank + 2)]
        assert last == n - 1, last  # the rank with the most steps joins last
        assert after == 2.0 * n
        assert counts["agreed"] > 0, counts


def _shapes_disagree():
    import torch

    import hvd_torch as hvd

    hvd.init()
    r = hvd.rank()
    for _ in range(2):
        hvd.allreduce(torch.ones(2), name="w", op=hvd.Sum)
    try:
        hvd.allreduce(torch.ones(2 + (r == 1)), name="w", op=hvd.Sum)
        return "no error"
    except hvd.HorovodInternalError as e:
        return "internal: " + str(e)
    except ValueError as e:
        return str(e)
    finally:
        hvd.shutdown()


@pytest.mark.parametrize("nranks", [2, 3])
def test_a_cached_name_with_another_shape_on_one_rank_is_named_on_every_rank(nranks):
    messages = run_ranks(_shapes_disagree, nranks, timeout=120, env=AGREEMENT)
    for message in messages:
        assert "'w'" in message and "rank 1" in message and "[3]" in message, message


def _late_cached_rank(sleep_s):
    import torch

    import hvd_torch as hvd

    hvd.init()
    hvd.allreduce(torch.ones(2), name="late", op=hvd.Sum)  # now cached: agreed next time
    if hvd.rank() == 1:
        time.sleep(sleep_s)
    try:
        out = hvd.allreduce(torch.ones(2), name="late", op=hvd.Sum)
        return ("ok", out.tolist())
    except hvd.HorovodInternalError as e:
        return ("HorovodInternalError", str(e))


@pytest.mark.parametrize("nranks", [2, 3])
def test_a_cached_op_that_stalls_is_named_by_rank_0_on_every_rank(nranks):
    env = dict(AGREEMENT, HOROVOD_STALL_CHECK_TIME_SECONDS="1",
               HOROVOD_STALL_SHUTDOWN_TIME_SECONDS="3")
    results = run_ranks(_late_cached_rank, nranks, args=(8.0,), timeout=60, env=env)
    for rank, (kind, message) in enumerate(results):
        assert kind == "HorovodInternalError", (rank, kind, message)
        assert "stalled" in message and "'late'" in message and "ranks [1]" in message, message


def _killed_rank():
    import torch

    import hvd_torch as hvd

    hvd.init()
    for _ in range(2):
        hvd.allreduce(torch.ones(2), name="x", op=hvd.Sum)
    if hvd.rank() == hvd.size() - 1:
        os.kill(os.getpid(), signal.SIGKILL)
    try:
        hvd.allreduce(torch.ones(2), name="x", op=hvd.Sum)
        return "no error"
    except hvd.HorovodInternalError as e:
        return str(e)


@pytest.mark.parametrize("nranks", [2, 3])
def test_a_killed_rank_fails_the_agreed_op_on_every_other_rank(nranks):
    outcomes = run_ranks(_killed_rank, nranks, timeout=60, env=AGREEMENT, expect_fail=True,
                         fresh=True)
    killed = nranks - 1
    for rank, outcome in enumerate(outcomes[:killed]):
        assert isinstance(outcome, str) and f"rank {killed}" in outcome, (rank, outcome)


def _small_ops(budget_by_rank):
    import torch

    import hvd_torch as hvd
    from hvd_torch import _C

    # Each rank's own inline budget, read by hvd.init(); put back after, for the
    # pooled worker's next job.
    before = os.environ.get("HVD_TORCH_INLINE_THRESHOLD")
    os.environ["HVD_TORCH_INLINE_THRESHOLD"] = str(budget_by_rank[int(os.environ["HOROVOD_RANK"])])
    try:
        hvd.init()
    finally:
        if before is None:
            del os.environ["HVD_TORCH_INLINE_THRESHOLD"]
        else:
            os.environ["HVD_TORCH_INLINE_THRESHOLD"] = before
    r = hvd.rank()
    sums = []
    for step in range(STEPS):
        t = torch.tensor([0.1 * (r + 1) + step / 3.0, 1e-3 * r - 0.7], dtype=torch.float32)
        sums.append(hvd.allreduce(t, name="small", op=hvd.Sum).tolist())
    counts = {"agreed": _C.agreed_ops(), "cached_to_rank_0": _C.cached_submissions()}
    hvd.shutdown()
    return sums, counts


@pytest.mark.parametrize("nranks", [2, 3])
def test_small_ops_go_inline_through_rank_0_with_the_same_bits(nranks):
    """A small cached op goes to rank 0 with its data (inline), with or without the
    agreement, so its sum (in rank order at rank 0) keeps its bits; when rank 1 alone
    has no inline budget, the ranks that sent theirs inline make the round hand rank
    1's copy to rank 0 too, and the op runs as without the agreement (no hang)."""
    inline = [1 << 20] * nranks
    mixed = [0 if r == 1 else 1 << 20 for r in range(nranks)]
    base = {"HVD_TORCH_SHM": "0"}
    reference = run_ranks(_small_ops, nranks, args=(inline,), timeout=120, env=base)
    agreed = run_ranks(_small_ops, nranks, args=(inline,), timeout=120,
                       env=dict(base, HVD_TORCH_AGREEMENT="1"))
    split = run_ranks(_small_ops, nranks, args=(mixed,), timeout=120,
                      env=dict(base, HVD_TORCH_AGREEMENT="1"))
    for rank in range(nranks):
        assert agreed[rank][0] == reference[rank][0], (rank, agreed[rank], reference[rank])
        assert agreed[rank][1]["agreed"] == 0, agreed[rank]  # every step went inline
        for step, got in enumerate(split[rank][0]):
            want = [sum(0.1 * (q + 1) + step / 3.0 for q in range(nranks)),
                    sum(1e-3 * q - 0.7 for q in range(nranks))]
            assert got == pytest.approx(want, rel=1e-5), (rank, step, got, want)
        assert split[rank][1]["cached_to_rank_0"] == 0, split[rank]
