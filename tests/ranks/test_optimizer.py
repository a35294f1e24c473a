"""DistributedOptimizer on 2 and 3 real rank processes, checked against
single-process training in the test process.

The proof: k ranks, each taking rows [r*B:(r+1)*B] of a fixed global batch of
k*B rows, train through DistributedOptimizer to the same weights, step after
step, as one process training on the whole k*B batch from the same initial
weights (float64, so the tolerance is tight), and every rank holds bit-identical
weights after every step.

One run_ranks launch per rank count, shared by the tests (_launch): each rank
trains every scenario and returns per-step weight snapshots and what it saw;
the references are computed here.
"""

import warnings

import pytest
import torch

from dist_harness import launch_once

TIMEOUT = 120
NRANKS = [2, 3]
B = 4  # rows per rank
STEPS = 4
IN, HID, OUT = 5, 7, 3
TIGHT = dict(rtol=1e-9, atol=1e-11)  # float64: only summation order differs


# ---------------------------------------------------------------- shared by ranks and references


class MLP(torch.nn.Module):
    def __init__(self, dtype=torch.float64):
        super().__init__()
        self.fc1 = torch.nn.Linear(IN, HID, dtype=dtype)
        self.fc2 = torch.nn.Linear(HID, OUT, dtype=dtype)
        g = torch.Generator().manual_seed(1234)
        with torch.no_grad():
            for p in self.parameters():
                p.copy_(torch.randn(p.shape, generator=g, dtype=torch.float64) * 0.5)

    def forward(self, x):
        return self.fc2(torch.tanh(self.fc1(x)))


class Branchy(torch.nn.Module):
    """fc_b joins in only when asked: a parameter that some ranks skip."""

    def __init__(self):
        super().__init__()
        self.fc_a = torch.nn.Linear(IN, OUT, dtype=torch.float64)
        self.fc_b = torch.nn.Linear(IN, OUT, dtype=torch.float64)
        g = torch.Generator().manual_seed(99)
        with torch.no_grad():
            for p in self.parameters():
                p.copy_(torch.randn(p.shape, generator=g, dtype=torch.float64) * 0.5)

    def forward(self, x, use_b: bool):
        y = self.fc_a(x)
        return y + self.fc_b(x) if use_b else y


class Embedder(torch.nn.Module):
    def __init__(self, sparse):
        super().__init__()
        self.emb = torch.nn.Embedding(10, 4, sparse=sparse, dtype=torch.float64)
        self.fc = torch.nn.Linear(4, OUT, dtype=torch.float64)
        g = torch.Generator().manual_seed(7)
        with torch.no_grad():
            for p in self.parameters():
                p.copy_(torch.randn(p.shape, generator=g, dtype=torch.float64) * 0.5)

    def forward(self, idx):
        return self.fc(self.emb(idx))


def _batch(nranks, step, seed, dtype=torch.float64):
    """The global batch of step `step`: (x, y) with nranks * B rows."""
    g = torch.Generator().manual_seed(seed * 1000 + step)
    x = torch.randn(nranks * B, IN, generator=g, dtype=torch.float64).to(dtype)
    y = torch.randn(nranks * B, OUT, generator=g, dtype=torch.float64).to(dtype)
    return x, y


def _index_batch(nranks, step):
    g = torch.Generator().manual_seed(5000 + step)
    idx = torch.randint(0, 10, (nranks * B,), generator=g)
    y = torch.randn(nranks * B, OUT, generator=g, dtype=torch.float64)
    return idx, y


def _loss(out, y):
    return ((out - y) ** 2).mean()


def _uses_b(rank, step):
    """Who runs fc_b: step 0 only rank 0, step 1 nobody, step 2 everyone,
    step 3 everyone but rank 0."""
    return [rank == 0, False, True, rank != 0][step]


def _snapshot(model):
    return [p.detach().clone() for p in model.parameters()]


OPTIMIZERS = {
    "sgd": lambda params: torch.optim.SGD(params, lr=0.1, momentum=0.9),
    "adam": lambda params: torch.optim.Adam(params, lr=0.05),
    "plain_sgd": lambda params: torch.optim.SGD(params, lr=0.2),
}

