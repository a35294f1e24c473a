"""OperatorRunner: one worker's TrainingOperator and the trainer's calls on it.

The driver (torch_trainer.py) calls the same methods on every worker at once:
train() and validate() shard the registered loaders for this rank, move
batches to the device and run the operator's loops; state_dict() and
load_state_dict() cover everything a checkpoint needs (models, optimizers,
schedulers, gradient scaler, epoch and step counters, the operator's own
state). Static jobs keep one runner per worker actor for the trainer's life;
elastic jobs build one per call (elastic_call.py).

torch and hvd_torch only, no Ray. One thread: the worker's.
"""

from __future__ import annotations

import copy
import dataclasses
import itertools

import torch

import hvd_torch as hvd

from .sharding import shard_loader

__all__ = ["OperatorRunner", "RunnerOptions"]


@dataclasses.dataclass(frozen=True)
class RunnerOptions:
    """The trainer's per-job choices, sent to every worker."""

    use_gpu: bool = False
    use_fp16: bool = False
    scheduler_step_freq: str | None = None
    add_dist_sampler: bool = True
    seed: int = 0
    elastic: bool = False


class OperatorRunner:
    """Builds operator_cls(config, ...) on this worker (after hvd.init()) and
    runs the trainer's calls on it."""

    def __init__(self, operator_cls, config: dict, options: RunnerOptions):
        hvd.init()
        self.options = options
        self.device = _device(options)
        self.reset(operator_cls, config)

    def reset(self, operator_cls, config: dict) -> None:
        """A new operator from config (its setup() again, rank 0's fresh
        state broadcast) on this running worker: epoch and step back to 0.
        A collective: every worker resets."""
        self.epoch = 0  # epochs trained: the sampler's seed offset for the next one
        self.operator = operator_cls(
            config,
            device=self.device,
            use_gpu=self.options.use_gpu,
            use_fp16=self.options.use_fp16,
            scheduler_step_freq=self.options.scheduler_step_freq,
            broadcast_initial_state=not self.options.elastic,
        )
        if not self.operator.models or not self.operator.optimizers:
            raise RuntimeError(
                f"{operator_cls.__name__}.setup() registered no model or no optimizer: call "
                "self.register(models=..., optimizers=...)"
            )

    # -- the trainer's calls

    def train(self, num_steps: int | None = None, info: dict | None = None) -> dict:
        """One epoch (or num_steps batches) of the operator's train_epoch."""
        loader = self.operator.train_loader
        if loader is None:
            raise RuntimeError(
                f"{type(self.operator).__name__} registered no train_loader "
                "(self.register_data(train_loader=...))"
            )
        info = {"epoch_idx": self.epoch, "num_steps": num_steps, **(info or {})}
        stats = self.operator.train_epoch(self._batches(loader, num_steps), info)
        self.epoch += 1
        return {"epoch": self.epoch, **stats}

    def validate(self, num_steps: int | None = None, info: dict | None = None) -> dict:
        loader = self.operator.validation_loader
        if loader is None:
            raise RuntimeError(
                f"{type(self.operator).__name__} registered no validation_loader "
                "(self.register_data(validation_loader=...))"
            )
        info = {"epoch_idx": self.epoch, "num_steps": num_steps, **(info or {})}
        return self.operator.validate(self._batches(loader, num_steps), info)

    def has_validation(self) -> bool:
        return self.operator.validation_loader is not None

    def update_scheduler(self, metric) -> None:
        """scheduler.step(metric) on every registered scheduler ('manual'
        stepping, e.g. ReduceLROnPlateau)."""
        self.operator._step_schedulers(metric)

    def state_dict(self) -> dict:
        """Everything a resumed run needs, with tensors on the CPU."""
        op = self.operator
        return _to_cpu(
            {
                "epoch": self.epoch,
                "global_step": op.global_step,
                "models": [m.state_dict() for m in op.models],
                "optimizers": [o.state_dict() for o in op.optimizers],
                "schedulers": [s.state_dict() for s in op.schedulers],
                "scaler": op._precision.state_dict(),
                "operator": op.state_dict(),
            }
        )

    def load_state_dict(self, state: dict, keep_hyperparameters: bool = False) -> None:
        """Loads state_dict()'s output. keep_hyperparameters: the optimizers
        keep their param groups' current settings (lr, momentum, ...) and take
        only the per-parameter state; for a Tune trial restored from another
        trial's checkpoint under a new config (PBT's exploit)."""
        op = self.operator
        _check_counts(state, op)
        for model, saved in zip(op.models, state["models"]):
            model.load_state_dict(saved)
        for optimizer, saved in zip(op.optimizers, state["optimizers"]):
            groups = optimizer.param_groups
            current = [{k: v for k, v in g.items() if k != "params"} for g in groups]
            # A copy: optimizers keep the tensors they are given, and the
            # caller's state (a commit, the driver's) must not train along.
            optimizer.load_state_dict(copy.deepcopy(saved))
            if keep_hyperparameters:
                for group, settings in zip(optimizer.param_groups, current):
                    group.update(settings)
        for scheduler, saved in zip(op.schedulers, state["schedulers"]):
            scheduler.load_state_dict(saved)
        op._precision.load_state_dict(state.get("scaler"))
        op.load_state_dict(state.get("operator") or {})
        op.global_step = state["global_step"]
        self.epoch = state["epoch"]

    def get_models(self) -> list:
        """Copies of the models on the CPU (the driver unpickles them)."""
        return [copy.deepcopy(m).cpu() for m in self.operator.models]

    def apply(self, fn):
        return fn(self.operator)

    # -- internals

    def _batches(self, loader, num_steps):
        if self.options.add_dist_sampler:
            loader = shard_loader(loader, hvd.rank(), hvd.size(), self.epoch, self.options.seed)
        batches = (_to_device(b, self.device) for b in loader)
        return itertools.islice(batches, num_steps) if num_steps is not None else batches


def _device(options: RunnerOptions) -> torch.device:
    if not options.use_gpu:
        return torch.device("cpu")
    # The GPU hvd_torch uses for this rank (hvd_torch/gpu.py). Static jobs list
    # the node's GPUs with the worker's own at that index (topology.py); elastic
    # workers see only their own GPUs (Ray's assignment).
    index = hvd.local_rank() % torch.cuda.device_count()
    torch.cuda.set_device(index)
    return torch.device("cuda", index)


def _to_device(batch, device):
    if isinstance(batch, torch.Tensor):
        return batch.to(device, non_blocking=True)
    if isinstance(batch, (list, tuple)):
        moved = [_to_device(b, device) for b in batch]
        return type(batch)(moved) if isinstance(batch, list) else tuple(moved)
    if isinstance(batch, dict):
        return {k: _to_device(v, device) for k, v in batch.items()}
    return batch


def _to_cpu(value):
    if isinstance(value, torch.Tensor):
        return value.detach().cpu()
    if isinstance(value, dict):
        return {k: _to_cpu(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_to_cpu(v) for v in value]
    if isinstance(value, tuple):
        return tuple(_to_cpu(v) for v in value)
    return value


def _check_counts(state: dict, op) -> None:
    for key, have in (("models", op.models), ("optimizers", op.optimizers),
                      ("schedulers", op.schedulers)):  # fmt: skip
        if len(state[key]) != len(have):
            raise ValueError(
                f"load_state_dict: the state has {len(state[key])} {key}, the operator "
                f"registered {len(have)}"
            )
