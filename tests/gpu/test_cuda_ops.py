"""Every op on CUDA tensors, on a machine with a GPU (skipped without one).

One GPU means: 1 rank moves CUDA tensors through NCCL, and 2 or 3 ranks share
the GPU through the host-staged Gloo plane (hvd_torch/gpu.py picks it because
the ranks share a physical GPU). Each rank runs every case twice, on the GPU
and on the CPU with the same inputs; the CPU path is checked against plain
PyTorch by the other test files, so the GPU result must equal it bit for bit.
"""

import pytest
import torch

from dist_harness import run_ranks

CUDA = torch.cuda.is_available()
pytestmark = pytest.mark.skipif(not CUDA, reason="needs a CUDA GPU")

AVERAGE, SUM, MIN, MAX, PRODUCT = 0, 1, 3, 4, 5
TIMEOUT = 300
FLOAT_NAMES = ["float16", "bfloat16", "float32", "float64"]
INT_NAMES = ["uint8", "int8", "int16", "int32", "int64"]


def _input(rank, dtype, shape, seed):
    g = torch.Generator().manual_seed(seed * 7919 + rank)
    if dtype == torch.bool:
        return torch.randint(0, 2, shape, generator=g).bool()
    lo, hi = (0, 3) if dtype == torch.uint8 else (-2, 3)
    return torch.randint(lo, hi, shape, generator=g).to(dtype)


def _compare(failures, what, gpu, cpu):
    if isinstance(gpu, (list, tuple)):
        for i, (g, c) in enumerate(zip(gpu, cpu)):
            _compare(failures, f"{what}[{i}]", g, c)
        return
    if not gpu.is_cuda and gpu.numel() > 0 and what.split()[0] != "alltoall-splits":
        failures.append(f"{what}: result on {gpu.device}, expected cuda")
    if gpu.shape != cpu.shape or not torch.equal(gpu.cpu(), cpu):
        failures.append(f"{what}: gpu {gpu.cpu().tolist()[:6]} != cpu {cpu.tolist()[:6]}")


