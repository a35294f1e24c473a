"""DistributedOptimizer.synchronize() / skip_synchronize() / step() as in
Horovod, on 2 and 3 ranks:

- step() after a manual synchronize() without skip_synchronize() warns with
  Horovod's words;
- with skip_synchronize(), or without a manual synchronize(), no warning;
- on purpose unlike Horovod, that step() does not reduce the gradients a
  second time (Horovod does, which doubles them with op=Sum): shown with
  op=Sum, where the two behaviours give different numbers.
"""

import warnings

import pytest
import torch

from dist_harness import launch_once

WARNING = ("optimizer.step() called without optimizer.skip_synchronize() context after "
           "optimizer.synchronize().")


def _one_step(hvd, how):
    model = torch.nn.Linear(1, 1, bias=False)
    torch.nn.init.zeros_(model.weight)
    opt = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=1.0),
                                   named_parameters=model.named_parameters(), op=hvd.Sum)
    model(torch.full((1, 1), float(hvd.rank() + 1))).sum().backward()  # grad = rank + 1
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        if how == "plain":
            opt.step()
        elif how == "manual":
            opt.synchronize()
            opt.step()
        else:
            opt.synchronize()
            with opt.skip_synchronize():
                opt.step()
    messages = [str(w.message) for w in caught if WARNING in str(w.message)]
    return {"warnings": messages, "weight": model.weight.item()}


def _rank_main():
    import hvd_torch as hvd

    torch.set_num_threads(1)
    hvd.init()
    out = {how: _one_step(hvd, how) for how in ("plain", "manual", "skip")}
    hvd.shutdown()
    return out


@pytest.mark.parametrize("nranks", [2, 3])
def test_step_after_manual_synchronize_warns_and_reduces_once(nranks):
    summed = float(sum(r + 1 for r in range(nranks)))  # the Sum of the gradients
    for rank, out in enumerate(launch_once(_rank_main, nranks, timeout=90)):
        assert len(out["manual"]["warnings"]) == 1, (rank, out)
        assert "skip_synchronize() context if you use optimizer.synchronize()" in (
            out["manual"]["warnings"][0])
        assert out["plain"]["warnings"] == [] and out["skip"]["warnings"] == [], (rank, out)
        for how in ("plain", "manual", "skip"):
            # SGD, lr 1, from 0: weight = -(Sum of gradients), reduced once.
            # (Horovod's "manual" would give -nranks * summed: reduced twice.)
            assert out[how]["weight"] == -summed, (rank, how, out[how])
