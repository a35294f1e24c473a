"""TrainingOperator: the user's training logic, in Ray SGD's shape, on hvd-torch.

    class MyOperator(TrainingOperator):
        def setup(self, config):
            model = Net()
            optimizer = torch.optim.SGD(model.parameters(), lr=config["lr"])
            self.model, self.optimizer, self.criterion = self.register(
                models=model, optimizers=optimizer, criterion=nn.CrossEntropyLoss())
            self.register_data(train_loader=..., validation_loader=...)

One operator lives on each worker of a TorchTrainer. register() moves the
models to the worker's device, wraps every optimizer in
hvd.DistributedOptimizer and gives every rank rank 0's weights and optimizer
state; the trainer shards the registered loaders (sharding.py) and calls
train_epoch()/validate() with batches already on the device. The default
loops are Ray SGD's (one model, one optimizer, a criterion; batches of
(*features, target)); override any of train_epoch, train_batch, validate,
validate_batch, and state_dict/load_state_dict for state of your own.

This module is torch and hvd_torch only: it knows nothing of Ray, so an
operator can be built and tested under hvdrun too.
"""

from __future__ import annotations

import torch
from torch import nn

import hvd_torch as hvd

from .metrics import NUM_SAMPLES, AverageMeterCollection
from .precision import MixedPrecision

__all__ = ["SCHEDULER_STEP_FREQS", "TrainingOperator"]

SCHEDULER_STEP_FREQS = ("batch", "epoch", "manual")


