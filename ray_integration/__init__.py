"""hvd-torch on Ray: Horovod's RayExecutor and Tune integration.

    from ray_integration import RayExecutor
    import hvd_torch as hvd

See docs/ray.md. hvd_torch itself knows nothing of Ray; this package drives it.

Names are resolved on first use (PEP 562): every worker process imports
ray_integration.worker, and must not pay for torch and Ray
Tune, seconds each, before the user's function asks for them.
"""

import importlib

_EXPORTS = {
    "DistributedTrainableCreator": ".tune",
    "ElasticRayExecutor": ".elastic",
    "HvdConfig": ".train_v2_backend",
    "HvdTrainer": ".train_v2",
    "PlacementTimeoutError": ".placement",
    "RayExecutor": ".executor",
    "RaySettings": ".settings",
    "TorchTrainer": ".trainer",
    "TrainingOperator": ".trainer",
    "WorkerFailure": ".worker_group",
    "report": ".worker",
    "report_checkpoint": ".tune",
}

__all__ = [
    "DistributedTrainableCreator",
    "ElasticRayExecutor",
    "HvdConfig",
    "HvdTrainer",
    "PlacementTimeoutError",
    "RayExecutor",
    "RaySettings",
    "TorchTrainer",
    "TrainingOperator",
    "WorkerFailure",
    "report",
    "report_checkpoint",
]


def __getattr__(name):
    if name not in _EXPORTS:
        raise AttributeError(f"module 'ray_integration' has no attribute {name!r}")
    value = getattr(importlib.import_module(_EXPORTS[name], __name__), name)
    globals()[name] = value
    return value


def __dir__():
    return __all__