def _every_op(expected_plane):
    """Runs each op on cuda and cpu copies of the same inputs; returns mismatches."""
    import hvd_torch as hvd
    from hvd_torch import gpu

    hvd.init()
    torch.cuda.set_device(hvd.local_rank() % torch.cuda.device_count())
    failures = []
    if gpu.plane() != expected_plane:
        failures.append(f"plane {gpu.plane()}, expected {expected_plane}")
    r, n = hvd.rank(), hvd.size()
    dev = torch.device("cuda", torch.cuda.current_device())
    names = FLOAT_NAMES + INT_NAMES + ["bool"]
    for seed, dname in enumerate(names):
        dtype = getattr(torch, dname)
        for size in (5, 70_000):  # inline-sized and Gloo/NCCL-sized
            x = _input(r, dtype, (size,), seed)
            ops = [SUM, MAX, MIN] if dtype == torch.bool else [AVERAGE, SUM, MIN, MAX, PRODUCT]
            for op in ops:
                tag = f"{dname}.{size}.{op}"
                kw = dict(op=op)
                if dtype not in (torch.bool,) and op in (SUM, AVERAGE) and dname != "uint8":
                    kw.update(prescale_factor=2.0, postscale_factor=0.5)
                _compare(failures, f"allreduce {tag}",
                         hvd.allreduce(x.to(dev), name=f"g.ar.{tag}", **kw),
                         hvd.allreduce(x, name=f"c.ar.{tag}", **kw))
            y = x.to(dev)
            hvd.allreduce_(y, name=f"g.ari.{dname}.{size}", op=SUM if dtype == torch.bool else MAX)
            _compare(failures, f"allreduce_ {dname}.{size}", y,
                     hvd.allreduce(x, name=f"c.ari.{dname}.{size}",
                                   op=SUM if dtype == torch.bool else MAX))
        rows = _input(r, dtype, (r + 1, 3), seed + 100)  # uneven first dimensions
        _compare(failures, f"allgather {dname}", hvd.allgather(rows.to(dev), name=f"g.ag.{dname}"),
                 hvd.allgather(rows, name=f"c.ag.{dname}"))
        b = _input(r, dtype, (4, 2), seed + 200)
        _compare(failures, f"broadcast {dname}",
                 hvd.broadcast(b.to(dev), root_rank=n - 1, name=f"g.bc.{dname}"),
                 hvd.broadcast(b, root_rank=n - 1, name=f"c.bc.{dname}"))
        splits = torch.tensor([(r + d) % 3 for d in range(n)], dtype=torch.int32)
        a = _input(r, dtype, (int(splits.sum()), 2), seed + 300)
        got, got_splits = hvd.alltoall(a.to(dev), splits=splits, name=f"g.a2a.{dname}")
        want, want_splits = hvd.alltoall(a, splits=splits, name=f"c.a2a.{dname}")
        _compare(failures, f"alltoall {dname}", got, want)
        _compare(failures, f"alltoall-splits {dname}", got_splits, want_splits)
        if dtype != torch.bool:
            rs = _input(r, dtype, (2 * n + 1, 3), seed + 400)
            _compare(failures, f"reducescatter {dname}",
                     hvd.reducescatter(rs.to(dev), op=SUM, name=f"g.rs.{dname}"),
                     hvd.reducescatter(rs, op=SUM, name=f"c.rs.{dname}"))
    # Fusion: many async ops in flight at once, then grouped forms.
    xs = [_input(r, torch.float32, (1000 + i,), 500 + i) for i in range(20)]
    handles = [hvd.allreduce_async(x.to(dev), name=f"g.fuse.{i}", op=SUM)
               for i, x in enumerate(xs)]
    _compare(failures, "fused async", [hvd.synchronize(h) for h in handles],
             [hvd.allreduce(x, name=f"c.fuse.{i}", op=SUM) for i, x in enumerate(xs)])
    _compare(failures, "grouped_allreduce",
             hvd.grouped_allreduce([x.to(dev) for x in xs[:5]], name="g.grp", op=SUM),
             hvd.grouped_allreduce(xs[:5], name="c.grp", op=SUM))
    _compare(failures, "grouped_allgather",
             hvd.grouped_allgather([x.to(dev) for x in xs[:3]], name="g.grpag"),
             hvd.grouped_allgather(xs[:3], name="c.grpag"))
    _compare(failures, "grouped_reducescatter",
             hvd.grouped_reducescatter([x.to(dev) for x in xs[:3]], name="g.grprs", op=SUM),
             hvd.grouped_reducescatter(xs[:3], name="c.grprs", op=SUM))
    hvd.barrier()
    hvd.shutdown()
    return failures


@pytest.mark.parametrize("nranks,plane", [(1, "nccl"), (2, "gloo"), (3, "gloo")])
def test_every_op_matches_the_cpu_path(nranks, plane):
    results = run_ranks(_every_op, nranks, args=(plane,), timeout=TIMEOUT)
    assert results == [[]] * nranks, results


def _stream_ordering():
    """A slow kernel writes the input on a side stream; the op must see its result."""
    import hvd_torch as hvd

    hvd.init()
    torch.cuda.set_device(0)
    side = torch.cuda.Stream()
    out = []
    for i in range(3):
        with torch.cuda.stream(side):
            x = torch.zeros(1 << 20, device="cuda")
            torch.cuda._sleep(50_000_000)  # ~tens of ms of GPU time before the write
            x.fill_(hvd.rank() + 1.0)
            y = hvd.allreduce(x, op=SUM, name=f"order.{i}")
            # Queued on `side` after the allreduce: must read its result.
            total = y.sum()
        torch.cuda.synchronize()
        out.append(total.item())
    hvd.shutdown()
    return out


@pytest.mark.parametrize("nranks", [1, 2])
def test_op_waits_for_the_producer_on_the_callers_stream(nranks):
    expected = float(sum(range(1, nranks + 1)) * (1 << 20))
    assert run_ranks(_stream_ordering, nranks, timeout=TIMEOUT) == [[expected] * 3] * nranks


