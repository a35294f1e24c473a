"""The digits CNN through Ray SGD's trainer API: a TrainingOperator on 2 workers.

    python examples/ray_trainer_digits.py                  (a local Ray, 2 workers, 5 epochs)
    python examples/ray_trainer_digits.py --epochs 10 --use-fp16
    python examples/ray_trainer_digits.py --address auto   (an existing cluster)

DigitsOperator.setup() builds what examples/digits_train.py builds by hand
(the model, SGD with the learning rate scaled by the number of workers, a
warm-up, the data) and registers it; TorchTrainer runs it on every worker:
the optimizer is wrapped in hvd.DistributedOptimizer, rank 0's weights are
broadcast, each worker trains on its shard, and train()/validate() return
metrics averaged over the workers. After training the script saves a
checkpoint, fetches rank 0's model with get_model() and scores it on the
validation set on the driver. Everything is defined here and travels to the
workers by value; scikit-learn's digits are bundled, nothing is downloaded.
"""

import argparse
import os
import tempfile
import time

import numpy as np
import ray
import torch
import torch.nn.functional as F
from digits_data import load_digits
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

import hvd_torch as hvd
from ray_integration import TorchTrainer, TrainingOperator
from progress import progress


def parse_args():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--num-workers", type=int, default=2)
    p.add_argument("--epochs", type=int, default=5)
    p.add_argument("--lr", type=float, default=0.025, help="one worker's rate; x workers")
    p.add_argument("--momentum", type=float, default=0.9)
    p.add_argument("--batch-size", type=int, default=32, help="per worker")
    p.add_argument("--use-fp16", action="store_true", help="bfloat16 on CPUs, float16 on GPUs")
    p.add_argument("--use-gpu", action="store_true")
    p.add_argument("--checkpoint", default=None, help="default: a temporary file")
    p.add_argument("--address", default=None, help="a running cluster, e.g. auto")
    return p.parse_args()


class DigitsNet(nn.Module):
    """examples/digits_allreduce.py's CNN: two 3x3 convolutions, two linear layers."""

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


def load_data(seed=0):
    """The same split everywhere: 1/6 of the images for validation."""
    digits = load_digits()
    x = torch.from_numpy(digits.images.astype(np.float32) / 16.0).unsqueeze(1)
    y = torch.from_numpy(digits.target.astype(np.int64))
    order = torch.randperm(len(y), generator=torch.Generator().manual_seed(seed))
    n_val = len(y) // 6
    return TensorDataset(x[order[n_val:]], y[order[n_val:]]), TensorDataset(
        x[order[:n_val]], y[order[:n_val]]
    )


class DigitsOperator(TrainingOperator):
    def setup(self, config):
        torch.manual_seed(0)
        train_set, val_set = load_data()
        train_loader = DataLoader(train_set, batch_size=config["batch_size"], shuffle=True)
        val_loader = DataLoader(val_set, batch_size=256)
        model = DigitsNet()
        optimizer = torch.optim.SGD(
            model.parameters(), lr=hvd.scale_lr(config["lr"]), momentum=config["momentum"]
        )
        # The loaders are sharded by the trainer: an epoch is len(train_loader)
        # / workers steps per worker. Warm up from lr to lr x workers in one epoch.
        steps_per_epoch = -(-len(train_loader) // self.world_size)
        warmup = hvd.warmup_scheduler(optimizer, 1, steps_per_epoch, config["lr"])
        self.model, self.optimizer, self.criterion, self.scheduler = self.register(
            models=model, optimizers=optimizer, criterion=nn.CrossEntropyLoss(),
            schedulers=warmup,
        )  # fmt: skip
        self.register_data(train_loader=train_loader, validation_loader=val_loader)


def main():
    args = parse_args()
    if args.address:
        ray.init(address=args.address)
    else:
        cpus = max(os.cpu_count() or 1, args.num_workers)
        ray.init(address="local", num_cpus=cpus, include_dashboard=False)

    trainer = TorchTrainer(
        training_operator_cls=DigitsOperator,
        num_workers=args.num_workers,
        use_gpu=args.use_gpu,
        use_fp16=args.use_fp16,
        scheduler_step_freq="batch",  # the warm-up moves every step
        config={"lr": args.lr, "momentum": args.momentum, "batch_size": args.batch_size},
    )
    started = time.perf_counter()
    bar = progress(range(args.epochs), desc="training", unit="epoch")  # the driver's bar
    for _ in bar:
        train = trainer.train()
        val = trainer.validate()
        bar.set_postfix(val_accuracy=f"{val['val_accuracy']:.3f}")
        bar.write(
            f"epoch {train['epoch']}: train_loss {train['train_loss']:.4f}  "
            f"val_loss {val['val_loss']:.4f}  val_accuracy {val['val_accuracy']:.3f}  "
            f"({train['num_samples']} samples on {args.num_workers} workers, "
            f"{time.perf_counter() - started:.1f}s)"
        )
    bar.close()
    checkpoint = args.checkpoint or os.path.join(tempfile.mkdtemp(), "digits_trainer.pt")
    trainer.save(checkpoint)
    model = trainer.get_model()
    trainer.shutdown()

    _, val_set = load_data()
    x, y = val_set.tensors
    with torch.no_grad():
        accuracy = (model(x).argmax(1) == y).float().mean().item()
    print(f"checkpoint: {checkpoint}")
    print(f"rank 0's model on the driver: accuracy {accuracy:.3f} on {len(y)} validation images")


if __name__ == "__main__":
    main()
