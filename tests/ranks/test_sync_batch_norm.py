"""hvd.SyncBatchNorm on 1, 2 and 3 real rank processes, checked against
torch.nn.BatchNorm on the concatenated batch.

Every case draws one global batch per step (deterministic in case and step);
rank r takes its own, differently sized, slice of it. The ranks train a
SyncBatchNorm for a few steps with the loss (y * g).sum() (g a fixed random
tensor of the global shape), and return their outputs, gradients, running
statistics and an eval-mode output; the test process runs torch.nn.BatchNorm
on the whole batch and compares. The loss is a sum over the global batch, so
the reference input gradient is the concatenation of the ranks' gradients and
the reference weight/bias gradients are the sums of the ranks' local ones
(which the optimizer's allreduce would combine). One run_ranks launch per rank
count (_launch), as in test_allreduce.py.
"""

import zlib

import pytest
import torch

from dist_harness import launch_once

TIMEOUT = 120
NRANKS = [1, 2, 3]
STEPS = 3


def _cases():
    """case id -> spec. `batches` gives rank r's batch size as batches[r % len]."""
    specs = [
        dict(spatial=(), channels=4),  # (N, C)
        dict(spatial=(7,), channels=3, momentum=None),  # (N, C, L), cumulative average
        dict(spatial=(3, 4), channels=5),  # (N, C, H, W)
        dict(spatial=(3, 4), channels=2, channels_last=True),
        dict(spatial=(2, 2, 3), channels=2),  # (N, C, D, H, W)
        dict(spatial=(5,), channels=3, affine=False),
        dict(spatial=(), channels=3, track=False),
        dict(spatial=(4,), channels=3, momentum=0.5, batches=(4, 0, 3)),  # an empty rank
        # float32 with |mean| >> std: sums of squares would cancel; Chan's formula does not.
        dict(spatial=(4, 4), channels=3, dtype=torch.float32, offset=1000.0),
    ]
    defaults = dict(affine=True, track=True, momentum=0.1, channels_last=False,
                    dtype=torch.float64, batches=(3, 5, 2), offset=0.0)
    return {i: {**defaults, **spec} for i, spec in enumerate(specs)}


def _batch_sizes(spec, nranks):
    b = spec["batches"]
    return [b[r % len(b)] for r in range(nranks)]


def _gen(*seed):
    """A generator seeded the same in every process (str hashes are salted)."""
    return torch.Generator().manual_seed(zlib.crc32(repr(seed).encode()))


def _global_input(case, spec, step, nranks, eval_batch=False):
    n = sum(_batch_sizes(spec, nranks)) if not eval_batch else 4
    g = _gen(case, step, nranks, eval_batch)
    shape = (n, spec["channels"]) + spec["spatial"]
    scale = torch.rand(spec["channels"], generator=g, dtype=torch.float64) * 3 + 0.5
    shift = torch.randn(spec["channels"], generator=g, dtype=torch.float64) * 2
    view = [1, -1] + [1] * len(spec["spatial"])
    x = torch.randn(shape, generator=g, dtype=torch.float64) * scale.view(view)
    return (x + shift.view(view) + spec["offset"]).to(spec["dtype"])


def _global_weights(case, step, shape, dtype):
    """The fixed random g of the loss (y * g).sum() for one step."""
    return torch.randn(shape, generator=_gen("g", case, step), dtype=torch.float64).to(dtype)


def _init_state(case, spec):
    g = _gen("init", case)
    c = spec["channels"]
    return {
        "weight": 1 + 0.3 * torch.randn(c, generator=g, dtype=torch.float64),
        "bias": 0.3 * torch.randn(c, generator=g, dtype=torch.float64),
        "running_mean": torch.randn(c, generator=g, dtype=torch.float64),
        "running_var": 0.5 + torch.rand(c, generator=g, dtype=torch.float64),
    }


def _load_state(bn, state):
    with torch.no_grad():
        for name, value in state.items():
            if getattr(bn, name, None) is not None:
                getattr(bn, name).copy_(value)


def _rows(spec, nranks, rank):
    sizes = _batch_sizes(spec, nranks)
    start = sum(sizes[:rank])
    return slice(start, start + sizes[rank])


