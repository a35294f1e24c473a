"""Training on the GPU (issue #10, item 4): state broadcast, compression, gradient
overlap, SyncBatchNorm and elastic TorchState with CUDA models.

One GPU means 1 rank runs through NCCL and 2 ranks share the GPU through the
host-staged Gloo plane. Every rank function takes the device it trains on; without
a GPU it is the CPU (tests/harness/gpu_device.py), which checks the tests themselves
on every run (the CPU path is proven by the other test files).
"""

import pytest
import torch

from dist_harness import run_ranks
from gpu_device import DEVICE, needs_device

pytestmark = needs_device
TIMEOUT = 300
RANKS = [1, 2]


def _init(device):
    import hvd_torch as hvd

    hvd.init()
    if device == "cuda":
        torch.cuda.set_device(hvd.local_rank() % torch.cuda.device_count())
    return hvd


def _cpu(tensors):
    """Host copies (clone: .cpu() of a CPU tensor is the tensor itself)."""
    return [t.detach().cpu().clone() for t in tensors]


class _Net(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.fc1 = torch.nn.Linear(6, 8)
        self.bn = torch.nn.BatchNorm1d(8)
        self.fc2 = torch.nn.Linear(8, 2)

    def forward(self, x):
        return self.fc2(torch.tanh(self.bn(self.fc1(x))))


# ------------------------------------------------ broadcast_parameters / _optimizer_state


def _broadcast_state(device):
    """Ranks start apart (own seed, own Adam step); the broadcasts make them rank 0's."""
    hvd = _init(device)
    torch.manual_seed(100 + hvd.rank())
    model = _Net().to(device)
    opt = torch.optim.Adam(model.parameters(), lr=0.01)
    model(torch.randn(5, 6, device=device)).sum().backward()
    opt.step()
    hvd.broadcast_parameters(model.state_dict(), root_rank=0)
    hvd.broadcast_optimizer_state(opt, root_rank=0)
    state = opt.state_dict()["state"]
    moments = [state[i][k] for i in sorted(state) for k in ("exp_avg", "exp_avg_sq")]
    devices = sorted({t.device.type for t in [*model.state_dict().values(), *moments]
                      if t.is_floating_point()})
    out = dict(model=_cpu(model.state_dict().values()), moments=_cpu(moments),
               steps=[float(state[i]["step"]) for i in sorted(state)], devices=devices)
    hvd.shutdown()
    return out


@pytest.mark.parametrize("nranks", RANKS)
def test_broadcast_parameters_and_optimizer_state_on_the_gpu(nranks):
    results = run_ranks(_broadcast_state, nranks, args=(DEVICE,), timeout=TIMEOUT)
    root = results[0]
    assert root["devices"] == [DEVICE], root["devices"]
    assert root["steps"] == [1.0] * 6
    for r, got in enumerate(results[1:], start=1):
        assert got["devices"] == [DEVICE], (r, got["devices"])
        assert got["steps"] == root["steps"]
        for a, b in zip(got["model"] + got["moments"], root["model"] + root["moments"]):
            assert torch.equal(a, b), f"rank {r} differs from rank 0 after the broadcasts"
    if nranks > 1:  # they started apart: the test would notice a broadcast that did nothing
        torch.manual_seed(101)
        assert not torch.equal(_Net().fc1.weight, root["model"][0])


# --------------------------------------- DistributedOptimizer: compression and overlap


def _compressed_training(device, compression):
    """Three steps of DistributedOptimizer with `compression` on `device`, then the same
    on the CPU; returns both runs' weights and gradients and what backward overlapped."""
    hvd = _init(device)
    runs = {}
    for where in (device, "cpu"):
        torch.manual_seed(0)
        model = torch.nn.Sequential(torch.nn.Linear(6, 8), torch.nn.Tanh(),
                                    torch.nn.Linear(8, 1)).to(where)
        # Each run its own names: the runs must not share negotiated entries.
        named = [(f"{where}.{n}", p) for n, p in model.named_parameters()]
        opt = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1),
                                       named_parameters=named,
                                       compression=getattr(hvd.Compression, compression))
        in_flight, grads = [], []
        for step in range(3):
            g = torch.Generator().manual_seed(step)
            x = torch.randn(4 * hvd.size(), 6, generator=g)[hvd.rank() * 4:][:4].to(where)
            opt.zero_grad()
            if step == 0:
                # The input's gradient comes last in backward; the last layer's
                # allreduces must have started by then (overlap).
                x.requires_grad_()
                x.register_hook(lambda _: in_flight.append(
                    [type(opt._handles.get(p)).__name__ for p in model[2].parameters()]))
            model(x).pow(2).mean().backward()
            opt.step()
            grads.append(_cpu(p.grad for p in model.parameters()))
        runs[where] = dict(weights=_cpu(model.parameters()), grads=grads,
                           in_flight=in_flight[0],
                           devices=sorted({p.grad.device.type for p in model.parameters()}))
    hvd.shutdown()
    return runs


