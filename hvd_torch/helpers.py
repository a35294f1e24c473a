"""Small recipes every data-parallel training script needs.

- metric_average: a metric (loss, accuracy) averaged over ranks, as in
  Horovod's examples.
- scale_lr, LRWarmup / warmup_scheduler: the linear scaling rule with gradual
  warm-up (Goyal et al., "Accurate, Large Minibatch SGD", 2017), which Horovod's
  examples use: with n ranks the global batch is n times larger, so the
  learning rate is n times larger, reached linearly over the first epochs.
- distributed_sampler: torch's DistributedSampler for this rank.

Each call that communicates is a collective: every rank must make it.
"""

import numbers

import torch
from torch.optim.lr_scheduler import LambdaLR
from torch.utils.data.distributed import DistributedSampler

from hvd_torch import basics
from hvd_torch.ops import allreduce


def metric_average(value, name=None):
    """Averages `value` over all ranks (a collective: every rank must call it).

    A Python number (int, float, bool, numpy scalar) returns a Python float. A
    tensor returns a tensor of the same shape, detached from the graph;
    integer and bool tensors are averaged as float64 (an integer Average would
    floor-divide the sum). `name` matches the call across ranks; without it
    unnamed calls match in the order they are made.
    """
    if isinstance(value, torch.Tensor):
        tensor = value.detach()
        if not tensor.dtype.is_floating_point:
            tensor = tensor.to(torch.float64)
        return allreduce(tensor, name=name, op=basics.Average)
    if not isinstance(value, numbers.Real):
        raise TypeError(
            f"metric_average: expected a number or a tensor, got {type(value).__name__}")
    tensor = torch.tensor(float(value), dtype=torch.float64)
    return allreduce(tensor, name=name, op=basics.Average).item()


def scale_lr(base_lr, size=None):
    """The linear scaling rule: `base_lr` (tuned for one rank's batch) times the
    number of ranks (`size`, default hvd.size())."""
    return base_lr * (basics.size() if size is None else size)


class _WarmupFactor:
    """LambdaLR's multiplier for one param group: `scale` times the warm-up
    multiplier, from 1 at step 0 linearly to `size` at `warmup_steps`, then
    `size`. A class rather than a closure so that the scheduler's
    state_dict() saves it."""

    def __init__(self, scale, size, warmup_steps):
        self.scale = scale
        self.size = size
        self.warmup_steps = warmup_steps

    def __call__(self, step):
        if step >= self.warmup_steps:
            return self.scale * self.size
        return self.scale * (1.0 + (self.size - 1) * step / self.warmup_steps)


class LRWarmup(LambdaLR):
    """Warm-up from `base_lr` to `base_lr * size` over `warmup_epochs` epochs.

    Call `step()` once per optimizer step (per batch, not per epoch). After
    `s` calls, each param group's learning rate is

        base_lr * (1 + (size - 1) * min(s, W) / W),   W = warmup_epochs * steps_per_epoch

    so the first batch uses `base_lr` and every batch from step W on uses
    `base_lr * size` (with warmup_epochs=0, at once). `base_lr` is the rate
    tuned for one rank; a list gives one per param group. `size` defaults to
    hvd.size().

    The rates are absolute: the optimizer may be built with any lr. Build it
    with lr=hvd.scale_lr(base_lr) and a scheduler that follows (e.g. through
    torch.optim.lr_scheduler.SequentialLR) starts from the scaled rate.

    Horovod's examples compute the same ramp one step ahead (the first batch
    already uses base_lr * (1 + (size - 1) / W)); this one starts from
    base_lr exactly, as in Goyal et al.
    """

    def __init__(self, optimizer, warmup_epochs, steps_per_epoch, base_lr, size=None,
                 last_epoch=-1):
        if warmup_epochs < 0:
            raise ValueError(f"LRWarmup: warmup_epochs must be >= 0, got {warmup_epochs}")
        if steps_per_epoch <= 0:
            raise ValueError(f"LRWarmup: steps_per_epoch must be > 0, got {steps_per_epoch}")
        size = basics.size() if size is None else size
        if size < 1:
            raise ValueError(f"LRWarmup: size must be >= 1, got {size}")
        groups = optimizer.param_groups
        base_lrs = list(base_lr) if isinstance(base_lr, (list, tuple)) else [base_lr] * len(groups)
        if len(base_lrs) != len(groups):
            raise ValueError(f"LRWarmup: {len(base_lrs)} base_lr values for "
                             f"{len(groups)} param groups")
        # LambdaLR multiplies each group's 'initial_lr' (set from 'lr' by the
        # first scheduler built on this optimizer); divide it out so the rate
        # is absolute.
        factors = []
        for i, (group, lr) in enumerate(zip(groups, base_lrs)):
            initial = float(group.get("initial_lr", group["lr"]))
            if initial == 0:
                raise ValueError(f"LRWarmup: param group {i} has lr 0; build the optimizer "
                                 f"with a nonzero lr (e.g. hvd.scale_lr(base_lr))")
            factors.append(_WarmupFactor(lr / initial, size, warmup_epochs * steps_per_epoch))
        self.warmup_steps = warmup_epochs * steps_per_epoch
        super().__init__(optimizer, factors, last_epoch)


def warmup_scheduler(optimizer, warmup_epochs, steps_per_epoch, base_lr, size=None):
    """Returns LRWarmup(optimizer, warmup_epochs, steps_per_epoch, base_lr, size)."""
    return LRWarmup(optimizer, warmup_epochs, steps_per_epoch, base_lr, size)


def distributed_sampler(dataset, shuffle=True, seed=0, drop_last=False):
    """torch.utils.data.distributed.DistributedSampler over hvd.size() replicas
    for this rank. Call `set_epoch(epoch)` every epoch so the shuffle differs.

    Without drop_last, the index list is padded by repeating its start so that
    every rank gets the same number of samples (ceil(len / size)); with it, the
    tail is dropped (floor(len / size) each).
    """
    return DistributedSampler(dataset, num_replicas=basics.size(), rank=basics.rank(),
                              shuffle=shuffle, seed=seed, drop_last=drop_last)
