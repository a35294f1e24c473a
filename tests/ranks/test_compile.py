"""Collectives under torch.compile(fullgraph=True) on real ranks: the ops trace
through their fake kernels (no graph break) and run for real. aot_eager keeps
the test fast (no inductor C++ build) while still functionalizing the in-place
op; tests/gpu/test_cuda_ops.py compiles with the default backend on a GPU."""

import pytest
import torch

from dist_harness import run_ranks


def _compiled_step():
    import hvd_torch as hvd

    hvd.init()

    def step(x):
        y = hvd.allreduce(x * 2, name="compiled.out", op=hvd.Sum) + 1
        hvd.allreduce_(y, name="compiled.inplace", op=hvd.Max)
        g = hvd.allgather(x[:1], name="compiled.gather")
        return y, g

    compiled = torch.compile(step, fullgraph=True, backend="aot_eager")
    outs = []
    for i in range(2):  # the second call reuses the compiled graph
        y, g = compiled(torch.full((3,), float(hvd.rank() + 1 + i)))
        outs.append((y.tolist(), g.tolist()))
    hvd.shutdown()
    return outs


@pytest.mark.parametrize("nranks", [1, 2, 3])
def test_ops_under_torch_compile_fullgraph(nranks):
    results = run_ranks(_compiled_step, nranks, timeout=240)
    for i in range(2):
        total = sum(2.0 * (r + 1 + i) for r in range(nranks)) + 1  # Sum, then +1; Max of equals
        gathered = [float(r + 1 + i) for r in range(nranks)]
        for rank_out in results:
            assert rank_out[i] == ([total] * 3, gathered), (i, rank_out)
