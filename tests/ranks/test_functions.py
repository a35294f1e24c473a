"""broadcast_parameters, broadcast_optimizer_state, broadcast_object and
allgather_object on 2 and 3 real rank processes.

One run_ranks launch per rank count, shared by the tests (_launch). For the
optimizer state, the root trains a few steps, the other ranks have no state
(a fresh optimizer) or different state and hyperparameters; afterwards every
rank's state_dict() must equal the root's, and the root's must be exactly
what it was before the call: no dummy step (Horovod runs one, which moves
Adam's moments and step count).
"""

import copy

import pytest
import torch

from dist_harness import launch_once, run_ranks

TIMEOUT = 120
NRANKS = [2, 3]


def _model(seed):
    g = torch.Generator().manual_seed(seed)
    model = torch.nn.Sequential(torch.nn.Linear(4, 5), torch.nn.BatchNorm1d(5),
                                torch.nn.Linear(5, 2))
    with torch.no_grad():
        for p in model.parameters():
            p.copy_(torch.randn(p.shape, generator=g))
    return model


OPTIMIZERS = {
    "sgd": lambda params, lr: torch.optim.SGD(params, lr=lr),
    "sgd_momentum": lambda params, lr: torch.optim.SGD(params, lr=lr, momentum=0.9,
                                                       nesterov=True),
    "adam": lambda params, lr: torch.optim.Adam(params, lr=lr),
    "adamw": lambda params, lr: torch.optim.AdamW(params, lr=lr, amsgrad=True),
    "rmsprop": lambda params, lr: torch.optim.RMSprop(params, lr=lr, momentum=0.5,
                                                      centered=True),
    "adagrad": lambda params, lr: torch.optim.Adagrad(params, lr=lr),
}


def _local_steps(model, opt, n, seed):
    """n plain local steps (no communication)."""
    g = torch.Generator().manual_seed(seed)
    for _ in range(n):
        opt.zero_grad()
        model(torch.randn(6, 4, generator=g)).pow(2).mean().backward()
        opt.step()


def _the_objects(rank):
    """A nested object unique to `rank`; rank 1's is over 1 MiB (the Gloo path)."""
    return {
        "rank": rank,
        "list": [1, 2.5, None, ("tuple", b"bytes", {rank, -rank})],
        "nested": {"tensor": torch.arange(3) * rank, "deep": [[{"x": [rank] * rank}]]},
        "text": "y" * (rank * 1000 + (2_000_000 if rank == 1 else 0)),
    }


# ---------------------------------------------------------------- rank side


def _broadcast_parameters(hvd):
    rank, size = hvd.rank(), hvd.size()
    root = size - 1
    res = {}
    # state_dict (parameters and BatchNorm buffers) from the last rank.
    model = _model(seed=rank)
    model.train()
    model(torch.randn(8, 4, generator=torch.Generator().manual_seed(rank)))  # rank's own stats
    res["before"] = copy.deepcopy(model.state_dict())
    hvd.broadcast_parameters(model.state_dict(), root_rank=root)
    res["after"] = copy.deepcopy(model.state_dict())
    # named_parameters() (a generator) and parameters() (bare tensors) from rank 0;
    # parameters that require grad are written in place.
    other = _model(seed=10 + rank)
    hvd.broadcast_parameters(other.named_parameters(), root_rank=0)
    res["named"] = [p.detach().clone() for p in other.parameters()]
    third = _model(seed=20 + rank)
    hvd.broadcast_parameters(list(third.parameters()), root_rank=0)
    res["bare"] = [p.detach().clone() for p in third.parameters()]
    try:
        hvd.broadcast_parameters(torch.zeros(2), root_rank=0)
        res["bad_type"] = None
    except ValueError as e:
        res["bad_type"] = str(e)
    return res


