"""Async ops finish while their caller runs Python: the engine never waits for the GIL.

Dropping a C++ reference to a tensor that Python also holds decrefs its PyObject, under
the GIL (torch's PyObject preservation). The engine used to drop the inputs it held,
so an op's completion on the background thread waited for the GIL, which a busy
Python thread gives up only every switch interval (5 ms by default, 5 s here): while
the training loop ran Python, async ops finished one per interval. 2 and 3 ranks."""

import sys
import time
from pathlib import Path

import pytest
import torch

from dist_harness import run_ranks  # noqa: E402

SWITCH_INTERVAL_S = 5.0  # a thread waiting for the GIL gets it after this long
BUSY_S = 1.5  # Python work after the submissions: ample for the ops, not for one interval
OPS_PER_KIND = 2


def _async_ops_while_python_runs():
    import hvd_torch as hvd

    torch.set_num_threads(1)
    hvd.init()
    r, n = hvd.rank(), hvd.size()
    hvd.allreduce(torch.ones(1), name="warm", op=hvd.Sum)
    sys.setswitchinterval(SWITCH_INTERVAL_S)
    # The caller keeps every input, as a training loop does.
    inputs, handles, expected = [], [], []
    for i in range(OPS_PER_KIND):
        x = torch.full((4,), float(r + 1))
        inputs.append(x)
        handles.append(hvd.allreduce_async(x, name=f"ar.{i}", op=hvd.Sum))
        expected.append(torch.full((4,), float(n * (n + 1) // 2)))
        g = torch.full((2, 3), float(r))
        inputs.append(g)
        handles.append(hvd.allgather_async(g, name=f"ag.{i}"))
        expected.append(torch.arange(n, dtype=torch.float32).repeat_interleave(2)[:, None]
                        .expand(2 * n, 3))
        b = torch.full((5,), float(r + 10))
        inputs.append(b)
        handles.append(hvd.broadcast_async(b, root_rank=n - 1, name=f"bc.{i}"))
        expected.append(torch.full((5,), float(n - 1 + 10)))
        a = torch.full((n,), float(r))
        inputs.append(a)
        handles.append(hvd.alltoall_async(a, name=f"a2a.{i}"))
        expected.append(torch.arange(n, dtype=torch.float32))
        s = torch.full((2 * n,), float(r + 1))
        inputs.append(s)
        handles.append(hvd.reducescatter_async(s, name=f"rs.{i}", op=hvd.Sum))
        expected.append(torch.full((2,), float(n * (n + 1) // 2)))
        group = [torch.full((3,), float(r + 1)), torch.full((2,), float(r + 1))]
        inputs.extend(group)
        handles.append(hvd.grouped_allreduce_async(group, name=f"grp.{i}", op=hvd.Sum))
        expected.append([torch.full((3,), float(n * (n + 1) // 2)),
                         torch.full((2,), float(n * (n + 1) // 2))])
    # Python runs, holding the GIL: no call into hvd-torch, whose ops release it.
    end = time.monotonic() + BUSY_S
    while time.monotonic() < end:
        pass
    done = sum(hvd.poll(h) for h in handles)
    sys.setswitchinterval(0.005)
    outputs = [hvd.synchronize(h) for h in handles]
    wrong = []
    for i, (out, want) in enumerate(zip(outputs, expected)):
        got = out[0] if isinstance(out, tuple) else out  # alltoall: (tensor, splits)
        pairs = zip(got, want) if isinstance(want, list) else [(got, want)]
        if not all(torch.equal(g, w) for g, w in pairs):
            wrong.append(i)
    hvd.shutdown()
    return {"done": done, "ops": len(handles), "wrong": wrong}


@pytest.mark.parametrize("nranks", [2, 3])
def test_async_ops_finish_while_the_caller_holds_the_gil(nranks):
    for res in run_ranks(_async_ops_while_python_runs, nranks, timeout=120):
        assert res["wrong"] == [], res
        # Waiting for the GIL, the engine finished at most the ops ahead of its
        # first wait; without it, every op is done well within BUSY_S.
        assert res["done"] == res["ops"], res
