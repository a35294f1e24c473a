"""PyTorch Lightning on hvd-torch: DDP over the "hvd" backend, launched by Lightning or hvdrun.

    from hvd_torch.integrations.lightning import HvdStrategy
    trainer = pl.Trainer(accelerator="cpu", devices=2, strategy=HvdStrategy())

Lightning's own DDPStrategy(process_group_backend="hvd") already trains: the backend is
an ordinary torch.distributed one. HvdStrategy is that strategy with "hvd" as its default
backend, plus one thing Lightning lacks: under hvdrun it takes every rank's place from
hvdrun (HvdEnvironment) instead of recomputing it. Lightning's fallback environment
derives a rank as node_rank * devices + local_rank, so a Trainer whose devices or
num_nodes disagree with the job gets a wrong rank (an IndexError deep in Lightning, or a
rank the engine refuses); HvdEnvironment names both counts at once. Under Lightning's own
launcher (`python train.py`, devices=N) and under torchrun, HvdStrategy leaves the choice
of environment to Lightning.

Lightning is imported here only: hvd_torch itself never needs it.
"""

from __future__ import annotations

from lightning_fabric.plugins.environments import ClusterEnvironment
from pytorch_lightning.strategies import DDPStrategy

from hvd_torch import config

__all__ = ["HvdEnvironment", "HvdStrategy"]


def _layout() -> config.HvdrunLayout:
    """Read on every call: elastic hvdrun sets a worker's rank in hvd.init()."""
    return config.HvdrunLayout.from_environment()


class HvdEnvironment(ClusterEnvironment):
    """A job started by hvdrun (or anything that sets hvdrun's HOROVOD_* variables, such
    as the Ray executors): rank, size and host layout are the launcher's, read-only.

    Under elastic hvdrun a worker learns its rank only when it joins a round in
    hvd.init(); the script must call it before creating the Trainer. A reset during fit
    (a worker lost or added) then ends the job: Lightning cannot re-form its process
    group in the middle of fit."""

    def __init__(self) -> None:
        super().__init__()
        layout = _layout()
        if layout.rank is None:
            if layout.elastic == "1":
                raise RuntimeError(
                    "HvdEnvironment: under elastic hvdrun a worker learns its rank in "
                    "hvd.init(); call hvd.init() before creating the Trainer")
            raise RuntimeError("HvdEnvironment: HOROVOD_RANK is not set; start the job "
                               "with hvdrun, or let Lightning choose the environment")

    @property
    def creates_processes_externally(self) -> bool:
        return True

    @property
    def main_address(self) -> str:
        return _layout().required("master_addr")  # hvdrun sets it in every mode (hvdrun/env.py)

    @property
    def main_port(self) -> int:
        return _layout().number("master_port")

    @staticmethod
    def detect() -> bool:
        layout = _layout()
        return layout.rank is not None or layout.elastic == "1"

    def world_size(self) -> int:
        return _layout().number("size")

    def set_world_size(self, size: int) -> None:
        pass  # the launcher's; validate_settings has checked that Lightning agrees

    def global_rank(self) -> int:
        return _layout().number("rank")

    def set_global_rank(self, rank: int) -> None:
        pass  # as set_world_size

    def local_rank(self) -> int:
        return _layout().number("local_rank")

    def node_rank(self) -> int:
        return _layout().number("cross_rank")

    def validate_settings(self, num_devices: int, num_nodes: int) -> None:
        """Lightning places ranks as num_nodes hosts of num_devices each; the job must be
        that shape, else its sampler shards and rank-zero checks would be wrong."""
        layout = _layout()
        size, local = layout.number("size"), layout.number("local_size")
        hosts = layout.number("cross_size")
        if (num_devices, num_nodes) != (local, hosts) or local * hosts != size:
            raise ValueError(
                f"HvdEnvironment: the launcher started {size} ranks on {hosts} host(s), "
                f"{local} on this one (rank {self.global_rank()}), but the Trainer has "
                f"devices={num_devices}, num_nodes={num_nodes}: pass devices={local}, "
                f"num_nodes={hosts} (Lightning needs the same number of ranks on every host)")


class HvdStrategy(DDPStrategy):
    """Lightning's DDPStrategy on the "hvd" torch.distributed backend; HvdEnvironment
    under hvdrun unless a cluster_environment is given. Takes DDPStrategy's arguments
    (process_group_backend="gloo" runs the same training on torch's gloo)."""

    def __init__(self, *, process_group_backend: str = "hvd", cluster_environment=None,
                 **kwargs) -> None:
        if cluster_environment is None and HvdEnvironment.detect():
            cluster_environment = HvdEnvironment()
        super().__init__(process_group_backend=process_group_backend,
                         cluster_environment=cluster_environment, **kwargs)