# ---------------------------------------------------------------- rank side


def _run_case(hvd, case, spec):
    rank, nranks = hvd.rank(), hvd.size()
    bn = hvd.SyncBatchNorm(spec["channels"], momentum=spec["momentum"], affine=spec["affine"],
                           track_running_stats=spec["track"]).to(spec["dtype"])
    _load_state(bn, _init_state(case, spec))
    out = {"steps": []}
    for step in range(STEPS):
        full = _global_input(case, spec, step, nranks)
        x = full[_rows(spec, nranks, rank)].clone()
        if spec["channels_last"]:
            x = x.contiguous(memory_format=torch.channels_last)
        x.requires_grad_()
        y = bn(x)
        g = _global_weights(case, step, full.shape, spec["dtype"])[_rows(spec, nranks, rank)]
        (y * g).sum().backward()
        out["steps"].append({
            "y": y.detach(),
            "x.grad": x.grad,
            "weight.grad": None if bn.weight is None else bn.weight.grad.clone(),
            "bias.grad": None if bn.bias is None else bn.bias.grad.clone(),
            "y.channels_last": y.is_contiguous(memory_format=torch.channels_last),
        })
        bn.zero_grad()
    out["running_mean"] = bn.running_mean
    out["running_var"] = bn.running_var
    out["num_batches_tracked"] = bn.num_batches_tracked
    bn.eval()
    out["eval"] = bn(_global_input(case, spec, 0, nranks, eval_batch=True))
    return out


def _model(hvd_module):
    torch.manual_seed(7)
    layers = [
        torch.nn.Linear(5, 4), torch.nn.BatchNorm1d(4), torch.nn.Tanh(),
        torch.nn.Linear(4, 3), torch.nn.BatchNorm1d(3, momentum=None),
    ]
    model = torch.nn.Sequential(*layers).double()
    if hvd_module is not None:
        model = hvd_module.SyncBatchNorm.convert_sync_batchnorm(model)
    return model


def _model_case(hvd):
    """Two SyncBatchNorm layers in one graph, the input needing no gradient."""
    rank, nranks = hvd.rank(), hvd.size()
    model = _model(hvd)
    types = [type(m).__name__ for m in model]
    sizes = [2 + r for r in range(nranks)]
    rows = slice(sum(sizes[:rank]), sum(sizes[: rank + 1]))
    x = torch.randn(sum(sizes), 5, generator=_gen("model"), dtype=torch.float64)[rows]
    g = torch.randn(sum(sizes), 3, generator=_gen("model.g"), dtype=torch.float64)[rows]
    y = model(x)
    (y * g).sum().backward()
    grads = {name: p.grad for name, p in model.named_parameters()}
    buffers = {name: b.clone() for name, b in model.named_buffers()}
    return {"types": types, "y": y.detach(), "grads": grads, "buffers": buffers}


def _conv_model():
    torch.manual_seed(11)
    return torch.nn.Sequential(
        torch.nn.Conv2d(2, 3, 3), torch.nn.BatchNorm2d(3), torch.nn.ReLU(), torch.nn.Flatten(),
        torch.nn.Linear(3 * 4 * 4, 2), torch.nn.BatchNorm1d(2),
    ).double()


def _conv_data(step, total):
    x = torch.randn(total, 2, 6, 6, generator=_gen("conv.x", step), dtype=torch.float64)
    g = torch.randn(total, 2, generator=_gen("conv.g", step), dtype=torch.float64)
    return x, g


def _optimizer_case(hvd):
    """Training with hvd.DistributedOptimizer (op=Sum, so the step uses the
    gradient of the global loss): SyncBatchNorm's own allreduces run while the
    optimizer's gradient allreduces are in flight."""
    rank, nranks = hvd.rank(), hvd.size()
    sizes = [3 + 2 * r for r in range(nranks)]
    rows = slice(sum(sizes[:rank]), sum(sizes[: rank + 1]))
    model = hvd.SyncBatchNorm.convert_sync_batchnorm(_conv_model())
    opt = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9),
                                   named_parameters=model.named_parameters(), op=hvd.Sum)
    for step in range(3):
        x, g = _conv_data(step, sum(sizes))
        opt.zero_grad()
        (model(x[rows]) * g[rows]).sum().backward()
        opt.step()
    return model.state_dict()


