"""The "hvd" torch.distributed backend next to CUDA (issue #31): one process
group whose CPU tensors go to hvd and whose CUDA tensors go to a CUDA backend
("cpu:hvd,cuda:nccl" on 1 rank: one GPU is one NCCL rank; "cpu:hvd,cuda:gloo"
on 2 ranks sharing the GPU), DDP of a CUDA model, and hvd.allreduce of CUDA
tensors through our own planes, all in one script; and "hvd" alone for both
devices, its CUDA tensors on the engine's NCCL plane (1 rank) or host-staged (2 and
3 ranks): every collective, stream order, futures, DDP with a comm hook. Without a GPU
the rank code runs on the CPU path (tests/harness/gpu_device.py).
"""

import datetime
import os

import pytest
import torch

from dist_harness import run_ranks
from gpu_device import DEVICE, needs_device

pytestmark = needs_device
TIMEOUT = 300


def _mixed(backend, path):
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel as DDP

    import hvd_torch as hvd

    hvd.init()
    r, n = hvd.rank(), hvd.size()
    dev = torch.device(DEVICE, 0) if DEVICE == "cuda" else torch.device("cpu")
    if DEVICE == "cuda":
        torch.cuda.set_device(0)
    dist.init_process_group(backend, init_method=f"file://{path}", rank=r, world_size=n,
                            timeout=datetime.timedelta(seconds=60))
    out = {}
    # CPU tensors: the hvd half of the group.
    t = torch.full((4,), float(r + 1))
    dist.all_reduce(t)
    out["cpu.all_reduce"] = t.tolist()
    g = torch.empty(n * 2)
    dist.all_gather_into_tensor(g, torch.full((2,), float(r)))
    out["cpu.all_gather"] = g.tolist()
    # CUDA tensors: the CUDA half of the group.
    c = torch.full((3,), float(r + 1), device=dev)
    dist.all_reduce(c)
    out["cuda.all_reduce"] = c.cpu().tolist()
    # DDP of a CUDA model over the group, and hvd's own CUDA path beside it.
    torch.manual_seed(0)
    model = DDP(torch.nn.Linear(5, 2).to(dev))
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    gen = torch.Generator().manual_seed(r)
    for _ in range(3):
        opt.zero_grad()
        model(torch.randn(4, 5, generator=gen).to(dev)).pow(2).mean().backward()
        opt.step()
    w = model.module.weight.detach()
    out["ddp.same_weights"] = bool(torch.equal(hvd.broadcast(w, 0, name="w0"), w))
    out["hvd.cuda_allreduce"] = hvd.allreduce(torch.full((2,), float(r), device=dev),
                                              op=hvd.Sum, name="hvd.cuda").cpu().tolist()
    dist.destroy_process_group()
    hvd.shutdown()
    return out


@pytest.mark.parametrize("nranks,backend", [(1, "cpu:hvd,cuda:nccl"), (2, "cpu:hvd,cuda:gloo")])
def test_hvd_for_cpu_tensors_beside_a_cuda_backend(nranks, backend, tmp_path):
    if DEVICE != "cuda":
        backend = "hvd"  # the CPU check of the test itself
    results = run_ranks(_mixed, nranks, args=(backend, str(tmp_path / "store")), timeout=TIMEOUT)
    s = float(sum(range(1, nranks + 1)))
    for res in results:
        assert res["cpu.all_reduce"] == [s] * 4
        assert res["cpu.all_gather"] == [float(q) for q in range(nranks) for _ in range(2)]
        assert res["cuda.all_reduce"] == [s] * 3
        assert res["ddp.same_weights"]
        assert res["hvd.cuda_allreduce"] == [float(sum(range(nranks)))] * 2