# name -> (optimizer, model dtype, DistributedOptimizer keyword arguments)
SCENARIOS = {
    # First: its loss allreduces are the process's first unnamed ops, so the
    # engine names them allreduce.noname.0, .1, ... while its gradients are in flight.
    "adam_unnamed": ("adam", torch.float64, {"named_parameters": None}),
    "sgd": ("sgd", torch.float64, {}),
    "predivide": ("sgd", torch.float64, {"gradient_predivide_factor": 4.0}),
    "groups_int": ("sgd", torch.float64, {"groups": 2}),
    "fp16": ("sgd", torch.float32, {"compression": "fp16"}),
}


# ---------------------------------------------------------------- rank side


def _train(hvd, scenario, seed):
    """Trains MLP on this rank's shard; per-step snapshots."""
    opt_name, dtype, kwargs = SCENARIOS[scenario]
    kwargs = dict(kwargs)
    model = MLP(dtype)
    if kwargs.get("compression") == "fp16":
        kwargs["compression"] = hvd.Compression.fp16
    if "named_parameters" not in kwargs:
        kwargs["named_parameters"] = model.named_parameters()
    opt = hvd.DistributedOptimizer(OPTIMIZERS[opt_name](model.parameters()), **kwargs)
    rank, size = hvd.rank(), hvd.size()
    snaps, extra = [], {}
    for step in range(STEPS):
        x, y = _batch(size, step, seed, dtype)
        x, y = x[rank * B:(rank + 1) * B], y[rank * B:(rank + 1) * B]
        opt.zero_grad()
        if step == 0:
            # Communication overlaps backward: by the time autograd computes the
            # gradient of the input (the very last thing it does), fc2's
            # allreduces have been started.
            x = x.clone().requires_grad_()
            seen = []
            x.register_hook(lambda g: seen.append(
                [type(opt._handles.get(p)).__name__ for p in model.fc2.parameters()]))
        loss = _loss(model(x), y)
        loss.backward()
        if step == 0:
            extra["in_flight_during_backward"] = seen[0]
        # An unnamed allreduce while the gradients' allreduces are in flight (averaging
        # the loss for logging): its engine name must not clash with theirs.
        extra.setdefault("losses", []).append(hvd.allreduce(loss.detach()).item())
        opt.step()
        snaps.append(_snapshot(model))
    extra["reduction"] = opt._reduction()
    extra["groups"] = [[opt._parameter_names[p] for p in g] for g in opt._groups]
    return snaps, extra


def _train_scripted(hvd):
    """A torch.jit.script'ed model: the hooks fire on its parameters too."""
    model = torch.jit.script(MLP())
    opt = hvd.DistributedOptimizer(OPTIMIZERS["sgd"](model.parameters()),
                                   named_parameters=model.named_parameters())
    rank, size = hvd.rank(), hvd.size()
    snaps, submitted = [], []
    for step in range(STEPS):
        x, y = _batch(size, step, 11)
        opt.zero_grad()
        _loss(model(x[rank * B:(rank + 1) * B]), y[rank * B:(rank + 1) * B]).backward()
        # Started by the hooks during backward, not by step()'s fallback.
        submitted.append([type(opt._handles.get(p)).__name__ for p in model.parameters()])
        opt.step()
        snaps.append(_snapshot(model))
    return snaps, submitted