class TrainingOperator:
    """Subclass and implement setup(config). Built by the trainer on every
    worker after hvd.init(); the constructor calls setup(config).
    world_rank, local_rank and world_size are hvd's, read when asked (they
    change when an elastic job resets).

    Attributes for setup() and the loops: config, world_rank, local_rank,
    world_size, device, use_gpu, use_fp16, scheduler_step_freq, global_step;
    after register(): model(s), optimizer(s), criterion, scheduler(s); after
    register_data(): train_loader, validation_loader (as given, unsharded).
    """

    def __init__(
        self,
        config: dict,
        device: torch.device,
        use_gpu: bool = False,
        use_fp16: bool = False,
        scheduler_step_freq: str | None = None,
        broadcast_initial_state: bool = True,
    ):
        if scheduler_step_freq not in (None, *SCHEDULER_STEP_FREQS):
            raise ValueError(
                f"scheduler_step_freq must be one of {SCHEDULER_STEP_FREQS} or None, got "
                f"{scheduler_step_freq!r}"
            )
        self._config = config
        self._device = device
        self._use_gpu = use_gpu
        self._use_fp16 = use_fp16
        self._scheduler_step_freq = scheduler_step_freq
        # Off in elastic jobs: there @hvd.elastic.run's first sync gives every
        # rank rank 0's state, and a worker that joins later must meet the
        # others in that sync, not in a broadcast of its own.
        self._broadcast_initial_state = broadcast_initial_state
        self._precision = MixedPrecision(use_fp16, device)
        self._models: list[nn.Module] = []
        self._optimizers: list = []
        self._criterion = None
        self._schedulers: list = []
        self._train_loader = None
        self._validation_loader = None
        self.global_step = 0
        self.setup(config)

    # -- for the user to implement

    def setup(self, config: dict) -> None:
        """Builds models, optimizers, data; calls register() and register_data()."""
        raise NotImplementedError(
            f"{type(self).__name__}.setup(config) must register the models and optimizers"
        )

    def state_dict(self) -> dict:
        """State of your own, saved with the trainer's (the registered objects
        are saved already). Must be picklable."""
        return {}

    def load_state_dict(self, state_dict: dict) -> None:
        """Restores what state_dict() returned."""

    # -- registration

    def register(self, *, models, optimizers, criterion=None, schedulers=None):
        """Registers the training objects; returns them ready to use.

        models, optimizers, schedulers: one object or a list (several models,
        as for a GAN). criterion: a loss module (a class is instantiated).
        Models go to the worker's device; optimizers come back as
        hvd.DistributedOptimizer, each gradient named after its model and
        parameter; every rank then holds rank 0's weights and optimizer state
        (a collective: every rank calls register). Returns models, optimizers,
        then criterion and schedulers if given, each a single object when one
        was given, else a list.
        """
        if self._models:
            raise RuntimeError("register() was called twice")
        model_list = _as_list(models, "models")
        optimizer_list = _as_list(optimizers, "optimizers")
        scheduler_list = _as_list(schedulers, "schedulers") if schedulers is not None else []
        if scheduler_list and self._scheduler_step_freq is None:
            raise ValueError(
                "schedulers were registered but scheduler_step_freq is None: pass "
                "scheduler_step_freq='batch', 'epoch' or 'manual' to the TorchTrainer"
            )
        self._models = [m.to(self._device) for m in model_list]
        names = _parameter_names(self._models)
        self._optimizers = [
            hvd.DistributedOptimizer(
                opt, named_parameters=_named(opt, names, j), op=hvd.Average
            )
            for j, opt in enumerate(optimizer_list)
        ]
        if isinstance(criterion, type):
            criterion = criterion()
        if isinstance(criterion, nn.Module):
            criterion = criterion.to(self._device)
        self._criterion = criterion
        self._schedulers = scheduler_list
        _rebind_schedulers(scheduler_list, dict(zip(map(id, optimizer_list), self._optimizers)))
        if self._broadcast_initial_state:
            self.broadcast_state()

        out = [_single_or_list(self._models, models), _single_or_list(self._optimizers, optimizers)]
        if criterion is not None:
            out.append(criterion)
        if schedulers is not None:
            out.append(_single_or_list(self._schedulers, schedulers))
        return tuple(out)

    def register_data(self, *, train_loader=None, validation_loader=None) -> None:
        """Registers the data: iterables of batches, usually DataLoaders. The
        trainer gives each rank its shard of a DataLoader (a DistributedSampler,
        re-seeded per epoch); other iterables are used as they are."""
        self._train_loader = train_loader
        self._validation_loader = validation_loader

    def broadcast_state(self) -> None:
        """Makes every rank's weights and optimizer state rank 0's (collective)."""
        for i, model in enumerate(self._models):
            hvd.broadcast_parameters(
                {f"model{i}.{k}": v for k, v in model.state_dict().items()}, root_rank=0
            )
        for optimizer in self._optimizers:
            hvd.broadcast_optimizer_state(optimizer, root_rank=0)

    # -- the default loops (Ray SGD's)

    def train_epoch(self, iterator, info: dict) -> dict:
        """One pass over iterator (this rank's shard, batches on the device);
        returns the epoch's metrics: each batch metric's sample-weighted mean,
        last_<metric>, num_samples and batch_count."""
        for model in self._models:
            model.train()
        meters = AverageMeterCollection()
        for batch_idx, batch in enumerate(iterator):
            batch_info = {"batch_idx": batch_idx, "global_step": self.global_step, **info}
            metrics = dict(self.train_batch(batch, batch_info))
            self._precision.end_batch()
            if self._scheduler_step_freq == "batch":
                self._step_schedulers()
            meters.update(metrics, n=metrics.pop(NUM_SAMPLES, 1))
            self.global_step += 1
        if self._scheduler_step_freq == "epoch":
            self._step_schedulers()
        return meters.summary()

    def train_batch(self, batch, batch_info: dict) -> dict:
        """A step on one batch of (*features, target): forward under autocast
        (use_fp16), backward, optimizer step. Returns {"train_loss", "num_samples"}."""
        model, optimizer, criterion = self._single("train_batch")
        *features, target = batch
        with self.autocast():
            output = model(*features)
            loss = criterion(output, target)
        optimizer.zero_grad()
        self.backward(loss)
        self.optimizer_step(optimizer)
        return {"train_loss": loss.item(), NUM_SAMPLES: target.size(0)}

    def validate(self, val_iterator, info: dict) -> dict:
        """Evaluation over val_iterator without gradients; metrics as train_epoch."""
        for model in self._models:
            model.eval()
        meters = AverageMeterCollection()
        with torch.no_grad():
            for batch_idx, batch in enumerate(val_iterator):
                batch_info = {"batch_idx": batch_idx, **info}
                metrics = dict(self.validate_batch(batch, batch_info))
                meters.update(metrics, n=metrics.pop(NUM_SAMPLES, 1))
        return meters.summary()

    def validate_batch(self, batch, batch_info: dict) -> dict:
        """Loss on one batch of (*features, target), and accuracy when the
        output is class scores for integer labels (Ray SGD reported accuracy
        always; for a regression it would be meaningless, so it is left out)."""
        model, _, criterion = self._single("validate_batch")
        *features, target = batch
        with self.autocast():
            output = model(*features)
            loss = criterion(output, target)
        metrics = {"val_loss": loss.item(), NUM_SAMPLES: target.size(0)}
        if output.dim() == 2 and target.dim() == 1 and not target.is_floating_point():
            correct = (output.argmax(1) == target).sum().item()
            metrics["val_accuracy"] = correct / target.size(0)
        return metrics

    # -- helpers for the loops (also for overrides)

    def autocast(self):
        """The forward pass's context: torch.autocast with use_fp16 (float16 on
        a GPU, bfloat16 on a CPU), else a no-op."""
        return self._precision.autocast()

    def backward(self, loss: torch.Tensor) -> None:
        """loss.backward(), scaled by the gradient scaler with use_fp16."""
        self._precision.backward(loss)

    def optimizer_step(self, optimizer) -> None:
        """optimizer.step(); with use_fp16, the averaged gradients are unscaled
        first and a step with inf/NaN gradients is skipped (on every rank)."""
        self._precision.step(optimizer)

    def _step_schedulers(self, metric=None) -> None:
        for scheduler in self._schedulers:
            if metric is None:
                scheduler.step()
            else:
                scheduler.step(metric)

    def _single(self, method: str):
        if len(self._models) != 1 or len(self._optimizers) != 1 or self._criterion is None:
            raise NotImplementedError(
                f"the default {method} needs one model, one optimizer and a criterion "
                f"(registered: {len(self._models)} model(s), {len(self._optimizers)} "
                f"optimizer(s), criterion {'set' if self._criterion is not None else 'None'}); "
                f"override {method} in {type(self).__name__}"
            )
        return self._models[0], self._optimizers[0], self._criterion

    # -- read-only views

    config = property(lambda self: self._config)
    # Read from hvd each time: in an elastic job they change at every reset.
    world_rank = property(lambda self: hvd.rank())
    local_rank = property(lambda self: hvd.local_rank())
    world_size = property(lambda self: hvd.size())
    device = property(lambda self: self._device)
    use_gpu = property(lambda self: self._use_gpu)
    use_fp16 = property(lambda self: self._use_fp16)
    scheduler_step_freq = property(lambda self: self._scheduler_step_freq)
    models = property(lambda self: list(self._models))
    optimizers = property(lambda self: list(self._optimizers))
    schedulers = property(lambda self: list(self._schedulers))
    criterion = property(lambda self: self._criterion)
    train_loader = property(lambda self: self._train_loader)
    validation_loader = property(lambda self: self._validation_loader)
    scaler = property(lambda self: self._precision.scaler)

    @property
    def model(self):
        return self._first(self._models, "model")

    @property
    def optimizer(self):
        return self._first(self._optimizers, "optimizer")

    @property
    def scheduler(self):
        return self._schedulers[0] if self._schedulers else None

    def _first(self, items, what):
        if not items:
            raise AttributeError(f"no {what} registered yet (call self.register(...) in setup)")
        return items[0]

    # Plain attribute assignment in setup (self.model, self.optimizer = ...)
    # would otherwise fail on the read-only properties above: accept it when
    # the value is what register() returned.
    def __setattr__(self, name, value):
        if name in _REGISTERED and isinstance(getattr(type(self), name, None), property):
            current = getattr(self, name, None)
            if value is not current and not (isinstance(current, list) and value == current):
                raise AttributeError(
                    f"{name} is set by register(); assign what register() returned"
                )
            return
        super().__setattr__(name, value)


