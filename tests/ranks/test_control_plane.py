"""Control frames between ranks on one host go through shared-memory rings (byte_ring.h),
with the TCP socket left for doorbells and closes: which plane each setting gives, frames
larger than a ring, engines that sleep between ops (every message then needs a doorbell),
and a rank killed while the others wait on it; 2 and 3 ranks."""

import os
import signal
import sys
import time
from pathlib import Path

import pytest
import torch

from dist_harness import run_ranks  # noqa: E402


def _ops():
    import hvd_torch as hvd
    from hvd_torch import _C

    torch.set_num_threads(1)
    hvd.init()
    r, n = hvd.rank(), hvd.size()
    res = {"control": _C.control_plane(), "data": _C.backend_name()}
    # Inline frames of 4 MiB (HVD_TORCH_INLINE_THRESHOLD is raised by the test):
    # each is 16 times a ring, so writers wait for room and readers ring them.
    big = hvd.allreduce(torch.full((1 << 20,), float(r + 1)), name="big", op=hvd.Sum)
    res["big"] = (big.min().item(), big.max().item())
    # Ranks that arrive late, one after the other: the early ones' engines
    # have gone to sleep and wake on a doorbell.
    sums = []
    for step in range(6):
        if step % n == r:
            time.sleep(0.05)
        sums.append(hvd.allreduce(torch.tensor([float(step + r)]), name=f"late.{step}",
                                  op=hvd.Sum).item())
    res["late"] = sums
    res["many"] = [hvd.allreduce(torch.ones(1), name="hot", op=hvd.Sum).item()
                   for _ in range(2000)][-1]
    return res


@pytest.mark.parametrize("nranks", [2, 3])
@pytest.mark.parametrize("setting,control", [({}, "shm"), ({"HVD_TORCH_SHM_CONTROL": "0"}, "tcp"),
                                             ({"HVD_TORCH_SHM": "0"}, "tcp")])
def test_control_plane_and_its_traffic(nranks, setting, control):
    env = {"HVD_TORCH_INLINE_THRESHOLD": str(64 << 20), "HVD_TORCH_ENGINE_SPIN_US": "0",
           **setting}
    total = float(sum(r + 1 for r in range(nranks)))
    # 'big' once hung here (3 runs in 40): a writer's read drained the reader's
    # "room in the ring" doorbell and both engines slept (tests/cpp/test_frame_socket.cc).
    for res in run_ranks(_ops, nranks, env=env, timeout=120):
        assert res["control"] == control, res
        assert res["data"] == ("gloo" if setting.get("HVD_TORCH_SHM") == "0" else "shm")
        assert res["big"] == (total, total)
        assert res["late"] == [float(nranks * s + sum(range(nranks))) for s in range(6)]
        assert res["many"] == float(nranks)


def _rank_one_asks_for_tcp():
    import hvd_torch as hvd
    from hvd_torch import _C

    if int(os.environ["HOROVOD_RANK"]) == 1:
        os.environ["HVD_TORCH_SHM_CONTROL"] = "0"
    hvd.init()
    return _C.control_plane(), hvd.allreduce(torch.ones(2), op=hvd.Sum).tolist()


def test_rank_zero_decides():
    """Rank 1 asking for TCP does not split the job: rank 0's setting holds."""
    for control, out in run_ranks(_rank_one_asks_for_tcp, 2, timeout=60):
        assert control == "shm" and out == [2.0, 2.0]


def _killed():
    import hvd_torch as hvd

    hvd.init()
    r = hvd.rank()
    hvd.allreduce(torch.ones(1), name="warm", op=hvd.Sum)
    if r == hvd.size() - 1:
        os.kill(os.getpid(), signal.SIGKILL)
    start = time.monotonic()
    try:
        hvd.allreduce(torch.ones(1), name="after", op=hvd.Sum)
        return ("no error", 0.0)
    except hvd.HorovodInternalError as e:
        return (str(e), time.monotonic() - start)


@pytest.mark.parametrize("nranks", [2, 3])
def test_killed_rank_fails_the_others_through_its_socket(nranks):
    outcomes = run_ranks(_killed, nranks, timeout=60, expect_fail=True,
                         env={"HVD_TORCH_ENGINE_SPIN_US": "0"})
    for rank, out in enumerate(outcomes[:-1]):
        message, elapsed = out
        assert f"rank {nranks - 1}" in message and elapsed < 10, (rank, out)
    assert not isinstance(outcomes[-1], tuple)  # the killed rank
