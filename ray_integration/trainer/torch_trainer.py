"""TorchTrainer: Ray SGD's trainer API over hvd-torch workers on Ray.

    trainer = TorchTrainer(training_operator_cls=MyOperator, num_workers=2,
                           config={"lr": 0.1}, use_fp16=False)
    for epoch in range(5):
        print(trainer.train(), trainer.validate())
    trainer.save("/tmp/ckpt.pt")
    model = trainer.get_model()
    trainer.shutdown()

The constructor starts the workers (a RayExecutor; with min_workers or
max_workers an elastic one) and, in a static job, builds one OperatorRunner per
worker that lives as long as the trainer. Each method calls every worker at
once and reduces what they return (metrics.py). A failing worker stops the job
and raises WorkerFailure with its rank, host and remote traceback.

Elastic jobs (min_workers/max_workers) run each call as one elastic job
(elastic_call.py): the driver keeps the state after every epoch, each call
starts workers that load it, and a worker lost mid-epoch costs that epoch's
progress only: the survivors and a replacement train it again from its start.
The price is a fresh set of worker processes per call (seconds each).

Not thread-safe: one driver thread owns a trainer.
"""

from __future__ import annotations

import functools
import os

import ray

from ..executor import RayExecutor
from ..settings import RaySettings
from ..worker_group import WorkerFailure
from .checkpoint_files import load_checkpoint, save_private
from .elastic_call import elastic_call
from .metrics import reduce_worker_stats
from .runner import OperatorRunner, RunnerOptions
from .training_operator import TrainingOperator

__all__ = ["TorchTrainer"]


