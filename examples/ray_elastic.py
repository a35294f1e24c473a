"""Elastic digits training on Ray: workers may die or join; training goes on from the last commit.

    python examples/ray_elastic.py                          (a local Ray, 2..3 workers)
    python examples/ray_elastic.py --kill-at-epoch 0        (rank 0 dies after epoch 0)
    python examples/ray_elastic.py --address auto --min-workers 2 --max-workers 8

The training function is examples/digits_elastic.py's (Horovod's elastic loop:
hvd.elastic.run, TorchState, ElasticSampler on scikit-learn's digits), run by
RayExecutor(settings, min_workers=..., max_workers=...): the executor starts as
many worker actors as the cluster's nodes hold (one CPU each), up to
--max-workers, replaces any that die, and adds workers when nodes join. Rank 0
reports each epoch's accuracy to the driver (ray_integration.report), which
prints it. With --kill-at-epoch E the first rank 0 kills its own process
(SIGKILL, as if its machine died) right after reporting epoch E, before that
epoch's commit: the survivors restore the last commit, redo the epoch, and a
replacement actor receives the state. (tests/ray/test_ray_elastic.py kills an actor
with ray.kill; a kill from here is exact in time, which a demo that checks its
own outcome needs.) At the end every worker returns its weights and the script
checks they are identical. See docs/ray.md, "Elastic mode".
"""

import argparse
import os
import signal
import time

import ray
import torch
import torch.nn.functional as F
from torch.utils.data import DataLoader, TensorDataset

import hvd_torch as hvd
import ray_integration
from ray_integration import RayExecutor

# From the script's directory, which Ray puts on its workers' sys.path too.
from digits_allreduce import DigitsNet, load_data  # isort: skip


def parse_args():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--min-workers", type=int, default=2)
    p.add_argument("--max-workers", type=int, default=3)
    p.add_argument("--epochs", type=int, default=3)
    p.add_argument("--batch-size", type=int, default=32)
    p.add_argument("--lr", type=float, default=0.05)
    p.add_argument("--commit-every", type=int, default=5, help="batches between commits")
    p.add_argument(
        "--kill-at-epoch",
        type=int,
        default=None,
        help="the first rank 0 dies (SIGKILL) right after reporting this epoch",
    )
    p.add_argument("--address", default=None, help="a running cluster, e.g. auto")
    return p.parse_args()


def train_digits(epochs, batch_size, lr, commit_every, kill_at_epoch=None):
    """One elastic worker: digits_elastic.py's loop; returns the final weights."""
    torch.set_num_threads(1)  # the workers share the machine's cores
    hvd.init()
    torch.manual_seed(0)
    (x, y), (x_test, y_test) = load_data(seed=0)
    dataset = TensorDataset(x, y)
    model = DigitsNet()
    optimizer = hvd.DistributedOptimizer(
        torch.optim.SGD(model.parameters(), lr=lr, momentum=0.9),
        named_parameters=model.named_parameters(),
    )
    sampler = hvd.elastic.ElasticSampler(dataset, shuffle=True, seed=0)
    loader = DataLoader(dataset, batch_size=batch_size, sampler=sampler)
    state = hvd.elastic.TorchState(model=model, optimizer=optimizer, sampler=sampler, epoch=0)

    @hvd.elastic.run
    def train(state):
        for state.epoch in range(state.epoch, epochs):  # noqa: B020  (Horovod's idiom)
            state.sampler.set_epoch(state.epoch)
            for i, (xb, yb) in enumerate(loader):
                optimizer.zero_grad()
                F.cross_entropy(model(xb), yb).backward()
                optimizer.step()
                state.sampler.record_batch(i, batch_size)
                if (i + 1) % commit_every == 0:
                    state.commit()
            with torch.no_grad():
                accuracy = (model(x_test).argmax(1) == y_test).float().mean()
            accuracy = hvd.allreduce(accuracy, name="accuracy").item()
            # Only rank 0's reports reach the driver; the worker id names the actor.
            ray_integration.report({
                "epoch": state.epoch, "size": hvd.size(), "accuracy": accuracy,
                "worker": os.environ["HVD_TORCH_ELASTIC_WORKER_ID"],
            })  # fmt: skip
            # Worker w1 is the first job's rank 0; a replacement gets a new id.
            if state.epoch == kill_at_epoch and os.environ["HVD_TORCH_ELASTIC_WORKER_ID"] == "w1":
                print(f"worker w1 (rank 0) dies after epoch {state.epoch}", flush=True)
                time.sleep(1.0)  # let the driver collect the report first
                os.kill(os.getpid(), signal.SIGKILL)
            state.commit()

    train(state)
    return {name: t.detach().clone() for name, t in model.state_dict().items()}


class Progress:
    """The driver's callback: prints rank 0's reports as they arrive."""

    def __call__(self, report):
        print(
            f"epoch {report['epoch']}: {report['size']} workers, test accuracy "
            f"{report['accuracy']:.3f}",
            flush=True,
        )


def main():
    args = parse_args()
    if args.address:
        ray.init(address=args.address)
    else:
        ray.init(address="local", num_cpus=max(os.cpu_count() or 1, args.max_workers),
                 include_dashboard=False)

    settings = RayExecutor.create_settings(timeout_s=30)
    executor = RayExecutor(settings, min_workers=args.min_workers, max_workers=args.max_workers)
    executor.start()
    try:
        weights = executor.run(
            train_digits,
            args=[args.epochs, args.batch_size, args.lr, args.commit_every, args.kill_at_epoch],
            callbacks=[Progress()],
        )
    finally:
        executor.shutdown()

    for rank, w in enumerate(weights[1:], start=1):
        for name, tensor in w.items():
            if not torch.equal(tensor, weights[0][name]):
                raise SystemExit(f"rank {rank}'s {name} differs from rank 0's")
    print(
        f"all {len(weights)} workers hold identical weights after {args.epochs} epochs "
        f"({executor.resets} reset(s))"
    )


if __name__ == "__main__":
    main()