def _is_fresh(rank, case):
    """Whether non-root `rank` starts case `case` with no optimizer state (else
    with state of its own); on 2 ranks the cases alternate between the two."""
    return (rank + case // 2) % 2 == 1


def _optimizer_state(hvd, kind, root, wrap, case):
    rank = hvd.rank()
    model = _model(seed=0)
    opt = OPTIMIZERS[kind](model.parameters(), lr=0.01 * (rank + 1))
    if rank == root:
        _local_steps(model, opt, 3, seed=100)
    elif not _is_fresh(rank, case):
        _local_steps(model, opt, 1, seed=200 + rank)  # different state
    if wrap:
        opt = hvd.DistributedOptimizer(opt, named_parameters=model.named_parameters())
    before = copy.deepcopy(opt.state_dict())
    hvd.broadcast_optimizer_state(opt, root_rank=root)
    after = copy.deepcopy(opt.state_dict())
    # The state every rank now has must be usable: the same model, the same
    # gradient, one more step each; all ranks must land on the same weights.
    # (With the wrapper, that step averages identical gradients over the ranks.)
    hvd.broadcast_parameters(model.state_dict(), root_rank=root)
    _local_steps(model, opt, 1, seed=300)
    return before, after, [p.detach().clone() for p in model.parameters()]


def _optimizer_state_mismatch(hvd):
    """A rank whose optimizer has another parameter count: every rank raises."""
    rank = hvd.rank()
    model = _model(seed=0)
    params = list(model.parameters()) + ([torch.zeros(3, requires_grad=True)] if rank == 1 else [])
    opt = torch.optim.Adam(params, lr=0.1)
    if rank == 0:
        _local_steps(model, opt, 2, seed=400)
    before = copy.deepcopy(opt.state_dict())
    try:
        hvd.broadcast_optimizer_state(opt, root_rank=0)
        error = None
    except ValueError as e:
        error = str(e)
    return error, before, copy.deepcopy(opt.state_dict())


def _objects(hvd):
    rank, size = hvd.rank(), hvd.size()
    root = size - 1
    res = {}
    res["broadcast"] = hvd.broadcast_object(_the_objects(root) if rank == root else None,
                                            root_rank=root)
    res["broadcast_named"] = hvd.broadcast_object(("small", rank), root_rank=0, name="tiny")
    res["broadcast_again"] = hvd.broadcast_object([rank] * (rank + 1), root_rank=1)
    res["allgather"] = hvd.allgather_object(_the_objects(rank))
    res["allgather_named"] = hvd.allgather_object(rank * 10, name="ints")
    return res


def _rank_main():
    import hvd_torch as hvd

    torch.set_num_threads(1)
    hvd.init()
    size = hvd.size()
    out = {"parameters": _broadcast_parameters(hvd), "objects": _objects(hvd)}
    out["optimizer"] = {
        kind: _optimizer_state(hvd, kind, root=i % size, wrap=False, case=i)
        for i, kind in enumerate(OPTIMIZERS)
    }
    out["optimizer_wrapped"] = _optimizer_state(hvd, "adam", root=size - 1, wrap=True,
                                                case=len(OPTIMIZERS))
    out["mismatch"] = _optimizer_state_mismatch(hvd)
    hvd.shutdown()
    return out


def _launch(nranks):
    """One launch per rank count, shared by every test below."""
    return launch_once(_rank_main, nranks, timeout=TIMEOUT)


# ---------------------------------------------------------------- checks


def _assert_identical(a, b, what):
    """Nested equality; tensors bit for bit, same dtype and shape."""
    if isinstance(a, torch.Tensor):
        assert isinstance(b, torch.Tensor), f"{what}: {type(b).__name__} is not a tensor"
        assert a.dtype == b.dtype and a.shape == b.shape, f"{what}: {a.dtype}{list(a.shape)} " \
                                                          f"vs {b.dtype}{list(b.shape)}"
        assert torch.equal(a, b), f"{what}: {a} != {b}"
    elif isinstance(a, dict):
        assert isinstance(b, dict) and list(a) == list(b), f"{what}: keys {list(a)} vs {list(b)}"
        for k in a:
            _assert_identical(a[k], b[k], f"{what}.{k}")
    elif isinstance(a, (list, tuple)):
        assert type(a) is type(b) and len(a) == len(b), f"{what}: {a!r} vs {b!r}"
        for i, (x, y) in enumerate(zip(a, b)):
            _assert_identical(x, y, f"{what}[{i}]")
    else:
        assert type(a) is type(b) and a == b, f"{what}: {a!r} vs {b!r}"


# ---------------------------------------------------------------- tests


@pytest.mark.parametrize("nranks", NRANKS)
def test_broadcast_parameters_from_a_non_zero_root(nranks):
    results = [out["parameters"] for out in _launch(nranks)]
    root = nranks - 1
    expected = results[root]["before"]
    assert not torch.equal(results[0]["before"]["0.weight"], expected["0.weight"])
    assert not torch.equal(results[0]["before"]["1.running_mean"], expected["1.running_mean"])
    for rank, res in enumerate(results):
        _assert_identical(res["after"], expected, f"rank {rank} state_dict")
        for key in ("named", "bare"):
            _assert_identical(res[key], results[0][key], f"rank {rank} {key}")
        assert res["bad_type"].startswith("invalid params of type")


@pytest.mark.parametrize("nranks", NRANKS)
@pytest.mark.parametrize("kind", list(OPTIMIZERS))
def test_broadcast_optimizer_state(nranks, kind):
    results = [out["optimizer"][kind] for out in _launch(nranks)]
    root = list(OPTIMIZERS).index(kind) % nranks
    root_before, root_after, _ = results[root]
    # The root's state is exactly what it was: no step ran.
    _assert_identical(root_after, root_before, f"{kind}: root's state_dict")
    if kind != "sgd":
        assert root_before["state"], f"{kind}: the root should have state after 3 steps"
    if kind in ("adam", "adamw"):
        for s in root_before["state"].values():
            assert float(s["step"]) == 3.0
    for rank, (before, after, weights) in enumerate(results):
        _assert_identical(after, root_before, f"{kind}: rank {rank}'s state_dict")
        if rank != root:
            assert before["param_groups"][0]["lr"] != root_before["param_groups"][0]["lr"]
            if _is_fresh(rank, list(OPTIMIZERS).index(kind)) or kind == "sgd":
                # (Adagrad creates its state, zeros at step 0, in its constructor.)
                assert all(float(st["step"]) == 0 for st in before["state"].values()), (
                    f"{kind}: rank {rank} should start without state")
            else:
                assert set(before["state"]) == set(root_before["state"])
        # One more identical step from the broadcast state: identical weights.
        _assert_identical(weights, results[root][2], f"{kind}: rank {rank} weights after a step")


@pytest.mark.parametrize("nranks", NRANKS)
def test_broadcast_optimizer_state_of_a_distributed_optimizer(nranks):
    results = [out["optimizer_wrapped"] for out in _launch(nranks)]
    root_before, root_after, _ = results[nranks - 1]
    _assert_identical(root_after, root_before, "wrapped Adam: root's state_dict")
    for rank, (_, after, _) in enumerate(results):
        _assert_identical(after, root_before, f"wrapped Adam: rank {rank}'s state_dict")


@pytest.mark.parametrize("nranks", NRANKS)
def test_broadcast_optimizer_state_mismatch_fails_everywhere(nranks):
    results = [out["mismatch"] for out in _launch(nranks)]
    for rank, (error, before, after) in enumerate(results):
        assert error is not None, f"rank {rank} did not raise"
        assert "rank 1 (parameters per group: root [6], here [7])" in error, error
        _assert_identical(after, before, f"rank {rank}: state changed although the call failed")


@pytest.mark.parametrize("nranks", NRANKS)
def test_broadcast_object(nranks):
    results = [out["objects"] for out in _launch(nranks)]
    for rank, res in enumerate(results):
        _assert_identical(res["broadcast"], _the_objects(nranks - 1), f"rank {rank} broadcast")
        assert res["broadcast_named"] == ("small", 0)
        assert res["broadcast_again"] == [1, 1]


@pytest.mark.parametrize("nranks", NRANKS)
def test_allgather_object(nranks):
    results = [out["objects"] for out in _launch(nranks)]
    for rank, res in enumerate(results):
        gathered = res["allgather"]
        assert len(gathered) == nranks
        for r, obj in enumerate(gathered):
            _assert_identical(obj, _the_objects(r), f"rank {rank}, object of rank {r}")
        assert res["allgather_named"] == [r * 10 for r in range(nranks)]


def _scheduler_built_before_wrapping():
    """Horovod scripts often build the LR scheduler on the plain optimizer and
    wrap it afterwards: the scheduler must still drive every rank's rate."""
    import hvd_torch as hvd

    hvd.init()
    torch.manual_seed(0)
    model = torch.nn.Linear(4, 1)
    opt = torch.optim.SGD(model.parameters(), lr=0.1 * (hvd.rank() + 1), momentum=0.9)
    sched = torch.optim.lr_scheduler.StepLR(opt, step_size=1, gamma=0.5)
    opt = hvd.DistributedOptimizer(opt, named_parameters=model.named_parameters())
    hvd.broadcast_parameters(model.state_dict(), root_rank=0)
    hvd.broadcast_optimizer_state(opt, root_rank=0)
    rates = []
    for step in range(3):
        x = torch.full((2, 4), float(hvd.rank() + step))
        opt.zero_grad()
        model(x).pow(2).mean().backward()
        opt.step()
        sched.step()
        rates.append(opt.param_groups[0]["lr"])
    weights = [p.detach().clone() for p in model.parameters()]
    hvd.shutdown()
    return rates, weights


@pytest.mark.parametrize("nranks", [2, 3])
def test_scheduler_built_before_wrapping_drives_every_rank(nranks):
    results = run_ranks(_scheduler_built_before_wrapping, nranks, timeout=120)
    for rates, weights in results:
        assert rates == [0.05, 0.025, 0.0125], rates  # rank 0's 0.1, halved each step
        for got, want in zip(weights, results[0][1]):
            assert torch.equal(got, want)
