"""The smallest data-parallel training job: torch and hvd_torch, nothing else.

    hvdrun -np 2 python examples/linear_regression.py
    hvdrun -np 2 python examples/linear_regression.py --epochs 50 --lr 0.05

Fits y = X w + b on synthetic data with Horovod's training API. No data set, no
download and no package besides torch (and numpy, which hvd_torch needs), so it runs
in a fresh environment that holds only torch and the hvd_torch wheel (make test-wheel
runs it there). Each rank:
  1. draws its own shard of the data from a generator seeded by its rank, around
     one true (w, b) that every rank draws from the same seed;
  2. starts from its own random weights and takes rank 0's (broadcast_parameters);
  3. trains with DistributedOptimizer, which averages the gradients across ranks;
  4. averages its loss over the ranks each epoch (hvd.allreduce), printed by rank 0.
At the end the ranks compare a hash of their weights (allgather); the script exits
with 1 if any rank differs or the fit misses the true weights by more than
--tolerance.
"""

import argparse
import hashlib
import sys

import torch
import hvd_torch as hvd

FEATURES = 8


def weights_digest(model):
    h = hashlib.sha256()
    for p in model.parameters():
        h.update(p.detach().numpy().tobytes())
    return h.digest()


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--epochs", type=int, default=30)
    parser.add_argument("--lr", type=float, default=0.1)
    parser.add_argument("--samples-per-rank", type=int, default=512)
    parser.add_argument("--batch-size", type=int, default=64)
    parser.add_argument("--tolerance", type=float, default=0.05,
                        help="largest |w - w_true| accepted at the end (default 0.05)")
    args = parser.parse_args()

    hvd.init()
    rank, size = hvd.rank(), hvd.size()
    torch.set_num_threads(1)

    truth = torch.Generator().manual_seed(0)  # the same on every rank
    w_true = torch.randn(FEATURES, 1, generator=truth)
    b_true = torch.randn(1, generator=truth)
    shard = torch.Generator().manual_seed(1000 + rank)  # this rank's own data
    x = torch.randn(args.samples_per_rank, FEATURES, generator=shard)
    y = x @ w_true + b_true + 0.01 * torch.randn(args.samples_per_rank, 1, generator=shard)

    torch.manual_seed(rank)  # different starting weights: the broadcast must fix them
    model = torch.nn.Linear(FEATURES, 1)
    optimizer = torch.optim.SGD(model.parameters(), lr=args.lr)
    hvd.broadcast_parameters(model.state_dict(), root_rank=0)
    hvd.broadcast_optimizer_state(optimizer, root_rank=0)
    optimizer = hvd.DistributedOptimizer(optimizer, named_parameters=model.named_parameters())

    for epoch in range(1, args.epochs + 1):
        order = torch.randperm(len(x), generator=shard)
        total = 0.0
        for start in range(0, len(x), args.batch_size):
            idx = order[start:start + args.batch_size]
            loss = torch.nn.functional.mse_loss(model(x[idx]), y[idx])
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            total += loss.item() * len(idx)
        mean = hvd.allreduce(torch.tensor([total / len(x)]), name="epoch.loss", op=hvd.Average)
        if rank == 0 and (epoch == 1 or epoch % 10 == 0 or epoch == args.epochs):
            print(f"epoch {epoch:3d}/{args.epochs}  loss {mean.item():.6f}", flush=True)

    error = torch.cat([(model.weight.detach().t() - w_true).flatten(),
                       model.bias.detach() - b_true]).abs().max().item()
    digest = torch.frombuffer(bytearray(weights_digest(model)[:8]), dtype=torch.int64)
    digests = hvd.allgather(digest, name="final.digest").tolist()
    if len(set(digests)) != 1:
        print(f"rank {rank}: weights differ across ranks: {digests}", file=sys.stderr)
        return 1
    if error > args.tolerance:
        print(f"rank {rank}: the fit misses the true weights by {error:.4f} "
              f"(more than {args.tolerance})", file=sys.stderr)
        return 1
    if rank == 0:
        print(f"max |w - w_true| = {error:.4f}", flush=True)
        print(f"all {size} ranks hold identical weights "
              f"(sha256 prefix {digests[0] & (2**64 - 1):016x})", flush=True)
    hvd.shutdown()
    return 0


if __name__ == "__main__":
    sys.exit(main())
