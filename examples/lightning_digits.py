"""A PyTorch Lightning model on scikit-learn's digits, trained with DDP on the "hvd" backend.

    python examples/lightning_digits.py --devices 2            (Lightning starts the second rank)
    hvdrun -np 3 python examples/lightning_digits.py           (hvdrun starts all three)
    python examples/lightning_digits.py --devices 2 --backend gloo   (torch's own, to compare)
    hvdrun -np 2 python examples/lightning_digits.py --ckpt-dir /tmp/ckpt     (a checkpoint per
    hvdrun -np 2 python examples/lightning_digits.py --resume /tmp/ckpt/last.ckpt       epoch)

The only hvd-specific line is the strategy: HvdStrategy is Lightning's DDPStrategy on the
"hvd" torch.distributed backend, so DDP's gradient buckets, `self.log(..., sync_dist=True)`
and Lightning's barriers and broadcasts move through hvd-torch's engine. Under hvdrun it
takes every rank's place in the job from hvdrun (--devices and --num-nodes then default to
hvdrun's ranks per host and hosts); run as one process, Lightning starts the other
--devices - 1 ranks itself. `--backend gloo` runs the same training on torch's gloo: the
final weights agree to float rounding (the backends may sum in different orders).

At the end rank 0 prints the loss, the validation accuracy and the weights' sum, norm and
sha256 prefix; the script exits with 1 if the ranks' weights differ.
"""

import argparse
import hashlib
import os
import sys

import pytorch_lightning as pl
import torch
import torch.distributed as dist
import torch.nn.functional as F
from ddp_on_hvd import exit_now  # leaves without the interpreter's exit (gloo's threads)
from digits_data import load_digits
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from hvd_torch.integrations.lightning import HvdStrategy

VALIDATION = 297  # the last 297 of the 1797 images; the first 1500 train


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--devices", type=int, default=int(os.environ.get("LOCAL_WORLD_SIZE", 2)),
                   help="ranks on this host (default: hvdrun's or torchrun's, else 2)")
    p.add_argument("--num-nodes", type=int, default=int(os.environ.get("GROUP_WORLD_SIZE", 1)),
                   help="hosts (default: hvdrun's or torchrun's, else 1)")
    p.add_argument("--backend", default="hvd", help="hvd (default) or gloo")
    p.add_argument("--epochs", type=int, default=3)
    p.add_argument("--batch-size", type=int, default=32, help="per rank")
    p.add_argument("--lr", type=float, default=0.2)
    p.add_argument("--ckpt-dir", default=None, help="save a checkpoint here after every epoch")
    p.add_argument("--resume", default=None, help="a checkpoint to resume from")
    return p.parse_args(argv)


class DigitsModule(pl.LightningModule):
    """A 64-32-10 perceptron (2410 parameters): the point is the plumbing, not the model."""

    def __init__(self, lr=0.2):
        super().__init__()
        self.save_hyperparameters()
        self.net = nn.Sequential(nn.Linear(64, 32), nn.ReLU(), nn.Linear(32, 10))

    def training_step(self, batch, batch_idx):
        x, y = batch
        loss = F.cross_entropy(self.net(x), y)
        # sync_dist: the epoch's mean over every rank's batches, not rank 0's alone.
        self.log("train_loss", loss, on_step=False, on_epoch=True, sync_dist=True)
        return loss

    def validation_step(self, batch, batch_idx):
        x, y = batch
        accuracy = (self.net(x).argmax(1) == y).float().mean()
        self.log("val_accuracy", accuracy, sync_dist=True)

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=self.hparams.lr, momentum=0.9)


def digits_loaders(batch_size):
    """(train, validation) loaders over every image; Lightning gives each rank its shard
    (a DistributedSampler: reshuffled each epoch, the same shards on any backend)."""
    digits = load_digits()
    x = torch.tensor(digits.data, dtype=torch.float32) / 16.0
    y = torch.tensor(digits.target)
    train = TensorDataset(x[:-VALIDATION], y[:-VALIDATION])
    val = TensorDataset(x[-VALIDATION:], y[-VALIDATION:])
    return (DataLoader(train, batch_size=batch_size, shuffle=True),
            DataLoader(val, batch_size=batch_size))


def make_trainer(args, callbacks=(), **overrides):
    """A quiet CPU Trainer on args.backend: no progress bar, summary or logger files."""
    callbacks = list(callbacks)
    if args.ckpt_dir:
        callbacks.append(pl.callbacks.ModelCheckpoint(
            dirpath=args.ckpt_dir, filename="{epoch}", save_top_k=-1, save_last=True))
    options = dict(accelerator="cpu", devices=args.devices, num_nodes=args.num_nodes,
                   strategy=HvdStrategy(process_group_backend=args.backend),
                   max_epochs=args.epochs, callbacks=callbacks, logger=False,
                   enable_progress_bar=False, enable_model_summary=False,
                   enable_checkpointing=bool(args.ckpt_dir))
    options.update(overrides)
    return pl.Trainer(**options)


def weights(model):
    return torch.cat([p.detach().reshape(-1) for p in model.parameters()])


def train(args, module_class=DigitsModule, callbacks=()):
    """fit() from the start or from args.resume; returns (trainer, model)."""
    pl.seed_everything(0, verbose=False)  # the same initial weights and shuffles on any backend
    model = module_class(args.lr)
    trainer = make_trainer(args, callbacks)
    trainer.fit(model, *digits_loaders(args.batch_size), ckpt_path=args.resume)
    return trainer, model


def main(args):
    trainer, model = train(args)
    w = weights(model)
    digest = hashlib.sha256(w.numpy().tobytes()).hexdigest()[:16]
    digests = [None] * dist.get_world_size()
    dist.all_gather_object(digests, digest)  # Lightning keeps its process group after fit
    if len(set(digests)) != 1:
        print(f"rank {trainer.global_rank}: weights differ across ranks: {digests}",
              file=sys.stderr)
        return 1
    if trainer.is_global_zero:
        metrics = trainer.callback_metrics
        print(f"epoch {trainer.current_epoch}: train_loss {metrics['train_loss'].item():.4f}  "
              f"val_accuracy {metrics['val_accuracy'].item():.4f}  "
              f"(backend {dist.get_backend()}, {trainer.world_size} ranks)", flush=True)
        print(f"weights: sum {w.sum().item():.6f}  norm {w.norm().item():.6f}", flush=True)
        print(f"all {trainer.world_size} ranks hold identical weights "
              f"(sha256 prefix {digest})", flush=True)
    return 0


if __name__ == "__main__":
    ARGS = parse_args()
    # On either backend: Lightning makes a Gloo group of its own (its data connector's
    # _InfiniteBarrier), whose threads may abort the interpreter's exit (see exit_now).
    exit_now(main(ARGS))