def _train_two_passes(hvd):
    """backward_passes_per_step=2: each rank's shard in two halves, loss / 2 each."""
    model = MLP()
    opt = hvd.DistributedOptimizer(OPTIMIZERS["sgd"](model.parameters()),
                                   named_parameters=model.named_parameters(),
                                   backward_passes_per_step=2)
    rank, size = hvd.rank(), hvd.size()
    snaps, after_pass = [], []
    for step in range(STEPS):
        x, y = _batch(size, step, 12)
        x, y = x[rank * B:(rank + 1) * B], y[rank * B:(rank + 1) * B]
        opt.zero_grad()
        for half in (slice(0, B // 2), slice(B // 2, B)):
            (_loss(model(x[half]), y[half]) / 2).backward()
            # Nothing may leave after the first pass; everything after the second.
            after_pass.append(sorted({type(w).__name__ for w in opt._handles.values()}))
        opt.step()
        snaps.append(_snapshot(model))
    return snaps, after_pass


def _train_clipped(hvd, max_norm):
    """Horovod's clipping recipe: synchronize, clip, step under skip_synchronize."""
    model = MLP()
    opt = hvd.DistributedOptimizer(OPTIMIZERS["sgd"](model.parameters()),
                                   named_parameters=model.named_parameters())
    rank, size = hvd.rank(), hvd.size()
    snaps = []
    for step in range(STEPS):
        x, y = _batch(size, step, 13)
        opt.zero_grad()
        _loss(model(x[rank * B:(rank + 1) * B]), y[rank * B:(rank + 1) * B]).backward()
        opt.synchronize()
        torch.nn.utils.clip_grad_norm_(model.parameters(), max_norm)
        with opt.skip_synchronize():
            opt.step()
        snaps.append(_snapshot(model))
    return snaps


def _train_branchy(hvd):
    """fc_b gets no gradient on some ranks (or on none): nobody may hang."""
    model = Branchy()
    opt = hvd.DistributedOptimizer(OPTIMIZERS["sgd"](model.parameters()),
                                   named_parameters=model.named_parameters())
    rank, size = hvd.rank(), hvd.size()
    snaps, grads = [], []
    for step in range(STEPS):
        x, y = _batch(size, step, 14)
        opt.zero_grad(set_to_none=True)
        _loss(model(x[rank * B:(rank + 1) * B], _uses_b(rank, step)),
              y[rank * B:(rank + 1) * B]).backward()
        opt.synchronize()
        grads.append([None if p.grad is None else p.grad.clone() for p in model.parameters()])
        with opt.skip_synchronize():
            opt.step()
        snaps.append(_snapshot(model))
    return snaps, grads


def _train_sparse(hvd):
    model = Embedder(sparse=True)
    opt = hvd.DistributedOptimizer(OPTIMIZERS["plain_sgd"](model.parameters()),
                                   named_parameters=model.named_parameters(),
                                   sparse_as_dense=True)
    rank, size = hvd.rank(), hvd.size()
    snaps, layouts = [], []
    for step in range(STEPS):
        idx, y = _index_batch(size, step)
        opt.zero_grad()
        _loss(model(idx[rank * B:(rank + 1) * B]), y[rank * B:(rank + 1) * B]).backward()
        opt.synchronize()
        layouts.append(model.emb.weight.grad.is_sparse)
        with opt.skip_synchronize():
            opt.step()
        snaps.append(_snapshot(model))
    return snaps, layouts


def _error(fn):
    try:
        fn()
    except Exception as e:  # noqa: BLE001  (the test checks type and message)
        return f"{type(e).__name__}: {e}"
    return None


def _misc(hvd):
    """zero_grad rules, the wrapper's identity, and the argument errors."""
    res = {}
    rank, size = hvd.rank(), hvd.size()
    x, y = _batch(size, 0, 15)
    x, y = x[rank * B:(rank + 1) * B], y[rank * B:(rank + 1) * B]

    # The wrapper is the optimizer's class, keeps its defaults and state, and
    # works with an LR scheduler.
    model = MLP()
    base = torch.optim.SGD(model.parameters(), lr=0.3, momentum=0.5)
    _loss(model(x), y).backward()
    base.step()  # local state before wrapping
    momentum = [base.state[p]["momentum_buffer"].clone() for p in model.parameters()]
    opt = hvd.DistributedOptimizer(base, named_parameters=model.named_parameters())
    res["identity"] = (isinstance(opt, torch.optim.SGD), type(opt).__name__,
                       opt.defaults["lr"], opt.defaults["momentum"],
                       all(torch.equal(opt.state[p]["momentum_buffer"], m)
                           for p, m in zip(model.parameters(), momentum)))
    sched = torch.optim.lr_scheduler.StepLR(opt, step_size=1, gamma=0.5)

    # zero_grad with allreduces pending is refused; set_to_none=True/False work.
    opt.zero_grad(set_to_none=True)
    res["none_after_zero_grad"] = all(p.grad is None for p in model.parameters())
    _loss(model(x), y).backward()
    res["zero_grad_pending"] = _error(opt.zero_grad)
    opt.step()
    sched.step()
    res["lr_after_sched"] = opt.param_groups[0]["lr"]
    opt.zero_grad(set_to_none=False)
    res["zeros_after_zero_grad"] = all(
        p.grad is not None and not p.grad.any() for p in model.parameters())

    # A second backward without step(): Horovod's error, raised from backward.
    _loss(model(x), y).backward()
    res["too_many_passes"] = _error(lambda: _loss(model(x), y).backward())
    opt.synchronize()  # completes the first pass's allreduces
    opt.zero_grad()

    # step() right after synchronize() reduces nothing twice (op=Sum shows it).
    model_sum = MLP()
    opt_sum = hvd.DistributedOptimizer(torch.optim.SGD(model_sum.parameters(), lr=0.0),
                                       named_parameters=model_sum.named_parameters(), op=hvd.Sum)
    _loss(model_sum(x), y).backward()
    opt_sum.synchronize()
    once = [p.grad.clone() for p in model_sum.parameters()]
    opt_sum.step()
    res["sum_reduced_once"] = all(torch.equal(a, p.grad)
                                  for a, p in zip(once, model_sum.parameters()))

    # load_state_dict on the wrapper.
    saved = opt.state_dict()
    opt.load_state_dict(saved)
    res["load_state_dict"] = opt.state_dict()["param_groups"] == saved["param_groups"]

    # add_param_group() after wrapping: the new parameters are averaged too.
    grow = MLP()
    opt_grow = hvd.DistributedOptimizer(torch.optim.SGD(grow.fc1.parameters(), lr=0.1),
                                        named_parameters=grow.named_parameters())
    opt_grow.add_param_group({"params": list(grow.fc2.parameters()), "lr": 0.2})
    _loss(grow(x), y).backward()
    res["added_group"] = ([opt_grow._parameter_names[p] for p in grow.fc2.parameters()],
                          [type(opt_grow._handles.get(p)).__name__ for p in grow.fc2.parameters()])
    opt_grow.step()

    # step(closure): the closure's gradients are averaged before the update.
    cmodel = MLP()
    copt = hvd.DistributedOptimizer(torch.optim.SGD(cmodel.parameters(), lr=0.1),
                                    named_parameters=cmodel.named_parameters())

    def closure():
        copt.zero_grad()
        loss = _loss(cmodel(x), y)
        loss.backward()
        return loss

    closure_loss = copt.step(closure)
    res["closure"] = (float(closure_loss.detach()), copt._handles == {},
                      [p.grad.clone() for p in cmodel.parameters()])

    # A sparse gradient with an op sparse allreduce cannot do: a clear error, on every rank.
    emb = Embedder(sparse=True)
    opt_sparse = hvd.DistributedOptimizer(torch.optim.SGD(emb.emb.parameters(), lr=0.1),
                                          named_parameters=emb.emb.named_parameters(),
                                          op=hvd.Max)
    res["sparse_refused"] = _error(
        lambda: emb.emb(torch.tensor([1, 2])).sum().backward())
    res["sparse_nothing_pending"] = opt_sparse._handles == {}

    # Argument errors: raised on the calling rank, nothing sent.
    fresh = MLP()
    named = list(fresh.named_parameters())

    def wrap(**kwargs):
        return hvd.DistributedOptimizer(torch.optim.SGD(fresh.parameters(), lr=0.1), **kwargs)

    res["errors"] = {
        "duplicate": _error(lambda: wrap(named_parameters=[("w", p) for _, p in named])),
        "not_covering": _error(lambda: wrap(named_parameters=named[:-1])),
        "not_tuples": _error(lambda: wrap(named_parameters=[p for _, p in named])),
        "adasum": _error(lambda: wrap(op=hvd.Adasum, gradient_predivide_factor=2.0)),
        "predivide_sum": _error(lambda: wrap(op=hvd.Sum, gradient_predivide_factor=2.0)),
        "passes": _error(lambda: wrap(backward_passes_per_step=0)),
        "twice": _error(lambda: hvd.DistributedOptimizer(opt)),
        "groups_foreign": _error(lambda: wrap(groups=[[torch.zeros(2, requires_grad=True)]])),
    }
    short = hvd.DistributedOptimizer(torch.optim.SGD(fresh.fc1.parameters(), lr=0.1),
                                     named_parameters=fresh.fc1.named_parameters())
    res["errors"]["add_unnamed"] = _error(
        lambda: short.add_param_group({"params": [fresh.fc2.weight]}))
    res["add_unnamed_groups"] = len(short.param_groups)

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        grouped = wrap(num_groups=2, named_parameters=named)
    res["num_groups"] = ([w.category.__name__ for w in caught],
                         [[grouped._parameter_names[p] for p in g] for g in grouped._groups])
    listed = wrap(groups=[[fresh.fc2.weight, fresh.fc2.bias]], named_parameters=named)
    res["groups_list"] = [[listed._parameter_names[p] for p in g] for g in listed._groups]
    return res


def _rank_main():
    import hvd_torch as hvd

    torch.set_num_threads(1)
    hvd.init()
    out = {name: _train(hvd, name, seed) for seed, name in enumerate(SCENARIOS)}
    out["scripted"] = _train_scripted(hvd)
    out["two_passes"] = _train_two_passes(hvd)
    out["clipped"] = _train_clipped(hvd, CLIP_NORM)
    out["branchy"] = _train_branchy(hvd)
    out["sparse"] = _train_sparse(hvd)
    out["misc"] = _misc(hvd)
    hvd.shutdown()
    return out


CLIP_NORM = 0.05


def _launch(nranks):
    """One launch per rank count, shared by every test below."""
    return launch_once(_rank_main, nranks, timeout=TIMEOUT)


# ---------------------------------------------------------------- references (test process)


def _reference(model, opt, nranks, seed, dtype=torch.float64, clip=None, forward=None):
    """Single-process training on the whole global batch; per-step snapshots."""
    snaps = []
    for step in range(STEPS):
        x, y = _batch(nranks, step, seed, dtype)
        opt.zero_grad()
        _loss(forward(x, step) if forward else model(x), y).backward()
        if clip is not None:
            norm = torch.nn.utils.clip_grad_norm_(model.parameters(), clip)
            assert norm > clip, "the clipping test must actually clip"
        opt.step()
        snaps.append(_snapshot(model))
    return snaps


def _assert_same_on_every_rank(per_rank_snaps, what):
    for rank, snaps in enumerate(per_rank_snaps[1:], start=1):
        for step, (mine, first) in enumerate(zip(snaps, per_rank_snaps[0])):
            for a, b in zip(mine, first):
                assert torch.equal(a, b), f"{what}: rank {rank} != rank 0 after step {step}"


def _assert_matches_reference(snaps, ref, what, **tol):
    for step, (mine, expected) in enumerate(zip(snaps, ref)):
        for i, (a, b) in enumerate(zip(mine, expected)):
            torch.testing.assert_close(
                a, b, **(tol or TIGHT), msg=lambda m: f"{what}, step {step}, parameter {i}: {m}")


# ---------------------------------------------------------------- tests


@pytest.mark.parametrize("nranks", NRANKS)
@pytest.mark.parametrize("scenario", list(SCENARIOS))
def test_training_equals_one_process_on_the_whole_batch(nranks, scenario):
    results = _launch(nranks)
    opt_name, dtype, _ = SCENARIOS[scenario]
    per_rank = [out[scenario][0] for out in results]
    _assert_same_on_every_rank(per_rank, scenario)
    model = MLP(dtype)
    ref = _reference(model, OPTIMIZERS[opt_name](model.parameters()), nranks,
                     list(SCENARIOS).index(scenario), dtype)
    tol = dict(rtol=2e-3, atol=2e-3) if scenario == "fp16" else {}
    _assert_matches_reference(per_rank[0], ref, f"{scenario} on {nranks} ranks", **tol)
    if scenario == "fp16":  # close, but the fp16 rounding must show
        assert any(not torch.equal(a, b) for a, b in zip(per_rank[0][-1], ref[-1]))


@pytest.mark.parametrize("nranks", NRANKS)
def test_allreduce_starts_during_backward(nranks):
    for out in _launch(nranks):
        assert out["sgd"][1]["in_flight_during_backward"] == ["_InFlight", "_InFlight"]


@pytest.mark.parametrize("nranks", NRANKS)
def test_unnamed_allreduce_between_backward_and_step(nranks):
    results = _launch(nranks)
    model = MLP()
    for step in range(STEPS):
        # Each rank's loss at the weights before the step, averaged.
        x, y = _batch(nranks, step, list(SCENARIOS).index("adam_unnamed"))
        if step:
            with torch.no_grad():
                for p, w in zip(model.parameters(), results[0]["adam_unnamed"][0][step - 1]):
                    p.copy_(w)
        with torch.no_grad():
            losses = [float(_loss(model(x[r * B:(r + 1) * B]), y[r * B:(r + 1) * B]))
                      for r in range(nranks)]
        for out in results:
            assert out["adam_unnamed"][1]["losses"][step] == pytest.approx(sum(losses) / nranks)


@pytest.mark.parametrize("nranks", NRANKS)
def test_gradient_predivide_factor(nranks):
    for out in _launch(nranks):
        # Horovod's split of Average: grad / f before the sum, * f / size after.
        assert out["predivide"][1]["reduction"] == (1, 1 / 4.0, 4.0 / nranks)
        assert out["sgd"][1]["reduction"] == (0, 1.0, 1.0)


@pytest.mark.parametrize("nranks", NRANKS)
def test_groups(nranks):
    for out in _launch(nranks):
        assert out["groups_int"][1]["groups"] == [["fc1.weight", "fc1.bias"],
                                                  ["fc2.weight", "fc2.bias"]]
        assert out["adam_unnamed"][1]["groups"] == []
        warned, groups = out["misc"]["num_groups"]
        assert "DeprecationWarning" in warned
        assert groups == [["fc1.weight", "fc1.bias"], ["fc2.weight", "fc2.bias"]]
        assert out["misc"]["groups_list"] == [["fc2.weight", "fc2.bias"]]


@pytest.mark.parametrize("nranks", NRANKS)
def test_scripted_model(nranks):
    results = _launch(nranks)
    per_rank = [out["scripted"][0] for out in results]
    _assert_same_on_every_rank(per_rank, "scripted")
    for out in results:  # the hooks fired inside the scripted module's backward
        assert out["scripted"][1] == [["_InFlight"] * 4] * STEPS
    model = MLP()
    ref = _reference(model, OPTIMIZERS["sgd"](model.parameters()), nranks, 11)
    _assert_matches_reference(per_rank[0], ref, f"scripted on {nranks} ranks")


@pytest.mark.parametrize("nranks", NRANKS)
def test_backward_passes_per_step(nranks):
    results = _launch(nranks)
    per_rank = [out["two_passes"][0] for out in results]
    _assert_same_on_every_rank(per_rank, "two passes")
    model = MLP()
    ref = _reference(model, OPTIMIZERS["sgd"](model.parameters()), nranks, 12)
    _assert_matches_reference(per_rank[0], ref, f"two half-batches on {nranks} ranks")
    for out in results:
        assert out["two_passes"][1] == [["NoneType"], ["_InFlight"]] * STEPS


@pytest.mark.parametrize("nranks", NRANKS)
def test_clip_with_skip_synchronize(nranks):
    per_rank = [out["clipped"] for out in _launch(nranks)]
    _assert_same_on_every_rank(per_rank, "clipped")
    model = MLP()
    ref = _reference(model, OPTIMIZERS["sgd"](model.parameters()), nranks, 13, clip=CLIP_NORM)
    _assert_matches_reference(per_rank[0], ref, f"clipped on {nranks} ranks")


@pytest.mark.parametrize("nranks", NRANKS)
def test_parameter_without_gradient_is_reduced_as_zero(nranks):
    results = _launch(nranks)
    per_rank = [out["branchy"][0] for out in results]
    _assert_same_on_every_rank(per_rank, "branchy")
    # Reference: each rank's own gradient (zeros where it skipped fc_b),
    # averaged, then the same SGD step.
    model = Branchy()
    opt = OPTIMIZERS["sgd"](model.parameters())
    for step in range(STEPS):
        x, y = _batch(nranks, step, 14)
        params = list(model.parameters())
        total = [torch.zeros_like(p) for p in params]
        for r in range(nranks):
            loss = _loss(model(x[r * B:(r + 1) * B], _uses_b(r, step)), y[r * B:(r + 1) * B])
            grads = torch.autograd.grad(loss, params, allow_unused=True)
            total = [t + (torch.zeros_like(p) if g is None else g)
                     for t, g, p in zip(total, grads, params)]
        for p, t in zip(params, total):
            p.grad = t / nranks
        for rank, out in enumerate(results):
            got = out["branchy"][1][step]
            for i, (g, p) in enumerate(zip(got, params)):
                assert g is not None, f"rank {rank} step {step}: p.grad is None after synchronize"
                torch.testing.assert_close(g, p.grad, **TIGHT,
                                           msg=lambda m: f"rank {rank} step {step} grad {i}: {m}")
        opt.step()
        _assert_matches_reference([per_rank[0][step]], [_snapshot(model)],
                                  f"branchy step {step} on {nranks} ranks")
    # Step 1 (nobody used fc_b): its gradient is zeros, not None, on every rank.
    for out in results:
        assert all(not g.any() for g in out["branchy"][1][1][2:])


@pytest.mark.parametrize("nranks", NRANKS)
def test_sparse_as_dense(nranks):
    results = _launch(nranks)
    per_rank = [out["sparse"][0] for out in results]
    _assert_same_on_every_rank(per_rank, "sparse")
    model = Embedder(sparse=True)
    opt = OPTIMIZERS["plain_sgd"](model.parameters())
    ref = []
    for step in range(STEPS):
        idx, y = _index_batch(nranks, step)
        opt.zero_grad()
        _loss(model(idx), y).backward()
        opt.step()
        ref.append(_snapshot(model))
    _assert_matches_reference(per_rank[0], ref, f"sparse_as_dense on {nranks} ranks")
    for out in results:
        assert out["sparse"][1] == [True] * STEPS  # handed back as a sparse gradient


@pytest.mark.parametrize("nranks", NRANKS)
def test_zero_grad_and_wrapper(nranks):
    for rank, out in enumerate(_launch(nranks)):
        res = out["misc"]
        assert res["identity"] == (True, "SGD", 0.3, 0.5, True)
        assert res["none_after_zero_grad"]
        assert res["zero_grad_pending"].startswith("AssertionError: optimizer.zero_grad() was "
                                                   "called after loss.backward()")
        assert res["lr_after_sched"] == 0.15
        assert res["zeros_after_zero_grad"]
        assert res["too_many_passes"].startswith("AssertionError: Gradients were computed more "
                                                 "than backward_passes_per_step times")
        assert res["sum_reduced_once"]
        assert res["load_state_dict"]
        assert res["added_group"] == (["fc2.weight", "fc2.bias"], ["_InFlight", "_InFlight"])
        x, y = _batch(nranks, 0, 15)
        closure_loss, nothing_pending, grads = res["closure"]
        with torch.no_grad():
            expected = float(_loss(MLP()(x[rank * B:(rank + 1) * B]), y[rank * B:(rank + 1) * B]))
        assert closure_loss == pytest.approx(expected)
        assert nothing_pending
        model = MLP()
        _loss(model(x), y).backward()
        for g, p in zip(grads, model.parameters()):
            torch.testing.assert_close(g, p.grad, **TIGHT)


@pytest.mark.parametrize("nranks", NRANKS)
def test_errors(nranks):
    for out in _launch(nranks):
        res = out["misc"]
        errors = res["errors"]
        assert errors["duplicate"].startswith("ValueError: Parameter names in named_parameters "
                                              "must be unique. Found duplicates: w")
        assert errors["not_covering"].startswith("ValueError: named_parameters was specified, "
                                                 "but one or more")
        assert "parameter #3 (shape [3])" in errors["not_covering"]
        assert errors["not_tuples"].startswith("ValueError: named_parameters should be a "
                                               "sequence of tuples")
        assert errors["adasum"].startswith("ValueError") and "op=Adasum" in errors["adasum"]
        assert errors["predivide_sum"] == ("ValueError: gradient_predivide_factor not "
                                           "supported with op != Average")
        assert errors["passes"].startswith("ValueError: backward_passes_per_step must be")
        assert errors["twice"].startswith("ValueError") and "already" in errors["twice"]
        assert errors["groups_foreign"].startswith("ValueError: groups:")
        assert res["sparse_refused"].startswith("ValueError") and "Average or Sum only" in (
            res["sparse_refused"]) and "'weight'" in res["sparse_refused"]
        assert res["sparse_nothing_pending"]
        assert errors["add_unnamed"].startswith("ValueError: named_parameters was specified")
        assert res["add_unnamed_groups"] == 1  # the refused group was taken back out