@pytest.mark.parametrize("compression", ["fp16", "bf16"])
@pytest.mark.parametrize("nranks", RANKS)
def test_compressed_gradients_on_the_gpu_match_the_cpu_path(nranks, compression):
    wire = getattr(torch, {"fp16": "float16", "bf16": "bfloat16"}[compression])
    results = run_ranks(_compressed_training, nranks, args=(DEVICE, compression),
                        timeout=TIMEOUT)
    for r, runs in enumerate(results):
        gpu, cpu = runs[DEVICE], runs["cpu"]
        assert gpu["devices"] == [DEVICE], (r, gpu["devices"])
        assert "NoneType" not in gpu["in_flight"], (r, gpu["in_flight"])
        for step_grads in gpu["grads"]:
            for grad in step_grads:
                # Reduced in 16 bits: every averaged gradient is a 16-bit value.
                assert torch.equal(grad, grad.to(wire).float()), (r, compression, grad)
        # cuBLAS and the CPU round matmuls differently, and a gradient may then
        # round to the neighbouring 16-bit value: a few ulps of float16 apart.
        for a, b in zip(gpu["weights"], cpu["weights"]):
            torch.testing.assert_close(a, b, rtol=0, atol=2e-3)
        for a, b in zip(gpu["weights"], results[0][DEVICE]["weights"]):
            assert torch.equal(a, b), f"rank {r}'s weights differ from rank 0's"


# ------------------------------------------------------------------------ SyncBatchNorm


def _sync_batch_norm(device):
    """Rank r normalizes r + 2 samples; returns its output and gradients."""
    hvd = _init(device)
    bn = hvd.SyncBatchNorm(3).double().to(device)
    with torch.no_grad():
        bn.weight.copy_(torch.tensor([1.0, 2.0, -0.5]))
        bn.bias.copy_(torch.tensor([0.1, 0.0, 0.3]))
    g = torch.Generator().manual_seed(hvd.rank())
    x = (torch.randn(hvd.rank() + 2, 3, 4, generator=g, dtype=torch.float64) * 3 + 5)
    dy = torch.randn(x.shape, generator=g, dtype=torch.float64)
    x = x.to(device).requires_grad_()
    y = bn(x)
    y.backward(dy.to(device))
    out = dict(y=y.detach().cpu(), dx=x.grad.cpu(), dw=bn.weight.grad.cpu(),
               db=bn.bias.grad.cpu(), mean=bn.running_mean.cpu(), var=bn.running_var.cpu(),
               devices=sorted({t.device.type for t in (y, x.grad, bn.running_mean)}))
    hvd.shutdown()
    return out


