"""Elastic digits training: workers may die or join; training goes on from the last commit.

    hvdrun --min-np 1 --max-np 3 --host-discovery-script examples/discover_hosts.sh \
        python examples/digits_elastic.py
    echo "localhost:3" > /tmp/hvd_hosts      # while it runs: grow to 3 workers
    kill -9 <pid of one worker>              # or lose one: the others go on

Horovod's elastic training loop (hvd.elastic.run, TorchState, ElasticSampler) on
scikit-learn's digits. The state (model, optimizer, sampler position, epoch) is
committed every --commit-every batches; after a failure the survivors restore the
last commit, regroup with new ranks and continue, and workers that join receive the
state from rank 0. See docs/elastic.md.
"""

import argparse
import os

import torch
import torch.nn.functional as F
from torch.utils.data import DataLoader, TensorDataset

import hvd_torch as hvd
from digits_allreduce import DigitsNet, load_data
from progress import progress


def parse_args():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--epochs", type=int, default=5)
    p.add_argument("--batch-size", type=int, default=32)
    p.add_argument("--lr", type=float, default=0.05)
    p.add_argument("--commit-every", type=int, default=5, help="batches between commits")
    return p.parse_args()


def main():
    args = parse_args()
    torch.set_num_threads(1)
    hvd.init()
    torch.manual_seed(0)
    (x, y), (x_test, y_test) = load_data(seed=0)
    dataset = TensorDataset(x, y)
    model = DigitsNet()
    optimizer = hvd.DistributedOptimizer(
        torch.optim.SGD(model.parameters(), lr=args.lr, momentum=0.9),
        named_parameters=model.named_parameters())
    sampler = hvd.elastic.ElasticSampler(dataset, shuffle=True, seed=0)
    loader = DataLoader(dataset, batch_size=args.batch_size, sampler=sampler)
    state = hvd.elastic.TorchState(model=model, optimizer=optimizer, sampler=sampler, epoch=0)

    def on_reset():
        if hvd.rank() == 0:
            print(f"reset: now {hvd.size()} workers", flush=True)

    state.register_reset_callbacks([on_reset])

    @hvd.elastic.run
    def train(state):
        for state.epoch in range(state.epoch, args.epochs):
            state.sampler.set_epoch(state.epoch)
            # A bar on rank 0 (stderr; tqdm when installed), rebuilt after a reset.
            bar = progress(loader, disable=hvd.rank() != 0, desc=f"epoch {state.epoch}",
                           unit="batch", leave=False)
            for i, (xb, yb) in enumerate(bar):
                optimizer.zero_grad()
                F.cross_entropy(model(xb), yb).backward()
                optimizer.step()
                state.sampler.record_batch(i, args.batch_size)
                if (i + 1) % args.commit_every == 0:
                    state.commit()
            with torch.no_grad():
                accuracy = (model(x_test).argmax(1) == y_test).float().mean()
            accuracy = hvd.allreduce(accuracy, name="accuracy").item()
            if hvd.rank() == 0:
                print(f"epoch {state.epoch}: {hvd.size()} workers, test accuracy {accuracy:.3f}",
                      flush=True)
            state.commit()

    train(state)
    if hvd.rank() == 0:
        print(f"done (pid {os.getpid()})", flush=True)


if __name__ == "__main__":
    main()
