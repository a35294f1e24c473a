"""The "hvd" torch.distributed backend next to CUDA (issue #31): one process
group whose CPU tensors go to hvd and whose CUDA tensors go to a CUDA backend
("cpu:hvd,cuda:nccl" on 1 rank: one GPU is one NCCL rank; "cpu:hvd,cuda:gloo"
on 2 ranks sharing the GPU), DDP of a CUDA model, and hvd.allreduce of CUDA
tensors through our own planes, all in one script. Skipped without a GPU.
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
