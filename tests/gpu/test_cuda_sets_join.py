"""Process sets, join and autograd with CUDA tensors (issue #10, item 2).

One GPU means 1 rank runs through NCCL and 2 or 3 ranks share the GPU through
the host-staged plane; process sets need 2 ranks or more (a set of every rank is
the global set). Without a GPU the same rank code runs on the CPU path
(tests/harness/gpu_device.py), which checks the tests themselves. Every value is checked against numbers worked out here, not
against another run.
"""

import os

import pytest
import torch

from dist_harness import run_ranks
from gpu_device import DEVICE, needs_device

pytestmark = needs_device
TIMEOUT = 300
RANKS = [1, 2, 3]


def _host(value):
    """CPU copies of the tensors in `value`, and the devices they were on."""
    if isinstance(value, torch.Tensor):
        return value.detach().cpu().clone(), value.device.type
    return value, None


def _rank(device):
    import hvd_torch as hvd

    n = int(os.environ["HOROVOD_SIZE"])
    evens = hvd.ProcessSet(list(range(0, n, 2)))  # static: registered before init()
    hvd.init(process_sets=[evens] if n > 1 else [])
    if device == "cuda":
        torch.cuda.set_device(hvd.local_rank() % torch.cuda.device_count())
    r = hvd.rank()
    full = lambda shape, v: torch.full(shape, float(v), device=device)  # noqa: E731
    out = {}
    if n > 1:
        if evens.included():
            out["evens"] = hvd.allreduce(full((3,), r + 1), op=hvd.Sum, name="evens",
                                         process_set=evens)
        # A set added after init(), on every rank: all but rank 0.
        rest = hvd.add_process_set(list(range(1, n)))
        if rest.included():
            out["rest.sum"] = hvd.allreduce(full((4,), r + 1), op=hvd.Sum, name="rest.sum",
                                            process_set=rest)
            out["rest.gather"] = hvd.allgather(full((r + 1, 2), r), name="rest.gather",
                                               process_set=rest)
            out["rest.bcast"] = hvd.broadcast(full((2,), r), root_rank=n - 1,
                                              name="rest.bcast", process_set=rest)
        hvd.remove_process_set(rest)

    # Autograd through the ops on this device.
    x = full((3,), r + 1).requires_grad_()
    (hvd.allreduce(x, op=hvd.Sum, name="grad.ar") * (r + 1)).sum().backward()
    out["grad.allreduce"] = x.grad
    g = full((r + 1, 2), 1).requires_grad_()
    rows = sum(q + 1 for q in range(n))
    weights = torch.arange(1, rows + 1, device=device, dtype=torch.float32).unsqueeze(1)
    (hvd.allgather(g, name="grad.ag") * weights * (r + 1)).sum().backward()
    out["grad.allgather"] = g.grad

    # Uneven work: rank r has r + 1 steps, then joins.
    for s in range(r + 1):
        out[f"join.sum.{s}"] = hvd.allreduce(full((2,), r + 1), op=hvd.Sum, name=f"join.sum.{s}")
        out[f"join.avg.{s}"] = hvd.allreduce(full((2,), r + 1), name=f"join.avg.{s}")
    out["join.last"] = hvd.join()
    out["after"] = hvd.allreduce(full((1,), 1), op=hvd.Sum, name="after")
    hvd.shutdown()
    return {k: _host(v) for k, v in out.items()}


@pytest.mark.parametrize("nranks", RANKS)
def test_process_sets_join_and_autograd_on_the_gpu(nranks):
    results = run_ranks(_rank, nranks, args=(DEVICE,), timeout=TIMEOUT)
    n = nranks
    for r, res in enumerate(results):
        for key, (_, device) in res.items():
            if device is not None:
                assert device == DEVICE, (r, key, device)
        want = {
            "grad.allreduce": torch.full((3,), float(n * (n + 1) // 2)),
            "after": torch.tensor([float(n)]),
            "join.last": n - 1,
        }
        if n > 1 and r % 2 == 0:
            want["evens"] = torch.full((3,), float(sum(q + 1 for q in range(0, n, 2))))
        if r > 0:
            members = range(1, n)
            want["rest.sum"] = torch.full((4,), float(sum(q + 1 for q in members)))
            want["rest.gather"] = torch.cat([torch.full((q + 1, 2), float(q)) for q in members])
            want["rest.bcast"] = torch.full((2,), float(n - 1))
        # allgather's gradient: the Average-allreduce of the output's gradient
        # ((q + 1) * weights on rank q), narrowed to this rank's rows.
        offset = sum(q + 1 for q in range(r))
        rows = torch.arange(offset + 1, offset + r + 2, dtype=torch.float32).unsqueeze(1)
        want["grad.allgather"] = (rows * (n + 1) / 2).expand(r + 1, 2)
        for s in range(r + 1):
            live = [q + 1 for q in range(s, n)]  # ranks that have not joined at step s
            want[f"join.sum.{s}"] = torch.full((2,), float(sum(live)))
            # Horovod's Average while ranks have joined: over all n ranks.
            want[f"join.avg.{s}"] = torch.full((2,), sum(live) / n)
        assert set(res) == set(want), (r, sorted(res), sorted(want))
        for key, expected in want.items():
            got = res[key][0]
            if isinstance(expected, torch.Tensor):
                torch.testing.assert_close(got, expected, msg=f"rank {r} of {n}: {key}")
            else:
                assert got == expected, (r, key, got)
