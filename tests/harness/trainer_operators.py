"""TrainingOperators for the trainer's tests, on the data and model of
mlp_reference.py (a tiny 3-class problem and a two-layer MLP, small enough that
an epoch takes milliseconds).

On the workers' PYTHONPATH (tests/, see ray_harness), so the operators
travel by name. Knobs in the config make an operator slow, report its
progress to a file, or fail, for the failure and elastic tests.
"""

from __future__ import annotations

import os
import time

import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from mlp_reference import CLASSES, FEATURES, make_data, make_model  # noqa: F401  (re-exported)

from ray_integration import TrainingOperator


class MLPOperator(TrainingOperator):
    """One model, SGD with momentum, a per-epoch StepLR, both loaders; the
    default loops. Each rank seeds its model differently on purpose: only
    register()'s broadcast makes them equal."""

    def setup(self, config):
        model = make_model(config.get("seed", 0) + self.world_rank)
        optimizer = torch.optim.SGD(
            model.parameters(), lr=config["lr"], momentum=config.get("momentum", 0.9)
        )
        scheduler = torch.optim.lr_scheduler.StepLR(
            optimizer, step_size=1, gamma=config.get("gamma", 0.5)
        )
        self.model, self.optimizer, self.criterion, self.scheduler = self.register(
            models=model, optimizers=optimizer, criterion=nn.CrossEntropyLoss(),
            schedulers=scheduler,
        )  # fmt: skip
        x, y = make_data()
        xv, yv = make_data(32, seed=1)
        self.register_data(
            train_loader=DataLoader(TensorDataset(x, y), batch_size=8, shuffle=True),
            validation_loader=DataLoader(TensorDataset(xv, yv), batch_size=16),
        )
        # Operator state of its own, saved with the trainer's: the learning
        # rate the weights' lineage started with (PBT's exploit carries it).
        self.origin_lr = config["lr"]
        # What autocast made of the forward pass (use_fp16).
        self.output_dtypes = set()
        self.model.register_forward_hook(lambda m, i, out: self.output_dtypes.add(str(out.dtype)))

    def train_batch(self, batch, batch_info):
        config = self.config
        progress = config.get("progress_file")
        if progress and self.world_rank == 0:
            with open(progress, "a") as f:
                f.write(f"{batch_info['epoch_idx']} {batch_info['batch_idx']} {os.getpid()} "
                        f"{time.time():.3f}\n")  # fmt: skip
        if config.get("fail_rank") == self.world_rank and batch_info["batch_idx"] == 1:
            raise ValueError(f"rank {self.world_rank} fails on purpose")
        time.sleep(config.get("batch_sleep", 0))
        return super().train_batch(batch, batch_info)

    def train_epoch(self, iterator, info):
        stats = super().train_epoch(iterator, info)
        stats["lr"] = self.optimizer.param_groups[0]["lr"]
        stats["origin_lr"] = self.origin_lr
        return stats

    def state_dict(self):
        return {"origin_lr": self.origin_lr}

    def load_state_dict(self, state_dict):
        self.origin_lr = state_dict["origin_lr"]


class TwoModelOperator(TrainingOperator):
    """Two models, each with its own optimizer (the shape of a GAN), and a
    train_batch of its own: the same parameter names in both models, so only
    register()'s model<i>. prefixes keep their gradients' allreduces apart."""

    def setup(self, config):
        models = [make_model(10 + self.world_rank), make_model(20 + self.world_rank)]
        optimizers = [torch.optim.SGD(m.parameters(), lr=config["lr"]) for m in models]
        self.models_, self.optimizers_ = self.register(models=models, optimizers=optimizers)
        x, y = make_data()
        self.register_data(
            train_loader=DataLoader(TensorDataset(x, y), batch_size=8, shuffle=True)
        )

    def train_batch(self, batch, batch_info):
        x, y = batch
        losses = {}
        for i, (model, optimizer) in enumerate(zip(self.models_, self.optimizers_)):
            with self.autocast():
                loss = nn.functional.cross_entropy(model(x), y)
            optimizer.zero_grad()
            self.backward(loss)
            self.optimizer_step(optimizer)
            losses[f"loss_{i}"] = loss.item()
        return {**losses, "num_samples": len(y)}