_REGISTERED = {"model", "models", "optimizer", "optimizers", "criterion", "scheduler",
               "schedulers"}  # fmt: skip


def _as_list(value, what: str) -> list:
    items = list(value) if isinstance(value, (list, tuple)) else [value]
    if not items or any(v is None for v in items):
        raise ValueError(f"register(): {what} must be given (one object or a list)")
    return items


def _single_or_list(registered: list, given):
    return list(registered) if isinstance(given, (list, tuple)) else registered[0]


def _parameter_names(models: list) -> dict:
    """parameter -> unique name: "<name>" for one model, "model<i>.<name>" for several."""
    names = {}
    for i, model in enumerate(models):
        prefix = f"model{i}." if len(models) > 1 else ""
        for name, p in model.named_parameters():
            names.setdefault(p, prefix + name)
    return names


def _rebind_schedulers(schedulers: list, wrapped: dict) -> None:
    """Points schedulers built on an original optimizer at its
    DistributedOptimizer. The wrapper starts out sharing the original's param
    groups, but any load_state_dict() on it (broadcast_optimizer_state on the
    other ranks, a checkpoint) gives it new ones; a scheduler still holding the
    original would then change the learning rate on rank 0 only, and the
    ranks' weights would drift apart."""
    for scheduler in schedulers:
        inner = getattr(scheduler, "_schedulers", None)  # SequentialLR, ChainedScheduler
        if inner:
            _rebind_schedulers(list(inner), wrapped)
        target = wrapped.get(id(getattr(scheduler, "optimizer", None)))
        if target is not None:
            scheduler.optimizer = target
            _track_steps(target)


def _track_steps(optimizer) -> None:
    """What torch's LRScheduler does to the optimizer it is built on: mark
    step() calls, so its check of the call order does not warn for nothing."""
    if getattr(optimizer.step, "_wrapped_by_lr_sched", False):
        return
    step = type(optimizer).step

    def tracked(*args, **kwargs):
        optimizer._opt_called = True
        return step(optimizer, *args, **kwargs)

    tracked._wrapped_by_lr_sched = True
    optimizer.step = tracked


def _named(optimizer, names: dict, index: int) -> list:
    """The optimizer's (name, parameter) pairs; parameters of no registered
    model get "optimizer<index>.param<k>"."""
    params = [p for group in optimizer.param_groups for p in group["params"]]
    return [(names.get(p, f"optimizer{index}.param{k}"), p) for k, p in enumerate(params)]