def _function_checks():
    """On 1 rank: gradcheck of the autograd Function, and float16/bfloat16
    inputs with float32 parameters (statistics in float32) against torch."""
    from hvd_torch.sync_batch_norm import _SyncBatchNormFunction as fn

    g = _gen("function")
    x = torch.randn(5, 3, 4, generator=g, dtype=torch.float64, requires_grad=True)
    w = (1 + torch.rand(3, generator=g, dtype=torch.float64)).requires_grad_()
    b = torch.randn(3, generator=g, dtype=torch.float64, requires_grad=True)
    out = {
        "gradcheck": torch.autograd.gradcheck(lambda x, w, b: fn.apply(x, w, b, None, None,
                                                                       1e-5, 0.1), (x, w, b)),
        "gradcheck.no_affine": torch.autograd.gradcheck(
            lambda x: fn.apply(x, None, None, None, None, 1e-5, 0.1), (x,)),
    }
    for dtype in (torch.float16, torch.bfloat16):
        x = (torch.randn(6, 3, 5, generator=g) * 2 + 1).to(dtype)
        w, b = torch.rand(3, generator=g) + 0.5, torch.randn(3, generator=g)
        rm, rv = torch.zeros(3), torch.ones(3)
        y = fn.apply(x, w, b, rm, rv, 1e-5, 0.1)
        rm_ref, rv_ref = torch.zeros(3), torch.ones(3)
        ref = torch.nn.functional.batch_norm(x.float(), rm_ref, rv_ref, w, b, True, 0.1, 1e-5)
        out[str(dtype)] = (y, ref, rm, rm_ref, rv, rv_ref)
    return out


def _rank_main():
    import hvd_torch as hvd

    torch.set_num_threads(1)
    hvd.init()
    rank, nranks = hvd.rank(), hvd.size()
    out = {"cases": {case: _run_case(hvd, case, spec) for case, spec in _cases().items()}}
    out["model"] = _model_case(hvd)
    if nranks > 1:
        try:  # DistributedOptimizer is another module's: a failure there fails one test only
            out["optimizer"] = _optimizer_case(hvd)
        except Exception as e:  # noqa: BLE001
            out["optimizer"] = e

    # Eval mode does not communicate: rank 0 alone evaluates, then all ranks
    # still agree on the next collective.
    bn = hvd.SyncBatchNorm(3).double()
    if rank == 0:
        bn.eval()
        bn(torch.randn(4, 3, dtype=torch.float64))
        bn.train()
    out["after_eval"] = hvd.allreduce(torch.ones(1), name="after_eval", op=hvd.Sum).item()

    # One value per channel over all ranks: every rank raises (none hangs).
    x = torch.randn(1 if rank == 0 else 0, 3, dtype=torch.float64)
    try:
        bn(x)
        out["too_small"] = None
    except ValueError as e:
        out["too_small"] = str(e)
    try:
        bn(torch.randn(3))
        out["1d"] = None
    except ValueError as e:
        out["1d"] = str(e)
    out["after_errors"] = hvd.allreduce(torch.ones(1), name="after_errors", op=hvd.Sum).item()
    if nranks == 1:  # the module falls back to torch here: check the Function itself
        out["function"] = _function_checks()
    hvd.shutdown()
    return out


def _launch(nranks):
    """One launch per rank count, shared by every test below."""
    return launch_once(_rank_main, nranks, timeout=TIMEOUT)


# ---------------------------------------------------------------- reference


