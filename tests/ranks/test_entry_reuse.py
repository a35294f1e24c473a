"""The engine and the coordinator reuse the table entries of completed ops for new names
(csrc/core/engine.cc, coordinator.cc: no allocation per op). A reused entry must carry
nothing of its last op: names that change every step, inline and collective sizes,
async bursts, bundles, a process set beside the global one, mismatch errors in between
and a name whose shape changes give exact results on 2 and 3 ranks."""

import sys
from pathlib import Path

import pytest

from dist_harness import run_ranks  # noqa: E402

ROUNDS = 120  # each round makes about ten new names: far more than the 64 kept entries


def _churn():
    import torch

    import hvd_torch as hvd

    hvd.init()
    r, n = hvd.rank(), hvd.size()
    members = [0, 1] if n > 2 else [1]  # a set beside the global one
    pair = hvd.add_process_set(members)
    errors = []
    for i in range(ROUNDS):
        # Unnamed ops: a new name each call. One element goes inline, 64K through the
        # data plane.
        for count in (1, 65536):
            out = hvd.allreduce(torch.full((count,), float(r + i)), op=hvd.Sum)
            assert torch.equal(out, torch.full((count,), float(n * i + n * (n - 1) // 2))), (i, count)
        # An async burst under fixed names, synchronized in reverse.
        vs = [torch.full((k + 1,), float(r * k)) for k in range(6)]
        hs = [hvd.allreduce_async_(v, name=f"burst.{k}", op=hvd.Sum) for k, v in enumerate(vs)]
        for h in reversed(hs):
            hvd.synchronize(h)
        for k, v in enumerate(vs):
            assert torch.equal(v, torch.full((k + 1,), float(k * n * (n - 1) // 2))), (i, k)
        # A bundle, and a name whose shape changes from round to round.
        g = [torch.full((3,), float(r)), torch.full((5,), 1.0)]
        hvd.grouped_allreduce_(g, name=f"g.{i % 3}", op=hvd.Sum)
        assert g[0].tolist() == [float(n * (n - 1) // 2)] * 3 and g[1].tolist() == [float(n)] * 5
        shaped = hvd.allreduce(torch.ones(i % 4 + 1), name="reshaped", op=hvd.Sum)
        assert shaped.tolist() == [float(n)] * (i % 4 + 1), i
        if r in members:
            got = hvd.allreduce(torch.full((2,), float(r + 1)), name=f"pair.{i}", op=hvd.Sum,
                                process_set=pair)
            assert got.tolist() == [float(sum(m + 1 for m in members))] * 2, i
        if i % 40 == 7:  # every rank fails the op; the next ones must not notice
            try:
                hvd.allreduce(torch.ones(r + 1), name=f"mismatch.{i}", op=hvd.Sum)
            except ValueError as e:
                errors.append(str(e).split("\n")[0])
    hvd.barrier()
    hvd.shutdown()
    return errors


@pytest.mark.parametrize("nranks", [2, 3])
def test_reused_entries_carry_nothing_of_their_last_op(nranks):
    results = run_ranks(_churn, nranks, timeout=180)
    for errors in results:
        assert len(errors) == 3, errors
        assert all("mismatched shapes" in e for e in errors), errors