def _cuda_on_hvd(path):
    """Every c10d collective DDP and FSDP use, on CUDA tensors, with "hvd" for both
    devices: the engine's NCCL plane on 1 rank, its host-staged plane on 2 and 3."""
    import torch.distributed as dist
    from torch.distributed.algorithms.ddp_comm_hooks import default_hooks
    from torch.nn.parallel import DistributedDataParallel as DDP

    import hvd_torch as hvd
    from hvd_torch import gpu

    hvd.init()
    r, n = hvd.rank(), hvd.size()
    cuda = DEVICE == "cuda"
    if cuda:
        torch.cuda.set_device(0)
    dev = torch.device(DEVICE, 0) if cuda else torch.device("cpu")
    dist.init_process_group("hvd", init_method=f"file://{path}", rank=r, world_size=n,
                            timeout=datetime.timedelta(seconds=60))
    out = {"plane": gpu.plane()}
    for op in ("SUM", "AVG", "MAX"):
        t = torch.full((5,), float(r + 1), device=dev)
        dist.all_reduce(t, op=getattr(dist.ReduceOp, op))
        out[f"all_reduce.{op}"] = (t.device.type, t.cpu().tolist())
    b = torch.full((3,), float(r), device=dev)
    dist.broadcast(b, src=n - 1)
    out["broadcast"] = b.cpu().tolist()
    g = torch.empty(2 * n, device=dev)
    dist.all_gather_into_tensor(g, torch.full((2,), float(r), device=dev))
    out["all_gather_into_tensor"] = g.cpu().tolist()
    parts = [torch.empty(q + 1, device=dev) for q in range(n)]  # rank q sends q + 1 elements
    dist.all_gather(parts, torch.full((r + 1,), float(r), device=dev))
    out["all_gather"] = [p.cpu().tolist() for p in parts]
    rs = torch.empty(2, device=dev)
    dist.reduce_scatter_tensor(rs, torch.arange(2.0 * n, device=dev) * (r + 1))
    out["reduce_scatter_tensor"] = rs.cpu().tolist()
    # Rank r sends i + 1 rows to rank i, so it receives r + 1 rows from each.
    send = torch.cat([torch.full((i + 1, 2), float(100 * r + i), device=dev) for i in range(n)])
    recv = torch.empty((n * (r + 1), 2), device=dev)
    dist.all_to_all_single(recv, send, output_split_sizes=[r + 1] * n,
                           input_split_sizes=[i + 1 for i in range(n)])
    out["all_to_all_single"] = recv[:, 0].cpu().tolist()
    # Stream order: the input is produced late on a side stream, the op is issued
    # on it, and the result is read on it at once after wait().
    side = torch.cuda.Stream() if cuda else None
    x = torch.zeros(1 << 16, device=dev)
    if cuda:
        torch.cuda.synchronize()
        with torch.cuda.stream(side):
            torch.cuda._sleep(50_000_000)  # tens of ms: the producer is still running
            x.fill_(float(r + 1))
            work = dist.all_reduce(x, async_op=True)
            work.wait()
            y = x * 2
        torch.cuda.current_stream().wait_stream(side)
    else:
        x.fill_(float(r + 1))
        dist.all_reduce(x)
        y = x * 2
    out["stream_order"] = sorted(set(y.cpu().tolist()))
    # A future's callback sees the result (DDP's comm hooks chain such callbacks).
    f = dist.all_reduce(torch.full((2,), 1.0, device=dev), async_op=True).get_future()
    out["future_then"] = f.then(lambda fut: fut.value()[0] * 3).wait().cpu().tolist()
    # DDP of a CUDA model with fp16 gradient compression, on "hvd" alone.
    torch.manual_seed(0)
    model = torch.nn.Linear(5, 2).to(dev)
    reference = torch.nn.Linear(5, 2).to(dev)
    reference.load_state_dict(model.state_dict())
    ddp = DDP(model, device_ids=[0] if cuda else None)
    ddp.register_comm_hook(None, default_hooks.fp16_compress_hook)
    opt = torch.optim.SGD(ddp.parameters(), lr=0.1)
    ref_opt = torch.optim.SGD(reference.parameters(), lr=0.1)
    for step in range(3):
        batches = [torch.randn(4, 5, generator=torch.Generator().manual_seed(10 * step + q))
                   for q in range(n)]
        opt.zero_grad()
        ddp(batches[r].to(dev)).pow(2).mean().backward()
        opt.step()
        # The reference: one process on every rank's batch (the mean of their gradients).
        ref_opt.zero_grad()
        sum(reference(bq.to(dev)).pow(2).mean() for bq in batches).div(n).backward()
        ref_opt.step()
    w = model.weight.detach()
    out["ddp.same_weights"] = bool(torch.equal(hvd.broadcast(w, 0, name="w.cuda"), w))
    out["ddp.max_diff"] = float((w - reference.weight.detach()).abs().max())
    dist.destroy_process_group()
    hvd.shutdown()
    return out


@pytest.mark.parametrize("nranks", [1, 2, 3])
def test_hvd_backend_moves_cuda_tensors(nranks, tmp_path):
    results = run_ranks(_cuda_on_hvd, nranks, args=(str(tmp_path / "store"),), timeout=TIMEOUT)
    s, n = float(sum(range(1, nranks + 1))), nranks
    for r, res in enumerate(results):
        if DEVICE == "cuda":
            assert res["plane"] == ("nccl" if n == 1 and hvd_nccl_built() else "gloo"), res
        kind = "cuda" if DEVICE == "cuda" else "cpu"
        assert res["all_reduce.SUM"] == (kind, [s] * 5)
        assert res["all_reduce.AVG"] == (kind, [s / n] * 5)
        assert res["all_reduce.MAX"] == (kind, [float(n)] * 5)
        assert res["broadcast"] == [float(n - 1)] * 3
        assert res["all_gather_into_tensor"] == [float(q) for q in range(n) for _ in range(2)]
        assert res["all_gather"] == [[float(q)] * (q + 1) for q in range(n)]
        total = s  # sum over ranks of (r + 1)
        assert res["reduce_scatter_tensor"] == [total * (2 * r), total * (2 * r + 1)]
        assert res["all_to_all_single"] == [float(100 * q + r) for q in range(n)
                                            for _ in range(r + 1)]
        assert res["stream_order"] == [2 * s]
        assert res["future_then"] == [3.0 * n] * 2
        assert res["ddp.same_weights"]
        assert res["ddp.max_diff"] < 1e-3, res["ddp.max_diff"]


def hvd_nccl_built():
    import hvd_torch as hvd

    return hvd.nccl_built()
