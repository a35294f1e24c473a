"""DistributedOptimizer built before hvd.init(), on 2 and 3 ranks.

The Ray pattern: the model and optimizer are built in an actor's constructor and
hvd.init() runs later.  The gradient hooks then go on at the first step() after
init() (that step reduces its gradients itself), so every rank ends with the same
weights as when the optimizer is built after init().  A step() with init() never
called raises instead of training each rank alone in silence.
"""

import pytest
import torch

from dist_harness import launch_once

STEPS = 3


def _model():
    torch.manual_seed(7)
    return torch.nn.Sequential(torch.nn.Linear(4, 3), torch.nn.Tanh(), torch.nn.Linear(3, 1))


def _train(hvd, model, opt, rank, passes=1):
    for step in range(STEPS):
        for p in range(passes):
            x = torch.full((2, 4), float(rank + 1 + step + p))  # each rank its own data
            (model(x).pow(2).mean() / passes).backward()
        opt.step()
        opt.zero_grad()
    return [p.detach().clone() for p in model.parameters()]


def _rank_main():
    import hvd_torch as hvd

    torch.set_num_threads(1)
    res = {}
    # Built before init(), as in a Ray actor's constructor.
    early = _model()
    early_opt = hvd.DistributedOptimizer(torch.optim.SGD(early.parameters(), lr=0.1,
                                                         momentum=0.9),
                                         named_parameters=early.named_parameters())
    passes = _model()
    passes_opt = hvd.DistributedOptimizer(torch.optim.SGD(passes.parameters(), lr=0.1),
                                          named_parameters=passes.named_parameters(),
                                          backward_passes_per_step=2)
    adasum = _model()
    adasum_opt = hvd.DistributedOptimizer(torch.optim.SGD(adasum.parameters(), lr=0.1),
                                          op=hvd.Adasum)
    # A step before init() is refused, and changes nothing.
    before = [p.detach().clone() for p in early.parameters()]
    early(torch.ones(2, 4)).sum().backward()
    for what, fn in [("step", early_opt.step), ("synchronize", early_opt.synchronize),
                     ("adasum.step", adasum_opt.step)]:
        try:
            fn()
            res[what] = None
        except ValueError as e:
            res[what] = str(e)
    res["unchanged"] = all(torch.equal(a, b) for a, b in zip(before, early.parameters()))
    res["hooks_before_init"] = len(early_opt._hook_handles)
    early_opt.zero_grad()

    hvd.init()
    r = hvd.rank()
    late = _model()
    late_opt = hvd.DistributedOptimizer(torch.optim.SGD(late.parameters(), lr=0.1, momentum=0.9),
                                        named_parameters=late.named_parameters())
    res["early"] = _train(hvd, early, early_opt, r)
    res["hooks_after_step"] = len(early_opt._hook_handles)
    res["late"] = _train(hvd, late, late_opt, r)
    res["passes"] = _train(hvd, passes, passes_opt, r, passes=2)
    res["adasum"] = _train(hvd, adasum, adasum_opt, r)
    hvd.shutdown()
    return res


@pytest.mark.parametrize("nranks", [2, 3])
def test_built_before_init_trains_in_sync(nranks):
    results = launch_once(_rank_main, nranks, timeout=120)
    for rank, res in enumerate(results):
        for kind in ("early", "passes", "adasum"):
            # The same weights on every rank: the gradients (updates) were combined.
            for a, b in zip(res[kind], results[0][kind]):
                assert torch.equal(a, b), (rank, kind)
        # And the same weights as an optimizer built after init().
        for a, b in zip(res["early"], res["late"]):
            assert torch.allclose(a, b, rtol=1e-6, atol=1e-7), (rank, a, b)
        assert res["hooks_before_init"] == 0
        assert res["hooks_after_step"] == 4  # two weights, two biases: overlap from then on


@pytest.mark.parametrize("nranks", [2, 3])
def test_step_without_init_raises(nranks):
    for rank, res in enumerate(launch_once(_rank_main, nranks, timeout=120)):
        for what in ("step", "synchronize", "adasum.step"):
            message = res[what]
            assert message is not None, f"rank {rank}: {what}() before init() did not raise"
            assert "before hvd_torch.init()" in message and "alone" in message, (what, message)
        assert res["unchanged"], rank
