"""A plain PyTorch DDP script whose bytes move through hvd-torch's engine.

    torchrun --nproc-per-node 2 examples/ddp_on_hvd.py
    hvdrun -np 2 python examples/ddp_on_hvd.py
    hvdrun -np 2 python examples/ddp_on_hvd.py --backend gloo     (torch's own, to compare)

The only hvd-specific lines are `import hvd_torch` (which registers the "hvd"
torch.distributed backend) and the backend's name. Everything else is what any
DDP script does: init_process_group reads RANK/WORLD_SIZE/MASTER_ADDR/MASTER_PORT,
which torchrun and hvdrun both set; DistributedSampler shards scikit-learn's digits
(1797 8x8 images, shipped inside scikit-learn); DDP averages the gradients.

With --hvd-metrics the script also calls hvd.allreduce for its metrics, on the same
engine as DDP (init_process_group("hvd") started it, so hvd.init() is a no-op).
At the end the ranks compare a hash of their weights; the script exits with 1 if
any rank differs.
"""

import argparse
import hashlib
import os
import sys

import torch
import torch.distributed as dist
import torch.nn.functional as F
from digits_data import load_digits
from torch import nn
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, DistributedSampler, TensorDataset

import hvd_torch as hvd  # registers the "hvd" backend


def parse_args():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--backend", default="hvd", help="hvd (default) or gloo")
    p.add_argument("--epochs", type=int, default=3)
    p.add_argument("--batch-size", type=int, default=32, help="per rank")
    p.add_argument("--lr", type=float, default=0.05)
    p.add_argument("--hvd-metrics", action="store_true",
                   help="average the epoch's loss with hvd.allreduce (needs --backend hvd)")
    return p.parse_args()


def main(args):
    dist.init_process_group(args.backend)
    rank, size = dist.get_rank(), dist.get_world_size()
    torch.manual_seed(0)  # the same initial weights everywhere (DDP broadcasts rank 0's anyway)
    digits = load_digits()
    x = torch.tensor(digits.images, dtype=torch.float32).unsqueeze(1) / 16.0
    y = torch.tensor(digits.target)
    data = TensorDataset(x, y)
    sampler = DistributedSampler(data, num_replicas=size, rank=rank, seed=0)
    loader = DataLoader(data, batch_size=args.batch_size, sampler=sampler)
    model = DDP(nn.Sequential(
        nn.Conv2d(1, 16, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2), nn.Flatten(),
        nn.Linear(16 * 4 * 4, 64), nn.ReLU(), nn.Linear(64, 10)))
    opt = torch.optim.SGD(model.parameters(), lr=args.lr * size, momentum=0.9)
    for epoch in range(1, args.epochs + 1):
        sampler.set_epoch(epoch)
        total, batches = 0.0, 0
        for xb, yb in loader:
            opt.zero_grad()
            loss = F.cross_entropy(model(xb), yb)
            loss.backward()
            opt.step()
            total, batches = total + loss.item(), batches + 1
        mean = torch.tensor([total / batches])
        if args.hvd_metrics:
            mean = hvd.allreduce(mean, op=hvd.Average, name=f"loss.{epoch}")
        else:
            dist.all_reduce(mean, op=dist.ReduceOp.SUM)
            mean /= size
        if rank == 0:
            print(f"epoch {epoch}/{args.epochs}  loss {mean.item():.4f}  "
                  f"(backend {dist.get_backend()}, {size} ranks)", flush=True)
    weights = torch.cat([p.detach().reshape(-1) for p in model.module.parameters()])
    digest = hashlib.sha256(weights.numpy().tobytes()).hexdigest()[:16]
    digests = [None] * size
    dist.all_gather_object(digests, digest)
    dist.destroy_process_group()
    if len(set(digests)) != 1:
        print(f"rank {rank}: weights differ across ranks: {digests}", file=sys.stderr)
        return 1
    if rank == 0:
        print(f"all {size} ranks hold identical weights (sha256 prefix {digest})", flush=True)
    return 0


def exit_now(code):
    """Ends the process without the interpreter's exit.

    torch's gloo backend keeps its worker threads after destroy_process_group()
    when DDP still holds the group, and a worker that frees a finished op's tensor
    while the interpreter exits aborts the process ("terminate called without an
    active exception", torch 2.13, pytorch issue 190489; tests/harness/plain_ddp.py
    leaves the same way). The "hvd" backend joins its threads at exit.
    """
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


if __name__ == "__main__":
    ARGS = parse_args()
    CODE = main(ARGS)
    if ARGS.backend == "gloo":
        exit_now(CODE)
    sys.exit(CODE)
