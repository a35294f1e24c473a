"""Horovod's stateful Ray flow on hvd-torch: one model per worker, trained step by step.

    python examples/ray_stateful.py                       (a local Ray, 2 workers)
    python examples/ray_stateful.py --num-workers 3 --steps 10
    python examples/ray_stateful.py --address auto        (an existing cluster)

start(executable_cls=MyModel) builds one MyModel on every worker and keeps it;
each execute() calls a method on all of them at once. MyModel trains a small
classifier on scikit-learn's digits with hvd.DistributedOptimizer, so after any
number of train() calls every worker holds the same weights, which the script
checks at the end. The model is defined here, not imported: classes from the
driver's script travel to the workers by value, so nothing has to be installed
on a cluster's nodes but hvd-torch.
"""

import argparse
import os

import numpy as np
import ray
import torch
import torch.nn.functional as F
from digits_data import load_digits
from torch import nn

import hvd_torch as hvd
from ray_integration import RayExecutor
from progress import progress


def parse_args():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--num-workers", type=int, default=2)
    p.add_argument("--steps", type=int, default=5, help="execute(train) calls, one epoch each")
    p.add_argument("--use-gpu", action="store_true")
    p.add_argument("--address", default=None, help="a running cluster, e.g. auto")
    return p.parse_args()


class MyModel:
    """One worker's model, optimizer and shard of the digits."""

    def __init__(self, lr=0.05, batch_size=32):
        hvd.init()
        torch.set_num_threads(1)  # the workers share the machine's cores
        torch.manual_seed(hvd.rank())  # different on purpose: the broadcast must fix it
        self.model = nn.Sequential(nn.Flatten(), nn.Linear(64, 64), nn.ReLU(), nn.Linear(64, 10))
        optimizer = torch.optim.SGD(self.model.parameters(), lr=hvd.scale_lr(lr), momentum=0.9)
        self.optimizer = hvd.DistributedOptimizer(
            optimizer, named_parameters=self.model.named_parameters()
        )
        hvd.broadcast_parameters(self.model.state_dict(), root_rank=0)
        hvd.broadcast_optimizer_state(self.optimizer, root_rank=0)
        digits = load_digits()
        x = torch.from_numpy(digits.data.astype(np.float32) / 16.0)
        y = torch.from_numpy(digits.target.astype(np.int64))
        # Equal shards, so every rank takes the same number of steps.
        n = len(y) // hvd.size() * hvd.size()
        self.x, self.y = x[hvd.rank() : n : hvd.size()], y[hvd.rank() : n : hvd.size()]
        self.batch_size = batch_size
        self.epochs = 0

    def train(self):
        """One epoch over this worker's shard; the loss averaged over workers."""
        order = torch.randperm(len(self.y), generator=torch.Generator().manual_seed(self.epochs))
        total = 0.0
        for start in range(0, len(order), self.batch_size):
            batch = order[start : start + self.batch_size]
            self.optimizer.zero_grad()
            loss = F.cross_entropy(self.model(self.x[batch]), self.y[batch])
            loss.backward()
            self.optimizer.step()
            total += loss.item() * len(batch)
        self.epochs += 1
        return hvd.metric_average(total / len(order), name=f"loss.{self.epochs}")

    def get_weights(self):
        return {name: t.detach().clone() for name, t in self.model.state_dict().items()}


def main():
    args = parse_args()
    if args.address:
        ray.init(address=args.address)
    else:
        ray.init(address="local", num_cpus=max(os.cpu_count() or 1, args.num_workers),
                 include_dashboard=False)

    num_workers = args.num_workers
    settings = RayExecutor.create_settings(timeout_s=30)
    executor = RayExecutor(settings, num_workers=num_workers, use_gpu=args.use_gpu)
    executor.start(executable_cls=MyModel)

    # Horovod's stateful example: train() is one epoch here, not one batch.
    bar = progress(range(args.steps), desc="training", unit="epoch")  # the driver's bar
    for i in bar:
        # Stateful `execute` method takes the current worker executable as a parameter
        losses = executor.execute(lambda worker: worker.train())
        bar.write(f"step {i + 1}/{args.steps}: loss {losses[0]:.4f}")
    bar.close()

    result = executor.execute(lambda w: w.get_weights())
    assert all(isinstance(res, dict) for res in result)
    executor.shutdown()

    for rank, weights in enumerate(result[1:], start=1):
        for name, tensor in weights.items():
            if not torch.equal(tensor, result[0][name]):
                raise SystemExit(f"rank {rank}'s {name} differs from rank 0's")
    print(f"all {num_workers} workers hold identical weights after {args.steps} steps")


if __name__ == "__main__":
    main()
