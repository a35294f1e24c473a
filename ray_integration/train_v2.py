"""HvdTrainer: Horovod-style data-parallel training on Ray Train v2, the
successor of Ray's HorovodTrainer (docs/ray.md, "Ray Train v2").

Ray 2.58 makes Train v2 the default and refuses ray.train.horovod.HorovodTrainer
("not supported and is scheduled to be removed"). HvdTrainer keeps its
arguments and runs on v2's controller, so Ray Train's own machinery serves it
unchanged: ScalingConfig, RunConfig (storage, FailureConfig restarts from the
last reported checkpoint), ray.train.report/get_checkpoint/get_context, Ray Data
shards (get_dataset_shard), Tune.

    from ray_integration import HvdTrainer
    import hvd_torch as hvd

    def train_loop(config):
        hvd.init()                   # a no-op: the group's backend started the engine
        optimizer = hvd.DistributedOptimizer(...)
        hvd.broadcast_parameters(model.state_dict(), root_rank=0)
        ...
        ray.train.report(metrics, checkpoint=...)

    HvdTrainer(train_loop, train_loop_config={...},
               scaling_config=ray.train.ScalingConfig(num_workers=4)).fit()

Every worker group gets the "hvd" process group before the loop runs
(HvdConfig, train_v2_backend.py), so hvd.rank() is the worker's world rank and
torch.distributed (DDP, ray.train.torch.prepare_model) runs on the same engine.
"""

from __future__ import annotations

from typing import Any, Callable, Dict, Optional, Union

from ray.train import DataConfig
from ray.train.v2.api.config import RunConfig, ScalingConfig
from ray.train.v2.api.data_parallel_trainer import DataParallelTrainer
from ray.train.v2.api.validation_config import ValidationConfig

from .train_v2_backend import HvdConfig


class HvdTrainer(DataParallelTrainer):
    """Runs train_loop_per_worker(train_loop_config) (or with no argument) on
    scaling_config.num_workers Ray workers that share one hvd engine.

    horovod_config: an HvdConfig (start and shutdown time limits, hvd settings);
        default HvdConfig(). Ray's own HorovodConfig described horovodrun's ssh
        launch, which Ray Train never needs here, so it is not accepted.
    The rest are DataParallelTrainer's (Ray Train v2): scaling_config,
    run_config, datasets (Ray Data, read with ray.train.get_dataset_shard),
    dataset_config, validation_config.
    """

    def __init__(
        self,
        train_loop_per_worker: Union[Callable[[], Any], Callable[[Dict], Any]],
        *,
        train_loop_config: Optional[Dict] = None,
        horovod_config: Optional[HvdConfig] = None,
        scaling_config: Optional[ScalingConfig] = None,
        run_config: Optional[RunConfig] = None,
        datasets: Optional[Dict[str, Any]] = None,
        dataset_config: Optional[DataConfig] = None,
        validation_config: Optional[ValidationConfig] = None,
    ):
        horovod_config = HvdConfig() if horovod_config is None else horovod_config
        if not isinstance(horovod_config, HvdConfig):
            raise TypeError(f"HvdTrainer(horovod_config=...): expected an "
                            f"ray_integration.HvdConfig, got {type(horovod_config).__name__} "
                            "(Ray's HorovodConfig configured horovodrun's ssh launch; "
                            "HvdConfig has the settings that still apply)")
        super().__init__(
            train_loop_per_worker=train_loop_per_worker,
            train_loop_config=train_loop_config,
            backend_config=horovod_config,
            scaling_config=scaling_config,
            run_config=run_config,
            datasets=datasets,
            dataset_config=dataset_config,
            validation_config=validation_config,
        )
