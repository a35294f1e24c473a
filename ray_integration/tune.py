"""Ray Tune: every trial a distributed hvd-torch job of N workers.

    def train(config):                        # runs on every worker of a trial
        hvd.init()
        ...
        ray_integration.report({"loss": loss})  # rank 0's reports reach Tune

    trainable = DistributedTrainableCreator(train, num_workers=2)
    tuner = tune.Tuner(trainable, param_space={"lr": tune.loguniform(1e-3, 1e-1)},
                       tune_config=tune.TuneConfig(metric="loss", mode="min"))
    best = tuner.fit().get_best_result().config

Horovod's DistributedTrainableCreator had each worker call tune.report()
through a distributed Tune session that Tune no longer has. Here the trial is a
plain function trainable (today's API) that drives a RayExecutor: its workers
live in the trial's own placement group, and the values rank 0 passes to
ray_integration.report() become the trial's tune.report() calls, so schedulers
such as ASHA see every epoch and can stop the trial early. Stopping the trial
ends its placement group, and with it the workers.
"""

from __future__ import annotations

import inspect
import os
from collections.abc import Callable

from .executor import RayExecutor
from .placement import plan
from .settings import RaySettings
from .worker import report

__all__ = ["DistributedTrainableCreator", "report_checkpoint"]


class _Checkpointed:
    """A report that carries a checkpoint directory (see report_checkpoint)."""

    def __init__(self, metrics, path):
        self.metrics, self.path = metrics, path


def report_checkpoint(metrics: dict, checkpoint_dir: str) -> None:
    """From rank 0 of a trial: report metrics and a checkpoint directory to
    Tune (tune.report(metrics, checkpoint=...)). The directory must be
    readable from the trial's node (the same machine, or shared storage); Tune
    copies it into the run's storage. Other ranks' calls do nothing, as for
    ray_integration.report()."""
    report(_Checkpointed(dict(metrics), os.path.abspath(checkpoint_dir)))


def _to_tune(value) -> None:
    from ray import tune  # the trial's process: Tune is loaded there anyway

    if isinstance(value, _Checkpointed):
        tune.report(value.metrics, checkpoint=tune.Checkpoint.from_directory(value.path))
    else:
        tune.report(value)


def _takes_checkpoint_dir(func) -> bool:
    """Ray's historical trainables are func(config, checkpoint_dir=None)."""
    try:
        params = list(inspect.signature(func).parameters.values())
    except (TypeError, ValueError):
        return False
    return len(params) >= 2 or any(p.name == "checkpoint_dir" for p in params)


def DistributedTrainableCreator(  # Ray's historical name and signature, hence not snake_case
    func: Callable[..., object],
    use_gpu: bool = False,
    num_hosts: int | None = None,
    num_workers: int | None = None,
    num_cpus_per_worker: float = 1,
    timeout_s: float = 30,
    replicate_pem: bool = False,
    *,
    num_workers_per_host: int | None = None,
    cpus_per_worker: float | None = None,
    gpus_per_worker: float | None = None,
    placement_group_timeout_s: float = 100,
    verbose: int = 0,
):
    """A Tune trainable that runs func on a trial's hvd-torch workers.

    The positional arguments are Ray's historical
    ray.tune.integration.horovod.DistributedTrainableCreator(func, use_gpu,
    num_hosts, num_workers, num_cpus_per_worker, timeout_s, replicate_pem):
    without num_hosts, num_workers is the total (default 1); with num_hosts,
    num_workers is per host (num_workers_per_host says the same by name).
    replicate_pem is accepted and has nothing to do: Ray starts the workers,
    nobody logs in over SSH. cpus_per_worker is num_cpus_per_worker's newer name.

    func(config) or, as in Ray's function API, func(config, checkpoint_dir):
    checkpoint_dir is the directory of the checkpoint the trial restores from
    (None on a fresh start), readable on the trial's node. Rank 0 saves one
    with report_checkpoint(metrics, directory); plain metrics go through
    ray_integration.report().

    The trial's placement group holds exactly the workers' bundles: the
    trial's own function asks for no resources (an empty head bundle), so it
    never takes a CPU a worker needs.
    """
    cpus = cpus_per_worker if cpus_per_worker is not None else num_cpus_per_worker
    if num_hosts is not None:
        per_host = num_workers_per_host or num_workers or 1
        total = None
    else:
        if num_workers_per_host is not None:
            raise ValueError("num_workers_per_host needs num_hosts")
        per_host, total = 1, (num_workers or 1)
    gpus = (gpus_per_worker or 1) if use_gpu else 0
    layout = plan(total, num_hosts, per_host, cpus, gpus)
    settings = RaySettings(
        timeout_s=timeout_s, placement_group_timeout_s=placement_group_timeout_s, verbose=verbose
    )
    with_checkpoint = _takes_checkpoint_dir(func)
    # Here, not at import: a worker that calls report_checkpoint() imports this
    # module and must not pay a second or more of CPU for Tune it never uses.
    from ray import tune

    def trial(config):
        args = (config,)
        if with_checkpoint:
            restored = tune.get_checkpoint()
            args = (config, restored.to_directory() if restored is not None else None)
        executor = RayExecutor(
            settings,
            num_workers=total,
            num_hosts=num_hosts,
            num_workers_per_host=per_host,
            cpus_per_worker=cpus,
            use_gpu=use_gpu,
            gpus_per_worker=gpus_per_worker,
            use_current_placement_group=True,
        )
        executor.start()
        try:
            executor.run(func, args=args, callbacks=[_to_tune])
        finally:
            executor.shutdown()

    trial.__name__ = getattr(func, "__name__", "hvd_trial")
    trial.__qualname__ = trial.__name__
    resources = tune.PlacementGroupFactory([{}, *layout.bundles], strategy=layout.strategy)
    return tune.with_resources(trial, resources)
