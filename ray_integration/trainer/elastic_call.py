"""One trainer call (train, validate, ...) as an elastic hvd-torch job.

An elastic TorchTrainer runs each call as one ElasticRayExecutor.run(): every
worker builds the operator, loads the driver's state (the last epoch's result)
and makes the call inside @hvd.elastic.run. The committed state is that start
state, so when a worker dies mid-epoch the survivors restore it, the driver
replaces the worker (which receives rank 0's state by sync()), and the epoch is
trained again from its start by the new set of workers: the trainer resumes
from the last epoch's committed state, as the issue asks. Rank 0 returns the
new state for the driver to keep.

torch and hvd_torch only; the driver side is in torch_trainer.py.
"""

from __future__ import annotations

import copy

import hvd_torch as hvd
from hvd_torch.elastic.state import State, TorchState

from .runner import OperatorRunner

__all__ = ["elastic_call"]

# Calls that change the state, whose result the driver keeps.
_MUTATING = {"train", "update_scheduler", "load_state_dict", "state_dict"}


class _RunnerState(State):
    """The whole runner as one elastic state: models, optimizers and schedulers
    through TorchState (weights broadcast as tensors; a DistributedOptimizer's
    in-flight reductions forgotten on restore), the rest (epoch, step, scaler,
    operator state) as one object broadcast from rank 0."""

    def __init__(self, runner: OperatorRunner):
        super().__init__()
        self._runner = runner
        op = runner.operator
        objects = {f"model_{i}": m for i, m in enumerate(op.models)}
        objects.update({f"optimizer_{i}": o for i, o in enumerate(op.optimizers)})
        objects.update({f"scheduler_{i}": s for i, s in enumerate(op.schedulers)})
        self._torch = TorchState(**objects)
        self._rest = None
        self._save_rest()

    def _rest_now(self) -> dict:
        state = self._runner.state_dict()
        return {k: state[k] for k in ("epoch", "global_step", "scaler", "operator")}

    def _save_rest(self) -> None:
        self._rest = copy.deepcopy(self._rest_now())

    def _load_rest(self, rest: dict) -> None:
        runner, op = self._runner, self._runner.operator
        runner.epoch = rest["epoch"]
        op.global_step = rest["global_step"]
        op._precision.load_state_dict(rest["scaler"])
        op.load_state_dict(rest["operator"] or {})

    def save(self) -> None:
        self._torch.save()
        self._save_rest()

    def restore(self) -> None:
        self._torch.restore()
        self._load_rest(copy.deepcopy(self._rest))

    def sync(self) -> None:
        self._torch.sync()
        rest = hvd.broadcast_object(
            self._rest_now() if hvd.rank() == 0 else None, root_rank=0, name="trainer.state"
        )
        self._load_rest(rest)
        self._rest = copy.deepcopy(rest)

    def on_reset(self) -> None:
        self._torch.on_reset()
        super().on_reset()


def elastic_call(operator_cls, config, options, state, keep_hyperparameters, method, args,
                 kwargs):  # fmt: skip
    """On every elastic worker: (result, state after the call or None).
    state: the driver's last state (None: the operator's fresh one)."""
    runner = OperatorRunner(operator_cls, config, options)
    if state is not None:
        runner.load_state_dict(state, keep_hyperparameters)
    tracked = _RunnerState(runner)

    @hvd.elastic.run
    def call(tracked):
        return getattr(runner, method)(*args, **kwargs)

    result = call(tracked)
    keep = method in _MUTATING or state is None
    return result, (runner.state_dict() if keep and hvd.rank() == 0 else None)
