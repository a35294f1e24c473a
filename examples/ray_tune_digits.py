"""Ray Tune over distributed hvd-torch trials: learning rate and momentum for the digits.

    python examples/ray_tune_digits.py                      (4 trials of 2 workers, ASHA)
    python examples/ray_tune_digits.py --num-samples 8 --epochs 6 --num-workers 3
    python examples/ray_tune_digits.py --address auto       (an existing cluster)

Every trial is an hvd-torch job of --num-workers Ray workers
(DistributedTrainableCreator). Each worker trains on its shard of the digits
with hvd.DistributedOptimizer and, after every epoch, reports the validation
accuracy averaged over workers; rank 0's reports reach Tune, so ASHA can stop a
poor trial after its first epochs. At the end the script prints the best config.
The training function is defined here and travels to the workers by value.
"""

import argparse
import os
import tempfile

import numpy as np
import ray
import torch
import torch.nn.functional as F
from ray import tune
from ray.tune.schedulers import ASHAScheduler
from digits_data import load_digits
from torch import nn

import hvd_torch as hvd
import ray_integration
from ray_integration import DistributedTrainableCreator


def parse_args():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--num-samples", type=int, default=4, help="trials")
    p.add_argument("--epochs", type=int, default=5, help="per trial, at most (ASHA's max_t)")
    p.add_argument("--num-workers", type=int, default=2, help="per trial")
    p.add_argument("--concurrent", type=int, default=2, help="trials at once on a local Ray")
    p.add_argument("--address", default=None, help="a running cluster, e.g. auto")
    p.add_argument("--storage", default=None, help="Tune's results (default: a temp dir)")
    return p.parse_args()


def train_digits(config):
    """One trial on every one of its workers."""
    hvd.init()
    torch.set_num_threads(1)
    torch.manual_seed(0)  # every trial starts from the same weights: only lr/momentum differ
    digits = load_digits()
    x = torch.from_numpy(digits.data.astype(np.float32) / 16.0)
    y = torch.from_numpy(digits.target.astype(np.int64))
    order = torch.randperm(len(y), generator=torch.Generator().manual_seed(0))
    val, train = order[:300], order[300:]
    n = len(train) // hvd.size() * hvd.size()  # equal shards: equal step counts
    mine = train[hvd.rank() : n : hvd.size()]

    model = nn.Sequential(nn.Linear(64, 32), nn.ReLU(), nn.Linear(32, 10))
    optimizer = torch.optim.SGD(
        model.parameters(), lr=hvd.scale_lr(config["lr"]), momentum=config["momentum"]
    )
    optimizer = hvd.DistributedOptimizer(optimizer, named_parameters=model.named_parameters())
    hvd.broadcast_parameters(model.state_dict(), root_rank=0)

    for epoch in range(config["epochs"]):
        shuffled = mine[torch.randperm(len(mine), generator=torch.Generator().manual_seed(epoch))]
        for batch in shuffled.split(16):
            optimizer.zero_grad()
            F.cross_entropy(model(x[batch]), y[batch]).backward()
            optimizer.step()
        with torch.no_grad():
            shard = val[hvd.rank() :: hvd.size()]
            correct = (model(x[shard]).argmax(1) == y[shard]).float().mean().item()
        accuracy = hvd.metric_average(correct, name=f"accuracy.{epoch}")
        ray_integration.report({"accuracy": accuracy, "epoch": epoch + 1})


def main():
    args = parse_args()
    if args.address:
        ray.init(address=args.address)
    else:
        # Logical CPUs: enough for --concurrent trials of --num-workers workers.
        cpus = max(os.cpu_count() or 1, args.concurrent * args.num_workers)
        ray.init(address="local", num_cpus=cpus, include_dashboard=False)

    trainable = DistributedTrainableCreator(train_digits, num_workers=args.num_workers)
    tuner = tune.Tuner(
        trainable,
        param_space={
            "lr": tune.loguniform(1e-3, 3e-1),
            "momentum": tune.uniform(0.5, 0.95),
            "epochs": args.epochs,
        },
        tune_config=tune.TuneConfig(
            metric="accuracy",
            mode="max",
            num_samples=args.num_samples,
            scheduler=ASHAScheduler(max_t=args.epochs, grace_period=1, reduction_factor=2),
        ),
        run_config=tune.RunConfig(
            storage_path=args.storage or tempfile.mkdtemp(prefix="hvd-tune-"), verbose=1
        ),
    )
    results = tuner.fit()
    best = results.get_best_result()
    print(
        f"best config: lr={best.config['lr']:.4g} momentum={best.config['momentum']:.3f} "
        f"(accuracy {best.metrics['accuracy']:.3f} after {best.metrics['epoch']} epochs; "
        f"{len(results)} trials, {sum(r.error is not None for r in results)} failed)"
    )


if __name__ == "__main__":
    main()
