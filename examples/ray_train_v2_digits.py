"""The digits CNN on Ray Train v2 with HvdTrainer: Horovod's training API, Ray Train's run.

    python examples/ray_train_v2_digits.py --num-workers 2       (a local Ray, 5 epochs)
    python examples/ray_train_v2_digits.py --num-workers 3 --epochs 10 --max-failures 2
    python examples/ray_train_v2_digits.py --address auto         (an existing cluster)

HvdTrainer (ray_integration/train_v2.py) takes HorovodTrainer's arguments and
runs on Ray Train v2, where Ray 2.58 no longer runs its own HorovodTrainer. The
driver loads scikit-learn's digits (bundled, nothing is downloaded) and hands
the training and validation images to Ray Train as Ray Data datasets. Each
worker:
  - reads its shard of both with ray.train.get_dataset_shard (Ray Data splits
    them into equal parts, dropping the few rows left over, so every worker
    takes the same number of steps);
  - calls hvd.init() (a no-op: the worker group's "hvd" process group started
    the engine), wraps SGD in hvd.DistributedOptimizer with the learning rate
    times hvd.size(), and takes rank 0's weights and optimizer state
    (broadcast_parameters, broadcast_optimizer_state);
  - after every epoch sums its validation hits with hvd.allreduce and calls
    ray.train.report with the epoch's metrics; rank 0 attaches a checkpoint
    (model, optimizer, epoch);
  - on a restart (a worker lost, with --max-failures) resumes from the latest
    checkpoint (ray.train.get_checkpoint), in a new worker group;
  - at the end compares a checksum of its weights with every rank's
    (allgather_object) and fails the run if any differs.
The driver prints each checkpoint's metrics and scores the final checkpoint on
the whole validation set. The model is examples/digits_allreduce.py's CNN: Ray
puts the driver script's folder on its workers' path, so they import it too
(on a cluster, from the same folder on every node).
"""

import argparse
import hashlib
import os
import tempfile
import time
from pathlib import Path

import numpy as np
import ray
import ray.train
import torch
import torch.nn.functional as F
from digits_allreduce import DigitsNet
from digits_data import load_digits

import hvd_torch as hvd
from ray_integration import HvdTrainer

STATE_FILE = "state.pt"


def parse_args():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--num-workers", type=int, default=2)
    p.add_argument("--epochs", type=int, default=5)
    p.add_argument("--lr", type=float, default=0.025, help="one worker's rate; x workers")
    p.add_argument("--momentum", type=float, default=0.9)
    p.add_argument("--batch-size", type=int, default=32, help="per worker")
    p.add_argument("--max-failures", type=int, default=0, help="worker group restarts allowed")
    p.add_argument("--storage", default=None, help="Ray Train's run folder (default: a temp dir)")
    p.add_argument("--address", default=None, help="a running cluster, e.g. auto")
    return p.parse_args()


def digits_datasets(seed=0):
    """(train, validation): Ray Data datasets of {image: 8x8 floats in 0..1, label}."""
    digits = load_digits()
    images = (digits.images / 16.0).astype(np.float32)
    order = np.random.default_rng(seed).permutation(len(images))
    n_val = len(images) // 6

    def dataset(rows):
        return ray.data.from_items([{"image": images[i], "label": int(digits.target[i])}
                                    for i in rows])

    return dataset(order[n_val:]), dataset(order[:n_val])


def train_loop(config):
    hvd.init()  # a no-op here: the worker group's "hvd" process group runs the engine
    torch.manual_seed(hvd.rank())  # every rank starts elsewhere; the broadcast decides
    model = DigitsNet()
    optimizer = torch.optim.SGD(model.parameters(), lr=config["lr"] * hvd.size(),
                                momentum=config["momentum"])
    optimizer = hvd.DistributedOptimizer(optimizer, named_parameters=model.named_parameters())
    first_epoch = 0
    checkpoint = ray.train.get_checkpoint()
    if checkpoint is not None:  # a restarted worker group: go on from the last report
        with checkpoint.as_directory() as folder:
            state = torch.load(Path(folder) / STATE_FILE)
        model.load_state_dict(state["model"])
        optimizer.load_state_dict(state["optimizer"])
        first_epoch = state["epoch"]
    hvd.broadcast_parameters(model.state_dict(), root_rank=0)
    hvd.broadcast_optimizer_state(optimizer, root_rank=0)

    train = ray.train.get_dataset_shard("train")
    val = ray.train.get_dataset_shard("val")
    for epoch in range(first_epoch, config["epochs"]):
        model.train()
        loss_sum = batches = 0
        for batch in train.iter_torch_batches(batch_size=config["batch_size"],
                                              local_shuffle_buffer_size=256,
                                              local_shuffle_seed=epoch):
            loss = F.cross_entropy(model(batch["image"].unsqueeze(1)), batch["label"])
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            loss_sum, batches = loss_sum + loss.item(), batches + 1
        loss = hvd.metric_average(loss_sum / batches, name=f"loss.{epoch}")
        metrics = {"epoch": epoch + 1, "loss": loss, "val_accuracy": _accuracy(model, val)}
        _report(metrics, model, optimizer)
    _check_same_weights(model)