def _reference(case, spec, nranks):
    """torch.nn.BatchNorm on the concatenated batch, the same steps."""
    dim = 2 + len(spec["spatial"])
    cls = {2: torch.nn.BatchNorm1d, 3: torch.nn.BatchNorm1d, 4: torch.nn.BatchNorm2d,
           5: torch.nn.BatchNorm3d}[dim]
    bn = cls(spec["channels"], momentum=spec["momentum"], affine=spec["affine"],
             track_running_stats=spec["track"]).double()
    _load_state(bn, _init_state(case, spec))
    steps = []
    for step in range(STEPS):
        # float64 reference, also for float32 cases (their inputs are exact in float64).
        x = _global_input(case, spec, step, nranks).double().requires_grad_()
        y = bn(x)
        (y * _global_weights(case, step, x.shape, spec["dtype"]).double()).sum().backward()
        steps.append({
            "y": y.detach(), "x.grad": x.grad,
            "weight.grad": None if bn.weight is None else bn.weight.grad.clone(),
            "bias.grad": None if bn.bias is None else bn.bias.grad.clone(),
        })
        bn.zero_grad()
    bn.eval()
    # Eval is local: rank r's eval output is the reference on its own input.
    eval_out = bn(_global_input(case, spec, 0, nranks, eval_batch=True).double())
    return steps, bn, eval_out


def _close(actual, expected, spec, what, scale=1.0):
    assert actual is not None and expected is not None, what
    if spec["dtype"] == torch.float64:
        tol = dict(rtol=1e-9, atol=1e-9 * scale)
    else:
        tol = dict(rtol=2e-4, atol=2e-4 * scale)
    torch.testing.assert_close(actual.double(), expected.double(), **tol,
                               msg=lambda m: f"{what}: {m}")


# ---------------------------------------------------------------- tests


@pytest.mark.parametrize("nranks", NRANKS)
def test_matches_batch_norm_on_the_concatenated_batch(nranks):
    results = _launch(nranks)
    for case, spec in _cases().items():
        ref_steps, ref_bn, ref_eval = _reference(case, spec, nranks)
        for rank, res in enumerate(results):
            got = res["cases"][case]
            rows = _rows(spec, nranks, rank)
            for step in range(STEPS):
                what = f"rank {rank} of {nranks}, case {case} {spec}, step {step}"
                mine, ref = got["steps"][step], ref_steps[step]
                _close(mine["y"], ref["y"][rows], spec, f"{what}: output")
                _close(mine["x.grad"], ref["x.grad"][rows], spec, f"{what}: input grad")
                if spec["channels_last"]:
                    assert mine["y.channels_last"], f"{what}: output lost channels_last"
            # Parameter gradients are sums over the global batch: atol scales with its size.
            n = sum(_batch_sizes(spec, nranks)) * max(1, torch.Size(spec["spatial"]).numel())
            for name in ("weight.grad", "bias.grad"):
                for step in range(STEPS):
                    what = f"case {case} {spec}, step {step}, {name} summed over ranks"
                    local = [r["cases"][case]["steps"][step][name] for r in results]
                    if not spec["affine"]:
                        assert all(t is None for t in local), what
                        continue
                    _close(torch.stack(local).sum(0), ref_steps[step][name], spec, what, scale=n)
            what = f"rank {rank} of {nranks}, case {case} {spec}"
            if spec["track"]:
                _close(got["running_mean"], ref_bn.running_mean, spec, f"{what}: running_mean")
                _close(got["running_var"], ref_bn.running_var, spec, f"{what}: running_var")
                assert got["num_batches_tracked"].item() == STEPS, what
            else:
                assert got["running_mean"] is None and got["running_var"] is None, what
            # The eval batch is the same on every rank, so is the output.
            _close(got["eval"], ref_eval, spec, f"{what}: eval output")


@pytest.mark.parametrize("nranks", [2, 3])
def test_every_rank_gets_identical_statistics(nranks):
    results = _launch(nranks)
    for case, spec in _cases().items():
        if not spec["track"]:
            continue
        first = results[0]["cases"][case]
        for rank, res in enumerate(results[1:], 1):
            for name in ("running_mean", "running_var"):
                assert torch.equal(res["cases"][case][name], first[name]), (
                    f"case {case}: rank {rank}'s {name} differs from rank 0's")


