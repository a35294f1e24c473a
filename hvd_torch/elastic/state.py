"""Training state kept in memory across resets: State, ObjectState, TorchState.

A state has three copies of the truth to keep apart:
  - the live objects the training loop mutates (model, optimizer, epoch, ...);
  - the committed copy, taken by commit(): deep copies in host memory;
  - rank 0's live objects, which sync() hands to every rank after a reset.

restore() puts the committed copy back into the live objects (after a failed
collective, the live ones may hold half a step).  sync() makes every rank's live
objects equal to rank 0's and then takes them as the committed copy: after a reset
rank 0's live state is always committed (restored, or interrupted at a commit), and a
worker that just joined must not fall back to its untrained initial state if the next
round fails before its first commit.

commit(), sync() and check_host_updates() are collectives: every rank calls them
at the same point.  restore() and save() of plain objects are local.
"""

from __future__ import annotations

import copy

import torch

from hvd_torch.basics import rank
from hvd_torch.exceptions import HostsUpdatedInterrupt
from hvd_torch.functions import (
    allgather_object,
    broadcast_object,
    broadcast_optimizer_state,
    broadcast_parameters,
)
from hvd_torch.ops import broadcast_

from . import worker_rendezvous
from .sampler import ElasticSampler

__all__ = ["ObjectState", "State", "TorchState"]


class State:
    """Base class: reset callbacks, commit() and host-update checks.

    Subclasses implement save(), restore() and sync().  bcast_object and get_rank are
    Horovod's constructor arguments; they default to this library's functions.
    """

    def __init__(self, bcast_object=broadcast_object, get_rank=rank):
        self._bcast_object = bcast_object
        self._rank = get_rank
        self._reset_callbacks = []

    def register_reset_callbacks(self, callbacks) -> None:
        """Functions called with no arguments after every reset (worker added or
        removed), before the state is synced: e.g. to scale the learning rate by the
        new hvd.size()."""
        self._reset_callbacks.extend(callbacks)

    def on_reset(self) -> None:
        for callback in self._reset_callbacks:
            callback()

    def commit(self) -> None:
        """Saves the state in host memory, then checks for host updates (and raises
        HostsUpdatedInterrupt on every rank if there are).  Costs a copy of the state
        and one broadcast, so commit every few batches rather than every one."""
        self.save()
        self.check_host_updates()

    def check_host_updates(self) -> None:
        """Raises HostsUpdatedInterrupt on every rank when the driver has opened a new
        round (workers will be added or removed).

        Rank 0 asks the store and broadcasts the answer, so that every rank raises at
        the same call even when the news arrives between two ranks' checks.  The
        interrupt never skips the sync: the driver cannot tell whether some rank of
        the new round restored a commit instead, and a sync on some ranks only would
        hang.  Outside an elastic job this does nothing.
        """
        if not worker_rendezvous.enabled():
            return
        flag = torch.zeros(1, dtype=torch.int64)
        if self._rank() == 0 and worker_rendezvous.new_round_open():
            flag[0] = 1
        broadcast_(flag, 0, name="elastic.check_host_updates")
        if flag.item():
            raise HostsUpdatedInterrupt(skip_sync=False)

    def save(self) -> None:
        raise NotImplementedError

    def restore(self) -> None:
        raise NotImplementedError

    def sync(self) -> None:
        raise NotImplementedError


class ObjectState(State):
    """State made of picklable attributes, given as keyword arguments:

        state = hvd.elastic.ObjectState(epoch=0, best_loss=None)
        state.epoch += 1

    Only the attributes named at construction are committed and synced.
    """

    def __init__(self, bcast_object=broadcast_object, get_rank=rank, **kwargs):
        super().__init__(bcast_object, get_rank)
        self._saved_state = copy.deepcopy(kwargs)
        self._set_attrs()

    def save(self) -> None:
        self._saved_state = {k: copy.deepcopy(getattr(self, k)) for k in self._saved_state}

    def restore(self) -> None:
        self._set_attrs()

    def sync(self) -> None:
        if self._saved_state:
            current = {k: getattr(self, k) for k in self._saved_state}
            self._saved_state = copy.deepcopy(self._bcast_object(current))
            self._set_attrs()

    def _set_attrs(self) -> None:
        # Copies, so that mutating a restored list does not change the commit.
        for name, value in self._saved_state.items():
            setattr(self, name, copy.deepcopy(value))


