"""Stall handling: a rank that never submits an op ends the job with a named error, not a hang."""

import sys
import time
from pathlib import Path

import pytest

from dist_harness import run_ranks  # noqa: E402

SHORT_LIMITS = {"HOROVOD_STALL_CHECK_TIME_SECONDS": "1", "HOROVOD_STALL_SHUTDOWN_TIME_SECONDS": "3"}


def _late_rank(sleep_s):
    import torch

    import hvd_torch as hvd

    hvd.init()
    if hvd.rank() == 1:
        time.sleep(sleep_s)
    start = time.monotonic()
    try:
        out = hvd.allreduce(torch.ones(2), name="late", op=hvd.Sum)
        return ("ok", out.tolist(), time.monotonic() - start)
    except hvd.HorovodInternalError as e:
        return ("HorovodInternalError", str(e), time.monotonic() - start)


@pytest.mark.parametrize("nranks", [2, 3])
def test_stalled_op_fails_on_every_rank_naming_op_and_missing_rank(nranks):
    results = run_ranks(_late_rank, nranks, args=(8.0,), timeout=60, env=SHORT_LIMITS)
    for rank, (kind, message, waited) in enumerate(results):
        assert kind == "HorovodInternalError", (rank, kind, message)
        assert "stalled" in message and "'late'" in message and "ranks [1]" in message, message
        assert "HOROVOD_STALL_SHUTDOWN_TIME_SECONDS=3" in message, message
        if rank != 1:  # not before the limit (the error itself shows rank 1 never came)
            assert waited > 2.5, (rank, waited)


def test_stall_check_disable_lets_a_slow_rank_finish():
    env = dict(SHORT_LIMITS, HOROVOD_STALL_CHECK_DISABLE="1")
    results = run_ranks(_late_rank, 2, args=(5.0,), timeout=60, env=env)
    for kind, value, _ in results:
        assert (kind, value) == ("ok", [2.0, 2.0])