def _accuracy(model, val_shard) -> float:
    """Validation accuracy over every rank's shard (hits and counts summed)."""
    model.eval()
    counts = torch.zeros(2, dtype=torch.float64)
    with torch.no_grad():
        for batch in val_shard.iter_torch_batches(batch_size=256):
            hits = (model(batch["image"].unsqueeze(1)).argmax(1) == batch["label"]).sum()
            counts += torch.tensor([hits.item(), len(batch["label"])], dtype=torch.float64)
    hits, seen = hvd.allreduce(counts, op=hvd.Sum, name="val_counts").tolist()
    return hits / seen


def _report(metrics, model, optimizer):
    """Every rank reports; rank 0 attaches the checkpoint."""
    if hvd.rank() != 0:
        ray.train.report(metrics)
        return
    with tempfile.TemporaryDirectory() as folder:
        state = {"model": model.state_dict(), "optimizer": optimizer.state_dict(),
                 "epoch": metrics["epoch"]}
        torch.save(state, Path(folder) / STATE_FILE)
        ray.train.report(metrics, checkpoint=ray.train.Checkpoint.from_directory(folder))


def _check_same_weights(model):
    digest = hashlib.sha256()
    for tensor in model.state_dict().values():
        digest.update(tensor.numpy().tobytes())
    digests = hvd.allgather_object(digest.hexdigest())
    if len(set(digests)) != 1:
        raise RuntimeError(f"the ranks ended with different weights: {digests}")


def score(checkpoint, val) -> float:
    """The checkpoint's model on the whole validation set, on the driver."""
    with checkpoint.as_directory() as folder:
        state = torch.load(Path(folder) / STATE_FILE)
    model = DigitsNet()
    model.load_state_dict(state["model"])
    model.eval()
    batch = next(iter(val.iter_torch_batches(batch_size=val.count())))
    with torch.no_grad():
        predicted = model(batch["image"].unsqueeze(1)).argmax(1)
    return (predicted == batch["label"]).float().mean().item()


def main():
    args = parse_args()
    if args.address:
        ray.init(address=args.address)
    else:
        cpus = max(os.cpu_count() or 1, args.num_workers + 1)  # + 1 for Ray Data's tasks
        ray.init(address="local", num_cpus=cpus, include_dashboard=False)
    ray.data.DataContext.get_current().enable_progress_bars = False  # a bar per epoch and split

    train, val = digits_datasets()
    started = time.monotonic()
    result = HvdTrainer(
        train_loop,
        train_loop_config={"lr": args.lr, "momentum": args.momentum,
                           "batch_size": args.batch_size, "epochs": args.epochs},
        scaling_config=ray.train.ScalingConfig(num_workers=args.num_workers),
        run_config=ray.train.RunConfig(
            storage_path=args.storage or tempfile.mkdtemp(prefix="hvd-train-v2-"),
            name="digits", failure_config=ray.train.FailureConfig(max_failures=args.max_failures)),
        datasets={"train": train, "val": val},
    ).fit()
    seconds = time.monotonic() - started
    for _, metrics in sorted(result.best_checkpoints, key=lambda pair: pair[1]["epoch"]):
        print(f"epoch {metrics['epoch']}: loss {metrics['loss']:.4f}  "
              f"val accuracy {metrics['val_accuracy']:.3f}")
    print(f"{args.num_workers} workers, {args.epochs} epochs in {seconds:.1f} s; final checkpoint "
          f"scored on the driver: val accuracy {score(result.checkpoint, val):.3f}")


if __name__ == "__main__":
    main()