class TorchState(ObjectState):
    """The state of a PyTorch training process.

        state = hvd.elastic.TorchState(model, optimizer, sampler=sampler, epoch=0)

    Modules, optimizers, LR schedulers and ElasticSamplers, passed under any keyword,
    are handled by type (state_dict copies and broadcasts); other values are plain
    attributes as in ObjectState.
    """

    def __init__(self, model=None, optimizer=None, **kwargs):
        kwargs.update(model=model, optimizer=optimizer)
        handlers = {k: _handler(v) for k, v in kwargs.items()}
        handlers = {k: h for k, h in handlers.items() if h is not None}
        # Set before any attribute: __setattr__ consults it.
        object.__setattr__(self, "_handlers", handlers)
        for name, handler in handlers.items():
            object.__setattr__(self, name, handler.value)
        plain = {k: v for k, v in kwargs.items() if k not in handlers}
        super().__init__(bcast_object=broadcast_object, get_rank=rank, **plain)

    def save(self) -> None:
        for handler in self._handlers.values():
            handler.save()
        super().save()

    def restore(self) -> None:
        for handler in self._handlers.values():
            handler.restore()
        super().restore()

    def sync(self) -> None:
        for handler in self._handlers.values():
            handler.sync()
        super().sync()

    def on_reset(self) -> None:
        # Before the callbacks: a callback may look at the sampler's new shard.
        for handler in self._handlers.values():
            handler.on_reset()
        super().on_reset()

    def __setattr__(self, name, value):
        # `state.model = other_model`: track the new object from now on.
        handlers = self.__dict__.get("_handlers", {})
        if name in handlers:
            handlers[name].set_value(value)
        super().__setattr__(name, value)


# ---------------------------------------------------------------- handlers


class _Handler:
    """Commits, restores and syncs one object.  sync() ends by taking the synced
    value as the committed copy (see the module docstring)."""

    def __init__(self, value):
        self.value = value
        self.save_local()

    def set_value(self, value) -> None:
        self.value = value
        self.save_local()

    def save(self) -> None:
        self.save_local()

    def save_local(self) -> None:
        self._saved = copy.deepcopy(self.value.state_dict())

    def restore(self) -> None:
        # A copy: load_state_dict() may keep the tensors it is given (optimizers
        # do), and the next step would then change the commit in place.
        self.value.load_state_dict(copy.deepcopy(self._saved))

    def sync(self) -> None:
        self.value.load_state_dict(broadcast_object(self.value.state_dict(), 0))
        self.save_local()

    def on_reset(self) -> None:
        pass


class _ModelHandler(_Handler):
    def save_local(self) -> None:
        self._saved = {k: v.detach().clone() for k, v in self.value.state_dict().items()}

    def restore(self) -> None:
        self.value.load_state_dict(self._saved)  # copies into the parameters

    def sync(self) -> None:
        broadcast_parameters(self.value.state_dict(), root_rank=0)
        self.save_local()


class _OptimizerHandler(_Handler):
    def restore(self) -> None:
        optimizer = self.value
        if hasattr(optimizer, "_hvd_lock"):
            # A DistributedOptimizer may hold gradient reductions of the failed step;
            # their engine is going away, so waiting on them (load_state_dict() would)
            # only raises again.  Forget them.
            with optimizer._hvd_lock:
                optimizer._reset()
        super().restore()

    def sync(self) -> None:
        broadcast_optimizer_state(self.value, root_rank=0)
        self.save_local()


class _SamplerHandler(_Handler):
    def save(self) -> None:
        # Each rank marked only its own batches; the commit is of the union, so a
        # worker that dies later does not take its marks with it.
        processed = set().union(
            *allgather_object(self.value.processed_indices, name="elastic.sampler")
        )
        self.value.processed_indices = processed
        self.save_local()

    def sync(self) -> None:
        self.value.load_state_dict(
            broadcast_object(self.value.state_dict(), 0, name="elastic.sampler")
        )
        self.save_local()

    def on_reset(self) -> None:
        self.value.reset()  # new rank and size, even when the sync is skipped


def _handler(value):
    if isinstance(value, torch.nn.Module):
        return _ModelHandler(value)
    if isinstance(value, torch.optim.Optimizer):
        return _OptimizerHandler(value)
    if isinstance(value, torch.optim.lr_scheduler.LRScheduler):
        return _Handler(value)
    if isinstance(value, ElasticSampler):
        return _SamplerHandler(value)
    return None
