"""Data-parallel training on scikit-learn's handwritten digits, gradients averaged by hand.

    hvdrun -np 2 python examples/digits_allreduce.py            (or: make demo)
    hvdrun -np 2 python examples/digits_allreduce.py --epochs 5 --no-overlap

load_digits ships inside scikit-learn (1797 8x8 images, 10 classes), so nothing is
downloaded. Each rank:
  1. starts from its own random weights, then takes rank 0's (broadcast_), so a
     missed broadcast would show up as diverged weights at the end;
  2. trains on its shard of every epoch's shuffle (indices[rank::size]), padded
     like torch's DistributedSampler so every rank takes the same number of steps;
  3. averages every gradient across ranks before the optimizer step. By default
     each gradient's allreduce_async_ starts from a hook the moment autograd has
     accumulated it, so communication overlaps the rest of backward (what
     Horovod's DistributedOptimizer does); --no-overlap waits for backward to
     finish and then calls the blocking allreduce_ per gradient.
At the end the ranks compare a hash of their weights (allgather) and the script
exits with 1 if any rank differs.
"""

import argparse
import hashlib
import math
import sys
import time

import numpy as np
import torch
import torch.nn.functional as F
from digits_data import load_digits
from torch import nn

import hvd_torch as hvd


def parse_args():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--epochs", type=int, default=10)
    p.add_argument("--batch-size", type=int, default=32, help="per rank")
    p.add_argument("--lr", type=float, default=0.05)
    p.add_argument("--momentum", type=float, default=0.9)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument(
        "--no-overlap",
        action="store_true",
        help="blocking allreduce_ after backward instead of async hooks",
    )
    return p.parse_args()


class DigitsNet(nn.Module):
    """Two 3x3 convolutions and two linear layers: about 40k parameters."""

    def __init__(self):
        super().__init__()
        self.conv1 = nn.Conv2d(1, 16, 3, padding=1)
        self.conv2 = nn.Conv2d(16, 32, 3, padding=1)
        self.fc1 = nn.Linear(32 * 4 * 4, 64)
        self.fc2 = nn.Linear(64, 10)

    def forward(self, x):
        x = F.relu(self.conv1(x))
        x = F.max_pool2d(F.relu(self.conv2(x)), 2)
        return self.fc2(F.relu(self.fc1(x.flatten(1))))


def load_data(seed):
    """The same train/test split on every rank: the split seed is shared."""
    digits = load_digits()
    x = torch.from_numpy(digits.images.astype(np.float32) / 16.0).unsqueeze(1)
    y = torch.from_numpy(digits.target.astype(np.int64))
    order = torch.randperm(len(y), generator=torch.Generator().manual_seed(seed))
    n_test = len(y) // 6
    test, train = order[:n_test], order[n_test:]
    return (x[train], y[train]), (x[test], y[test])


def shard(n, epoch, seed):
    """This rank's indices for one epoch, DistributedSampler-style.

    Every rank draws the same permutation, pads it to a multiple of size by
    repeating its head, and keeps every size-th index from its rank on.
    """
    order = torch.randperm(n, generator=torch.Generator().manual_seed(seed + epoch))
    total = math.ceil(n / hvd.size()) * hvd.size()
    order = torch.cat([order, order[: total - n]])
    return order[hvd.rank() :: hvd.size()]


class OverlappingAverager:
    """Starts each gradient's allreduce as soon as autograd has accumulated it.

    Names are the parameter names, identical on every rank; the engine's
    negotiation copes with ranks submitting them in different orders.
    """

    def __init__(self, model):
        self._handles = []
        for name, p in model.named_parameters():
            p.register_post_accumulate_grad_hook(self._hook(f"grad.{name}"))

    def _hook(self, name):
        def start(p):
            self._handles.append(hvd.allreduce_async_(p.grad, name=name, op=hvd.Average))

        return start

    def wait(self):
        """Call after backward: every gradient is the average over ranks on return."""
        for handle in self._handles:
            hvd.synchronize(handle)
        self._handles.clear()


def average_gradients_blocking(model):
    for name, p in model.named_parameters():
        hvd.allreduce_(p.grad, name=f"grad.{name}", op=hvd.Average)


@torch.no_grad()
def evaluate(model, x, y):
    """Accuracy over the whole test set; each rank scores its own slice."""
    mine = slice(hvd.rank(), None, hvd.size())
    correct = (model(x[mine]).argmax(1) == y[mine]).sum()
    counts = torch.stack([correct, torch.tensor(len(y[mine]))]).double()
    correct, total = hvd.allreduce(counts, name="eval.counts", op=hvd.Sum).tolist()
    return correct / total


def weights_digest(model):
    """sha256 of every parameter's bytes: ranks must agree bit for bit, since each
    applies the same averaged gradient to the same starting weights."""
    h = hashlib.sha256()
    for p in model.parameters():
        h.update(p.detach().contiguous().numpy().tobytes())
    return h.digest()


def main():
    args = parse_args()
    hvd.init()
    # One thread per rank: the ranks share the machine's cores.
    torch.set_num_threads(1)
    rank, size = hvd.rank(), hvd.size()
    log = print if rank == 0 else (lambda *a, **k: None)

    (x_train, y_train), (x_test, y_test) = load_data(args.seed)
    torch.manual_seed(args.seed + rank)  # different on purpose: broadcast must fix it
    model = DigitsNet()
    for name, p in model.named_parameters():
        hvd.broadcast_(p.data, root_rank=0, name=f"init.{name}")
    optimizer = torch.optim.SGD(model.parameters(), lr=args.lr, momentum=args.momentum)
    averager = None if args.no_overlap else OverlappingAverager(model)

    steps = math.ceil(math.ceil(len(y_train) / size) / args.batch_size)
    log(
        f"{size} rank(s), {len(y_train)} training / {len(y_test)} test images, "
        f"{steps} steps of {args.batch_size} per rank per epoch, "
        f"{'overlapped allreduce_async_' if averager else 'blocking allreduce_'}"
    )
    start = time.perf_counter()
    for epoch in range(args.epochs):
        model.train()
        mine = shard(len(y_train), epoch, args.seed)
        loss_sum = torch.zeros((), dtype=torch.float64)
        for i in range(0, len(mine), args.batch_size):
            batch = mine[i : i + args.batch_size]
            optimizer.zero_grad(set_to_none=False)
            loss = F.cross_entropy(model(x_train[batch]), y_train[batch])
            loss.backward()
            if averager:
                averager.wait()
            else:
                average_gradients_blocking(model)
            optimizer.step()
            loss_sum += loss.detach() * len(batch)
        # Mean training loss over all ranks' samples.
        loss_avg = hvd.allreduce(loss_sum / len(mine), name="train.loss", op=hvd.Average)
        model.eval()
        accuracy = evaluate(model, x_test, y_test)
        log(
            f"epoch {epoch + 1:2d}/{args.epochs}  loss {loss_avg.item():.4f}  "
            f"test accuracy {100 * accuracy:5.1f}%  ({time.perf_counter() - start:.1f}s)"
        )

    digest = torch.frombuffer(bytearray(weights_digest(model)[:8]), dtype=torch.int64)
    digests = hvd.allgather(digest, name="final.digest").tolist()
    if len(set(digests)) != 1:
        print(
            f"rank {rank}: weights differ across ranks: "
            + ", ".join(f"rank {r}: {d & (2**64 - 1):016x}" for r, d in enumerate(digests)),
            file=sys.stderr,
        )
        return 1
    log(f"all {size} ranks hold identical weights (sha256 prefix {digests[0] & (2**64 - 1):016x})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