class TorchTrainer:
    """Trains training_operator_cls on num_workers Ray workers.

    config: passed to the operator's setup(). num_cpus_per_worker, use_gpu
    (True, False or "auto": GPUs if the cluster has any): each worker's
    resources. use_fp16: autocast with a gradient scaler (float16 on GPUs,
    bfloat16 on CPUs). scheduler_step_freq: "batch", "epoch" or "manual"
    (update_scheduler()), required when the operator registers schedulers.
    add_dist_sampler: give each worker its shard of every registered
    DataLoader (default). seed: the distributed samplers' shuffle seed.
    min_workers/max_workers: elastic (see the module doc), with reset_limit
    and elastic_timeout; num_workers is then not given. timeout_s bounds the
    workers' start and rendezvous; verbose as RayExecutor's settings.
    """

    def __init__(
        self,
        *,
        training_operator_cls: type[TrainingOperator],
        config: dict | None = None,
        num_workers: int | None = None,
        num_cpus_per_worker: float = 1,
        use_gpu: bool | str = False,
        use_fp16: bool = False,
        scheduler_step_freq: str | None = None,
        add_dist_sampler: bool = True,
        seed: int = 0,
        min_workers: int | None = None,
        max_workers: int | None = None,
        reset_limit: int | None = None,
        elastic_timeout: float | None = None,
        timeout_s: float = 60,
        placement_group_timeout_s: float = 100,
        verbose: int = 0,
    ):
        if not (isinstance(training_operator_cls, type)
                and issubclass(training_operator_cls, TrainingOperator)):  # fmt: skip
            raise TypeError(
                "training_operator_cls must be a subclass of TrainingOperator, got "
                f"{training_operator_cls!r}"
            )
        self._elastic = min_workers is not None or max_workers is not None
        if self._elastic and num_workers is not None:
            raise ValueError(
                "an elastic TorchTrainer (min_workers/max_workers) sizes itself from the "
                "cluster: leave out num_workers"
            )
        if not ray.is_initialized():
            ray.init()  # as RayExecutor.start(): a local Ray or RAY_ADDRESS's cluster
        if use_gpu == "auto":
            use_gpu = ray.cluster_resources().get("GPU", 0) > 0
        self._operator_cls = training_operator_cls
        self._config = dict(config or {})
        self._options = RunnerOptions(
            use_gpu=bool(use_gpu),
            use_fp16=use_fp16,
            scheduler_step_freq=scheduler_step_freq,
            add_dist_sampler=add_dist_sampler,
            seed=seed,
            elastic=self._elastic,
        )
        settings = RaySettings(
            timeout_s=timeout_s, placement_group_timeout_s=placement_group_timeout_s,
            verbose=verbose,
        )  # fmt: skip
        self._failure: WorkerFailure | None = None
        # Elastic: the state after the last call (None: the operator's fresh
        # one) and whether the next job keeps its own optimizer settings.
        self._state = None
        self._keep_hyperparameters = False
        self._has_validation = None
        self.resets = 0
        if self._elastic:
            self._executor = RayExecutor(
                settings, min_workers=min_workers, max_workers=max_workers,
                reset_limit=reset_limit, elastic_timeout=elastic_timeout,
                cpus_per_worker=num_cpus_per_worker, use_gpu=bool(use_gpu),
            )  # fmt: skip
            self._executor.start()
        else:
            self._executor = RayExecutor(
                settings, num_workers=1 if num_workers is None else num_workers,
                cpus_per_worker=num_cpus_per_worker, use_gpu=bool(use_gpu),
            )  # fmt: skip
            self._executor.start(
                executable_cls=OperatorRunner,
                executable_args=(training_operator_cls, self._config, self._options),
            )

    # -- training

    def train(self, num_steps: int | None = None, info: dict | None = None,
              reduce_results: bool = True):  # fmt: skip
        """One epoch (or num_steps batches) on every worker. Returns the
        metrics: "epoch", each metric's mean over workers of its per-worker
        sample-weighted mean, "num_samples" and "batch_count" summed; with
        reduce_results=False, each worker's own, by rank."""
        stats = self._call("train", num_steps, info)
        return reduce_worker_stats(stats) if reduce_results else stats

    def validate(self, num_steps: int | None = None, info: dict | None = None,
                 reduce_results: bool = True):  # fmt: skip
        """The operator's validate() on every worker's shard of the
        validation loader; metrics reduced as in train()."""
        stats = self._call("validate", num_steps, info)
        return reduce_worker_stats(stats) if reduce_results else stats

    def update_scheduler(self, metric) -> None:
        """scheduler.step(metric) on every worker (scheduler_step_freq="manual")."""
        self._call("update_scheduler", metric)

    @property
    def has_validation(self) -> bool:
        """Whether the operator registered a validation_loader."""
        if self._has_validation is None:
            self._has_validation = self._call("has_validation", single=True)
        return self._has_validation

    def reset(self, config: dict | None = None) -> None:
        """Starts over with config (default: the current one): every worker
        builds a new operator (setup(config), rank 0's fresh state), epoch 0.
        The worker processes stay: this is how a Tune trainable takes a new
        trial's config without starting workers (reset_config)."""
        if config is not None:
            self._config = dict(config)
        self._has_validation = None
        if self._elastic:
            self._state, self._keep_hyperparameters = None, False
            return
        self._call("reset", self._operator_cls, self._config)

    # -- state

    def state_dict(self) -> dict:
        """Rank 0's full state (models, optimizers, schedulers, scaler,
        epoch, operator state), tensors on the CPU."""
        if self._elastic and self._state is not None:
            return self._state
        return self._call("state_dict", single=True)

    def load_state_dict(self, state: dict, keep_hyperparameters: bool = False) -> None:
        """Loads state_dict()'s output on every worker. keep_hyperparameters:
        the optimizers keep their current param-group settings (lr, ...) and
        take only the per-parameter state (see as_trainable and PBT)."""
        if self._elastic:
            self._state, self._keep_hyperparameters = state, keep_hyperparameters
            return
        self._call("load_state_dict", state, keep_hyperparameters)

    def save(self, path: str) -> str:
        """Writes state_dict() to path (torch.save, through a temporary file,
        so a crash never leaves a half-written checkpoint); returns path. The
        file is this user's alone (0600), and the temporary one has a random
        name made with O_EXCL, so a link planted in a shared folder is never
        written through."""
        save_private(self.state_dict(), path)
        return path

    def load(self, path: str, keep_hyperparameters: bool = False,
             weights_only: bool = True) -> None:
        """Loads a checkpoint written by save(). weights_only (torch.load's):
        tensors and plain containers only, so a checkpoint someone else wrote
        cannot run code; pass False only for a trusted file whose operator
        state holds other objects."""
        self.load_state_dict(load_checkpoint(path, weights_only), keep_hyperparameters)

    def get_model(self):
        """Rank 0's trained model on the CPU (a list if several were registered)."""
        models = self._call("get_models", single=True)
        return models[0] if len(models) == 1 else models

    def apply_all_operators(self, fn) -> list:
        """fn(operator) on every worker; the results by rank."""
        return self._call("apply", fn)

    # -- lifecycle

    def shutdown(self) -> None:
        """Stops the workers; safe to call twice."""
        self._executor.shutdown()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.shutdown()

    @property
    def executor(self):
        """The RayExecutor (or ElasticRayExecutor) running the workers."""
        return self._executor

    @classmethod
    def as_trainable(cls, training_operator_cls, **kwargs):
        """A Tune trainable class whose trials each run a TorchTrainer; see trainable.py."""
        from .trainable import make_trainable

        return make_trainable(cls, training_operator_cls, **kwargs)

    # -- internals

    def _call(self, method: str, *args, single: bool = False, **kwargs):
        if self._failure is not None:
            raise RuntimeError(
                f"TorchTrainer.{method}(): the workers were stopped after a failure (below); "
                "build a new TorchTrainer (and load() a checkpoint saved before)"
            ) from self._failure
        if self._elastic:
            return self._elastic_call(method, args, kwargs, single)
        fn = functools.partial(_invoke, method, args, kwargs)
        try:
            if single:
                return self._executor.execute_single(fn)
            return self._executor.execute(fn)
        except WorkerFailure as e:
            if not single:  # execute_single leaves the workers running
                self._failure = e
            raise

    def _elastic_call(self, method, args, kwargs, single):
        job = (self._operator_cls, self._config, self._options, self._state,
               self._keep_hyperparameters, method, args, kwargs)  # fmt: skip
        results = self._executor.run(elastic_call, args=job)
        self.resets += self._executor.resets
        states = [s for _, s in results if s is not None]
        if states:
            self._state, self._keep_hyperparameters = states[0], False
        elif method == "train":
            # Rank 0 failed after the others had returned: its state is lost,
            # and training on without it would repeat the epoch silently.
            raise RuntimeError(
                "TorchTrainer.train(): the elastic job ended without rank 0's state"
            )
        values = [v for v, _ in results]
        return values[0] if single else values


def _invoke(method, args, kwargs, runner):
    return getattr(runner, method)(*args, **kwargs)
