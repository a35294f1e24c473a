"""The "hvd" backend of a Ray Train v2 worker group: HvdConfig and what it runs
on the workers when the group starts and ends (docs/ray.md, "Ray Train v2").

Ray's own torch backend (TorchConfig) already does the start: it hands every
worker MASTER_ADDR/MASTER_PORT, RANK, WORLD_SIZE, LOCAL_RANK, ... and calls
init_process_group(backend) on all of them at once, before the training
function runs. With backend "hvd" that creation starts the hvd engine
(docs/torch_distributed.md), so HvdConfig reuses it and adds only what the
engine needs around it:

- before: a fresh secret for hvd's rendezvous store on every worker
  (HVD_TORCH_SECRET), chosen on the controller and sent with Ray's task
  arguments, as RayExecutor sends its HOROVOD_SECRET_KEY. Without it the engine
  refuses a job that spans nodes, and on one node rank 0 would hand its own
  secret over in a file (removed once every rank has joined), which this
  avoids altogether.
- after: destroy the process group and hvd.shutdown() on every worker still
  alive, each bounded, before Ray kills the processes. A failed worker group is
  torn down the same way, and a restart gets new processes (new actors), so
  no engine state crosses a restart.
"""

from __future__ import annotations

import logging
import sys
from dataclasses import dataclass, field
from typing import Dict, Optional

import ray
from ray.exceptions import RayActorError, RayTaskError
from ray.train.backend import Backend
from ray.train.torch import TorchConfig

from hvdrun.store_protocol import make_secret

logger = logging.getLogger(__name__)

HVD = "hvd"


@dataclass
class HvdConfig(TorchConfig):
    """How each worker group's hvd engine starts and stops; the successor of
    Ray's HorovodConfig.

    backend: "hvd", or a per-device list that gives hvd a device
        ("cpu:hvd,cuda:nccl"); anything without hvd belongs on TorchTrainer.
    init_method, timeout_s: TorchConfig's ("env" or "tcp"; torch.distributed's
        timeout of the process group's operations).
    start_timeout_s: HOROVOD_START_TIMEOUT, the bound on the engine's rendezvous
        (hvd's own default, 30 s, when None).
    shutdown_timeout_s: how long the group's end waits for every worker's
        destroy_process_group() and hvd.shutdown() before Ray kills them.
    env_vars: hvd settings for every worker (HOROVOD_FUSION_THRESHOLD,
        HOROVOD_TIMELINE, ...), set before the engine starts; an HVD_TORCH_SECRET
        here replaces the fresh one each group gets otherwise.
    """

    backend: Optional[str] = HVD
    start_timeout_s: Optional[float] = None
    shutdown_timeout_s: float = 30.0
    env_vars: Dict[str, str] = field(default_factory=dict)

    def __post_init__(self):
        if HVD not in [entry.split(":")[-1] for entry in (self.backend or "").split(",")]:
            raise ValueError(f"HvdConfig(backend={self.backend!r}): the backend must be \"hvd\" "
                             "(or name hvd for a device, \"cpu:hvd,cuda:nccl\"); for gloo or "
                             "nccl alone use ray.train.torch.TorchTrainer")

    @property
    def backend_cls(self):
        return HvdBackend

    def worker_env(self) -> Dict[str, str]:
        """The variables every worker of one group gets before its engine starts."""
        env = {key: str(value) for key, value in self.env_vars.items()}
        if self.start_timeout_s is not None:
            env["HOROVOD_START_TIMEOUT"] = str(self.start_timeout_s)
        env.setdefault("HVD_TORCH_SECRET", make_secret().hex())  # fresh per group: a restart too
        return env

    def to_dict(self):
        return {**super().to_dict(), "start_timeout_s": self.start_timeout_s,
                "shutdown_timeout_s": self.shutdown_timeout_s}


class HvdBackend(Backend):
    """Ray Train's hooks for HvdConfig; the controller calls them, one group at a time."""

    # As Ray's torch backend: every worker sees its node's GPUs, and the training
    # function's context (TorchConfig's) makes ray.train.torch.get_device() current.
    share_cuda_visible_devices = True

    def on_start(self, worker_group, backend_config: HvdConfig):
        worker_group.execute(_set_environment, backend_config.worker_env())
        _torch_backend().on_start(worker_group, backend_config)

    def on_training_start(self, worker_group, backend_config: HvdConfig):
        _torch_backend().on_training_start(worker_group, backend_config)

    def on_shutdown(self, worker_group, backend_config: HvdConfig):
        refs = worker_group.execute_async(_stop_hvd)
        _, pending = ray.wait(refs, num_returns=len(refs),
                              timeout=backend_config.shutdown_timeout_s)
        for rank, ref in enumerate(refs):
            if ref in pending:
                logger.warning("hvd backend: rank %d did not stop its hvd engine within %g s; "
                               "Ray kills it", rank, backend_config.shutdown_timeout_s)
                continue
            try:
                ray.get(ref)
            except (RayActorError, RayTaskError) as e:  # a dead worker, the usual restart
                logger.info("hvd backend: rank %d could not stop its hvd engine: %s",
                            rank, str(e).splitlines()[0] if str(e) else type(e).__name__)


def _torch_backend() -> Backend:
    """Ray's torch backend (a singleton), which creates and destroys the process group."""
    return TorchConfig().backend_cls()


def _set_environment(env: Dict[str, str]) -> None:
    import os

    os.environ.update(env)


def _stop_hvd() -> None:
    """On a worker: the process group, then the engine. destroy_process_group()
    waits for the other ranks (docs/torch_distributed.md); a dead peer fails it
    at once, and the engine is stopped all the same."""
    import torch.distributed as dist

    try:
        if dist.is_initialized():
            dist.destroy_process_group()
    finally:
        hvd = sys.modules.get("hvd_torch")  # loaded by the group's creation, if it ran
        if hvd is not None and hvd.is_initialized():
            hvd.shutdown()
