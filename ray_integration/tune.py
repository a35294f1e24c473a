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

from collections.abc import Callable

from ray import tune

from .executor import RayExecutor
from .placement import plan
from .settings import RaySettings

__all__ = ["DistributedTrainableCreator"]


def DistributedTrainableCreator(  # Horovod's name, hence not snake_case
    func: Callable[[dict], object],
    num_workers: int | None = None,
    num_hosts: int | None = None,
    num_workers_per_host: int = 1,
    cpus_per_worker: float = 1,
    use_gpu: bool = False,
    gpus_per_worker: float | None = None,
    timeout_s: float = 30,
    placement_group_timeout_s: float = 100,
    verbose: int = 0,
):
    """A Tune trainable that runs func(config) on a trial's hvd-torch workers.

    Give num_workers, or num_hosts with num_workers_per_host, as for
    RayExecutor (num_workers defaults to 1). The trial's placement group holds
    exactly the workers' bundles: the trial's own function asks for no
    resources (an empty head bundle), so it never takes a CPU a worker needs.
    Each trial's result is func's rank 0 return value only through report().
    """
    if num_workers is None and num_hosts is None:
        num_workers = 1
    gpus = (gpus_per_worker or 1) if use_gpu else 0
    layout = plan(num_workers, num_hosts, num_workers_per_host, cpus_per_worker, gpus)
    settings = RaySettings(
        timeout_s=timeout_s, placement_group_timeout_s=placement_group_timeout_s, verbose=verbose
    )

    def trial(config):
        executor = RayExecutor(
            settings,
            num_workers=num_workers,
            num_hosts=num_hosts,
            num_workers_per_host=num_workers_per_host,
            cpus_per_worker=cpus_per_worker,
            use_gpu=use_gpu,
            gpus_per_worker=gpus_per_worker,
            use_current_placement_group=True,
        )
        executor.start()
        try:
            executor.run(func, args=(config,), callbacks=[tune.report])
        finally:
            executor.shutdown()

    trial.__name__ = getattr(func, "__name__", "hvd_trial")
    trial.__qualname__ = trial.__name__
    resources = tune.PlacementGroupFactory([{}, *layout.bundles], strategy=layout.strategy)
    return tune.with_resources(trial, resources)
