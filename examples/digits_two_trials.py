"""Two training runs in one job with process sets: each set trains its own model.

    hvdrun -np 4 python examples/digits_two_trials.py
    hvdrun -np 3 python examples/digits_two_trials.py --epochs 2

Even ranks form one process set and train the digits model with one learning
rate; odd ranks form another and train with a tenth of it. Each set averages
gradients only among its own ranks (DistributedOptimizer(process_set=...)), and
the two sets run at the same time without waiting for each other. At the end a
global allgather_object collects every rank's result, rank 0 prints both
trials, and the script exits with 1 unless the ranks of each set hold identical
weights.
"""

import argparse
import hashlib
import os
import sys

import torch
import torch.nn.functional as F

import hvd_torch as hvd
from digits_allreduce import DigitsNet, load_data


def parse_args():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--epochs", type=int, default=4)
    p.add_argument("--lr", type=float, default=0.1, help="the even set's rate; odd uses lr/10")
    p.add_argument("--batch-size", type=int, default=32)
    return p.parse_args()


def train_in_set(trial, lr, args):
    """Trains a fresh model over `trial`'s ranks; returns (accuracy, weights digest)."""
    torch.manual_seed(1234 + trial.process_set_id)
    model = DigitsNet()
    (x, y), (x_test, y_test) = load_data(seed=0)
    opt = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=lr, momentum=0.9),
                                   named_parameters=model.named_parameters(),
                                   process_set=trial)
    # Every member starts from the set's first rank's weights.
    hvd.broadcast_parameters(model.state_dict(), root_rank=trial.ranks[0], process_set=trial)
    me, members = trial.rank(), trial.size()
    for epoch in range(args.epochs):
        order = torch.randperm(len(y), generator=torch.Generator().manual_seed(epoch))
        mine = order[me::members]
        for start in range(0, len(mine) - args.batch_size + 1, args.batch_size):
            idx = mine[start:start + args.batch_size]
            opt.zero_grad()
            F.cross_entropy(model(x[idx]), y[idx]).backward()
            opt.step()
    with torch.no_grad():
        accuracy = (model(x_test).argmax(1) == y_test).float().mean().item()
    digest = hashlib.sha256(b"".join(p.detach().numpy().tobytes()
                                     for p in model.parameters())).hexdigest()[:16]
    return accuracy, digest


def main():
    args = parse_args()
    torch.set_num_threads(1)
    size = int(os.environ.get("HOROVOD_SIZE", "1"))
    if size < 2:
        sys.exit("run with at least 2 ranks: hvdrun -np 4 python examples/digits_two_trials.py")
    # Static process sets are built before init() and registered by it.
    even = hvd.ProcessSet(range(0, size, 2))
    odd = hvd.ProcessSet(range(1, size, 2))
    hvd.init(process_sets=[even, odd])
    trial, lr = (even, args.lr) if hvd.rank() % 2 == 0 else (odd, args.lr / 10)
    accuracy, digest = train_in_set(trial, lr, args)
    results = hvd.allgather_object((hvd.rank(), trial.process_set_id, lr, accuracy, digest))
    ok = True
    if hvd.rank() == 0:
        for ps in (even, odd):
            rows = [r for r in results if r[1] == ps.process_set_id]
            digests = {r[4] for r in rows}
            ok = ok and len(digests) == 1
            print(f"process set {ps.process_set_id} (ranks {ps.ranks}): lr {rows[0][2]:g}, "
                  f"test accuracy {rows[0][3]:.3f}, "
                  + ("identical weights on its ranks" if len(digests) == 1
                     else f"weights DIFFER: {sorted(digests)}"))
    ok = hvd.broadcast_object(ok, root_rank=0)
    hvd.shutdown()
    sys.exit(0 if ok else 1)


if __name__ == "__main__":
    main()
