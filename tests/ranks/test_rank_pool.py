"""The warm rank pools themselves (tests/harness/rank_pool.py): a job's failure
stays with its test, and init()/shutdown() cycles in one process leave nothing
behind."""

import os
import signal
import time

import pytest
import rank_pool
from dist_harness import RankFailure, leaked_shm_segments, run_ranks, shm_segments

pytestmark = pytest.mark.timeout(120)


def _pid_and_sum():
    import torch

    import hvd_torch as hvd

    hvd.init()
    total = hvd.allreduce(torch.ones(3), op=hvd.Sum, name="pool.sum")
    return os.getpid(), total.tolist()


def _print_then_kill_rank_1():
    import hvd_torch as hvd

    hvd.init()
    print(f"rank {hvd.rank()} about to be killed", flush=True)
    if hvd.rank() == 1:
        os.kill(os.getpid(), signal.SIGKILL)
    time.sleep(30)  # the survivor waits; the harness ends it after the grace period


def _hang_on_rank_0():
    import hvd_torch as hvd

    hvd.init()
    if hvd.rank() == 0:
        time.sleep(300)
    return "done"


def _process_footprint():
    """Threads, open fds and our shared-memory segments of this process."""
    tasks = len(os.listdir("/proc/self/task"))
    fds = len(os.listdir("/proc/self/fd"))
    maps = sum(1 for line in open("/proc/self/maps") if "/dev/shm" in line)
    return tasks, fds, maps


def _cycles(n):
    import torch

    import hvd_torch as hvd

    before = _process_footprint()
    segments_before = shm_segments()
    for i in range(n):
        hvd.init()
        out = hvd.allreduce(torch.full((1000,), float(hvd.rank())), op=hvd.Sum, name=f"c{i}")
        assert out[0].item() == sum(range(hvd.size())), out[0]
        hvd.allgather(torch.ones(2, 2), name=f"g{i}")
        handle = hvd.allreduce_async_(torch.ones(4), name=f"a{i}")
        hvd.synchronize(handle)
        hvd.shutdown()
    after = _process_footprint()
    return before, after, leaked_shm_segments(segments_before)


@pytest.mark.parametrize("nranks", [2, 3])
def test_jobs_reuse_warm_workers(nranks):
    first = run_ranks(_pid_and_sum, nranks)
    second = run_ranks(_pid_and_sum, nranks)
    assert [s for _, s in first] == [[float(nranks)] * 3] * nranks
    assert [s for _, s in second] == [[float(nranks)] * 3] * nranks
    assert [p for p, _ in first] == [p for p, _ in second]  # the same processes served both


def test_killed_rank_fails_only_its_test_and_the_pool_recovers():
    before = run_ranks(_pid_and_sum, 2)
    with pytest.raises(AssertionError) as info:
        run_ranks(_print_then_kill_rank_1, 2, timeout=30)
    report = str(info.value)
    assert "rank 1: RankKilled: killed by signal 9" in report
    assert "rank 1 about to be killed" in report  # the rank's own output, in the report
    after = run_ranks(_pid_and_sum, 2)
    assert [s for _, s in after] == [[2.0] * 3] * 2
    assert not {p for p, _ in before} & {p for p, _ in after}  # fresh workers


def test_hung_rank_is_ended_by_the_timeout_and_the_pool_recovers():
    started = time.monotonic()
    with pytest.raises(TimeoutError) as info:
        run_ranks(_hang_on_rank_0, 2, timeout=5)
    assert time.monotonic() - started < 15
    assert info.value.running == [0]
    assert info.value.outcomes[1] == "done"
    after = run_ranks(_pid_and_sum, 2)
    assert [s for _, s in after] == [[2.0] * 3] * 2


def test_expected_failure_keeps_the_pool_when_every_rank_cleans_up():
    pids = [p for p, _ in run_ranks(_pid_and_sum, 2)]
    outcomes = run_ranks(_raise_on_rank_0, 2, expect_fail=True)
    assert isinstance(outcomes[0], RankFailure) and outcomes[0].exc_type == "ValueError"
    assert outcomes[1] == "ok"
    assert [p for p, _ in run_ranks(_pid_and_sum, 2)] == pids


def _raise_on_rank_0():
    import hvd_torch as hvd

    hvd.init()
    if hvd.rank() == 0:
        raise ValueError("rank 0 says no")
    return "ok"


@pytest.mark.parametrize("nranks", [2, 3])
def test_init_shutdown_cycles_leave_no_thread_fd_or_segment(nranks):
    # One warm-up cycle first: torch and the engine allocate lasting things
    # (thread pools, the output cache's first mapping) on first use only.
    run_ranks(_cycles, nranks, args=(1,))
    for before, after, leaked in run_ranks(_cycles, nranks, args=(20,)):
        assert after == before, (before, after)  # (threads, fds, /dev/shm mappings)
        assert leaked == []


def test_fresh_jobs_and_import_time_variables_bypass_the_pool():
    jobs = rank_pool.stats["jobs"]
    pooled = {p for p, _ in run_ranks(_pid_and_sum, 2)}
    fresh = {p for p, _ in run_ranks(_pid_and_sum, 2, fresh=True)}
    logged = {p for p, _ in run_ranks(_pid_and_sum, 2, env={"HOROVOD_LOG_LEVEL": "error"})}
    assert rank_pool.stats["jobs"] == jobs + 1
    assert not pooled & fresh and not pooled & logged


def _parent_pid():
    return os.getppid()


def _kill_self():
    os.kill(os.getpid(), signal.SIGKILL)


def test_workers_of_every_size_fork_from_one_server_not_from_this_process():
    parents = {p for n in (1, 2, 3) for p in run_ranks(_parent_pid, n)}
    assert len(parents) == 1 and os.getpid() not in parents, parents
    server = parents.pop()
    with open(f"/proc/{server}/cmdline", "rb") as f:
        assert b"forkserver" in f.read()
    # A replacement after a kill comes from the same server.
    with pytest.raises(AssertionError):
        run_ranks(_kill_self, 2, timeout=30)
    assert set(run_ranks(_parent_pid, 2)) == {server}