@pytest.mark.parametrize("nranks", RANKS)
def test_sync_batch_norm_on_the_gpu_is_batch_norm_of_the_global_batch(nranks):
    results = run_ranks(_sync_batch_norm, nranks, args=(DEVICE,), timeout=TIMEOUT)
    xs, dys = [], []
    for r in range(nranks):
        g = torch.Generator().manual_seed(r)
        xs.append(torch.randn(r + 2, 3, 4, generator=g, dtype=torch.float64) * 3 + 5)
        dys.append(torch.randn(xs[-1].shape, generator=g, dtype=torch.float64))
    bn = torch.nn.BatchNorm1d(3).double()
    with torch.no_grad():
        bn.weight.copy_(torch.tensor([1.0, 2.0, -0.5]))
        bn.bias.copy_(torch.tensor([0.1, 0.0, 0.3]))
    x = torch.cat(xs).requires_grad_()
    y = bn(x)
    y.backward(torch.cat(dys))
    at = 0
    close = dict(rtol=1e-9, atol=1e-10)
    for r, got in enumerate(results):
        n = r + 2
        assert got["devices"] == [DEVICE], (r, got["devices"])
        torch.testing.assert_close(got["y"], y[at:at + n].detach(), **close)
        torch.testing.assert_close(got["dx"], x.grad[at:at + n], **close)
        torch.testing.assert_close(got["mean"], bn.running_mean, **close)
        torch.testing.assert_close(got["var"], bn.running_var, **close)
        at += n
    # Weight and bias gradients are each rank's own sums (the optimizer averages them).
    torch.testing.assert_close(sum(got["dw"] for got in results), bn.weight.grad, **close)
    torch.testing.assert_close(sum(got["db"] for got in results), bn.bias.grad, **close)


# --------------------------------------------------------------------- elastic TorchState


def _elastic_state(device):
    """commit, a step, restore, then sync: each leaves CUDA tensors on the GPU."""
    hvd = _init(device)
    torch.manual_seed(hvd.rank())  # ranks start apart; sync() must join them
    model = torch.nn.Linear(4, 3).to(device)
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)

    def step():
        opt.zero_grad()
        model(torch.ones(2, 4, device=device)).pow(2).sum().backward()
        opt.step()

    def snapshot():
        momentum = [opt.state[p]["momentum_buffer"] for p in model.parameters()]
        return dict(weights=_cpu(model.parameters()), momentum=_cpu(momentum),
                    devices=sorted({t.device.type for t in [*model.parameters(), *momentum]}))

    step()
    state = hvd.elastic.TorchState(model, opt, epoch=3)
    state.commit()
    committed = snapshot()
    step()
    state.epoch = 4
    moved = snapshot()
    state.restore()
    restored = snapshot()
    restored["epoch"] = state.epoch
    step()
    state.sync()
    synced = snapshot()
    hvd.shutdown()
    return dict(committed=committed, moved=moved, restored=restored, synced=synced)


@pytest.mark.parametrize("nranks", RANKS)
def test_elastic_torch_state_keeps_cuda_models_on_the_gpu(nranks):
    results = run_ranks(_elastic_state, nranks, args=(DEVICE,), timeout=TIMEOUT)
    root = results[0]["synced"]
    for r, got in enumerate(results):
        assert got["restored"].pop("epoch") == 3, r
        for what in ("committed", "restored", "synced"):
            assert got[what]["devices"] == [DEVICE], (r, what, got[what]["devices"])
        for a, b in zip(got["moved"]["weights"], got["committed"]["weights"]):
            assert not torch.equal(a, b), "the step after the commit changed nothing"
        for what in ("weights", "momentum"):
            for a, b in zip(got["restored"][what], got["committed"][what]):
                assert torch.equal(a, b), f"rank {r}: restore() did not bring back the {what}"
            for a, b in zip(got["synced"][what], root[what]):
                assert torch.equal(a, b), f"rank {r}: sync() did not give rank 0's {what}"
    if nranks > 1:
        a, b = results[0]["committed"]["weights"][0], results[1]["committed"]["weights"][0]
        assert not torch.equal(a, b), "the ranks did not start apart"