@pytest.mark.parametrize("nranks", NRANKS)
def test_model_with_two_layers_and_convert(nranks):
    results = _launch(nranks)
    sizes = [2 + r for r in range(nranks)]
    model = _model(None)
    x = torch.randn(sum(sizes), 5, generator=_gen("model"), dtype=torch.float64)
    g = torch.randn(sum(sizes), 3, generator=_gen("model.g"), dtype=torch.float64)
    y = model(x)
    (y * g).sum().backward()
    spec = {"dtype": torch.float64}
    results = [res["model"] for res in results]
    for rank, res in enumerate(results):
        assert res["types"] == ["Linear", "SyncBatchNorm", "Tanh", "Linear", "SyncBatchNorm"]
        rows = slice(sum(sizes[:rank]), sum(sizes[: rank + 1]))
        _close(res["y"], y[rows].detach(), spec, f"rank {rank}: model output")
        for name, b in model.named_buffers():
            if b.dtype.is_floating_point:
                _close(res["buffers"][name], b, spec, f"rank {rank}: buffer {name}")
            else:
                assert torch.equal(res["buffers"][name], b), f"rank {rank}: buffer {name}"
    for name, p in model.named_parameters():
        summed = torch.stack([res["grads"][name] for res in results]).sum(0)
        _close(summed, p.grad, spec, f"{nranks} ranks: grad of {name} summed over ranks")


@pytest.mark.parametrize("nranks", NRANKS)
def test_eval_is_local_and_errors_reach_every_rank(nranks):
    for rank, res in enumerate(_launch(nranks)):
        assert res["after_eval"] == nranks
        assert res["after_errors"] == nranks
        assert res["too_small"] is not None, f"rank {rank}: one value per channel was accepted"
        assert "more than 1 value per channel" in res["too_small"], res["too_small"]
        assert res["1d"] is not None and "expected at least 2D input" in res["1d"]


@pytest.mark.parametrize("nranks", [2, 3])
def test_training_with_distributed_optimizer(nranks):
    results = _launch(nranks)
    sizes = [3 + 2 * r for r in range(nranks)]
    model = _conv_model()
    opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    for step in range(3):
        x, g = _conv_data(step, sum(sizes))
        opt.zero_grad()
        (model(x) * g).sum().backward()
        opt.step()
    spec = {"dtype": torch.float64}
    for rank, res in enumerate(results):
        state = res["optimizer"]
        if isinstance(state, Exception):
            raise AssertionError(f"rank {rank}: training failed") from state
        for name, ref in model.state_dict().items():
            if ref.dtype.is_floating_point:
                _close(state[name], ref, spec, f"rank {rank} of {nranks}: {name}")
            else:
                assert torch.equal(state[name], ref), f"rank {rank}: {name}"


def test_autograd_function_on_one_rank():
    res = _launch(1)[0]["function"]
    assert res["gradcheck"] and res["gradcheck.no_affine"]
    for dtype in (torch.float16, torch.bfloat16):
        y, ref, rm, rm_ref, rv, rv_ref = res[str(dtype)]
        assert y.dtype == dtype
        # One rounding of the output to the 16-bit format; statistics in float32.
        torch.testing.assert_close(y.float(), ref, rtol=torch.finfo(dtype).eps, atol=1e-2)
        torch.testing.assert_close(rm, rm_ref)
        torch.testing.assert_close(rv, rv_ref)


@pytest.mark.unit
def test_convert_keeps_parameters_and_buffers():
    import hvd_torch as hvd

    model = torch.nn.Sequential(torch.nn.Conv2d(1, 2, 1), torch.nn.BatchNorm2d(2))
    model[1].running_mean.fill_(3.0)
    weight = model[1].weight
    converted = hvd.SyncBatchNorm.convert_sync_batchnorm(model)
    assert isinstance(converted[1], hvd.SyncBatchNorm)
    assert converted[1].weight is weight
    assert torch.equal(converted[1].running_mean, torch.full((2,), 3.0))
    # Not initialised: plain batch norm, no communication.
    x = torch.randn(4, 2, 3, 3)
    torch.testing.assert_close(converted[1](x), torch.nn.functional.batch_norm(
        x, torch.full((2,), 3.0), torch.ones(2), weight, converted[1].bias, training=True))