def _mixed_devices():
    import hvd_torch as hvd

    hvd.init()
    x = torch.ones(4, device="cuda") if hvd.rank() == 1 else torch.ones(4)
    try:
        hvd.allreduce(x, name="mixed")
        message = ""
    except Exception as e:  # noqa: BLE001 - the test reads the message
        message = str(e)
    hvd.shutdown()
    return message


def test_cpu_and_cuda_under_one_name_is_a_clear_error_on_every_rank():
    messages = run_ranks(_mixed_devices, 2, timeout=TIMEOUT)
    for m in messages:
        assert "mismatched devices" in m and "rank 0 cpu" in m and "rank 1 cuda:0" in m, m


def _wrong_device():
    import hvd_torch as hvd
    from hvd_torch import _C

    hvd.init()
    _C.configure_gpu(1, False)  # pretend this rank's GPU is cuda:1
    try:
        hvd.allreduce(torch.ones(2, device="cuda:0"), name="wrong")
        message = ""
    except Exception as e:  # noqa: BLE001
        message = str(e)
    hvd.shutdown()
    return message


def test_tensor_on_another_gpu_is_a_clear_error():
    (message,) = run_ranks(_wrong_device, 1, timeout=TIMEOUT)
    assert "cuda:0" in message and "this rank's GPU is cuda:1" in message, message


def _train(steps, batch):
    """DistributedOptimizer on a CUDA model; returns the final weights (CPU)."""
    import hvd_torch as hvd

    hvd.init()
    torch.cuda.set_device(0)
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.Tanh(),
                                torch.nn.Linear(16, 1)).double().cuda()
    opt = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9),
                                   named_parameters=model.named_parameters())
    hvd.broadcast_parameters(model.state_dict(), root_rank=0)
    for step in range(steps):
        g = torch.Generator().manual_seed(step)
        x = torch.randn(batch * hvd.size(), 8, generator=g, dtype=torch.float64)
        mine = x[hvd.rank() * batch:(hvd.rank() + 1) * batch].cuda()
        opt.zero_grad()
        model(mine).pow(2).mean().backward()
        opt.step()
    weights = [p.detach().cpu() for p in model.parameters()]
    hvd.shutdown()
    return weights


@pytest.mark.parametrize("nranks", [1, 2])
def test_cuda_training_matches_single_process_training(nranks):
    steps, batch = 5, 4
    results = run_ranks(_train, nranks, args=(steps, batch), timeout=TIMEOUT)
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.Tanh(),
                                torch.nn.Linear(16, 1)).double().cuda()
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    for step in range(steps):
        g = torch.Generator().manual_seed(step)
        x = torch.randn(batch * nranks, 8, generator=g, dtype=torch.float64).cuda()
        opt.zero_grad()
        model(x).pow(2).mean().backward()
        opt.step()
    want = [p.detach().cpu() for p in model.parameters()]
    for rank_weights in results:
        for got, ref in zip(rank_weights, want):
            torch.testing.assert_close(got, ref, rtol=1e-10, atol=1e-12)


def _compiled_and_scripted():
    import hvd_torch as hvd

    hvd.init()

    @torch.jit.script
    def scripted(x: torch.Tensor) -> torch.Tensor:
        return torch.ops.hvd_torch.allreduce(x, "scripted", 1)

    def plain(x):
        return hvd.allreduce(x * 2, name="compiled", op=hvd.Sum) + 1

    compiled = torch.compile(plain)
    x = torch.full((3,), float(hvd.rank() + 1), device="cuda")
    a = scripted(x).cpu().tolist()
    b = compiled(x).cpu().tolist()
    hvd.shutdown()
    return a, b


def test_torchscript_and_torch_compile_on_cuda():
    (a, b), = run_ranks(_compiled_and_scripted, 1, timeout=TIMEOUT)
    assert a == [1.0] * 3 and b == [3.0] * 3
