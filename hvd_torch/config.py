"""The Python API's one reader of the environment: every variable hvd_torch reads,
each with its meaning (VARIABLES), and the frozen snapshots its call sites take the
values from.

One reader per layer: the engine's is EngineConfig::fromEnvironment
(csrc/core/topology.cc), the launcher's hvdrun/config.py, whose Snapshot these build
on (docs/architecture.md, "Configuration").  tests/unit/test_config.py fails when
other code reads os.environ.  horovod_env.py, which refuses the HOROVOD_* knobs
hvd-torch does not honour, counts the HOROVOD_* names below as honoured and reads the
whole family through horovod_variables().

When a value is read.  Nothing is read at import.  A snapshot is taken where its
values are used, on every call: hvd.init() may run again in one process under new
variables (the test pools re-init so), and a rendezvous (torchrun's, an elastic
round's) writes variables that later readers in the same init() must see.
from_environment() never fails: a value is parsed, and a bad one refused, by the
method that uses it, or at its call site where parsing needs more than the text
(HOROVOD_GPU_OPERATIONS depends on the build; the log levels are hvd_torch/log.py's).
Standard library only.
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Mapping

from hvdrun import elastic_keys
from hvdrun.config import Snapshot, variable

__all__ = ["VARIABLES", "ElasticWorker", "Gpu", "HvdrunLayout", "Launch", "Logging",
           "horovod_variables"]

HOROVOD_PREFIX = "HOROVOD_"  # horovod_env.py checks every variable of the family
START_TIMEOUT_S = 30.0  # HOROVOD_START_TIMEOUT's default, as the engine's
ELASTIC_TIMEOUT_S = 630.0  # an elastic worker's wait for its round

VARIABLES = {
    # How this process was started (hvd.init(), the "hvd" torch.distributed backend).
    "HOROVOD_RANK": "this rank; set by hvdrun, the Ray driver or a torchrun rendezvous, "
                    "it says the launcher's store is known",
    elastic_keys.ENV_WORKER_ID: "set by an elastic driver for each worker: hvd.init() joins "
                                "the driver's rounds",
    "RANK": "torchrun's rank: without HOROVOD_RANK, hvd.init() meets the others through "
            "torch's TCPStore",
    "WORLD_SIZE": "torchrun's number of ranks",
    "LOCAL_RANK": "torchrun's rank on this host (with LOCAL_WORLD_SIZE and GROUP_RANK: the "
                  "topology; else from host names)",
    "LOCAL_WORLD_SIZE": "torchrun's ranks on this host",
    "GROUP_RANK": "torchrun's index of this host",
    "GROUP_WORLD_SIZE": "torchrun's number of hosts (default WORLD_SIZE / LOCAL_WORLD_SIZE)",
    "MASTER_ADDR": "torchrun's store host; across hosts rank 0 advertises its address on "
                   "the route there",
    "MASTER_PORT": "torchrun's store port: without its agent store, rank 0 serves one on "
                   "MASTER_PORT + 1",
    "TORCHELASTIC_USE_AGENT_STORE": "True: meet through torchrun's agent store at "
                                    "MASTER_ADDR:MASTER_PORT",
    "TORCHELASTIC_RESTART_COUNT": "torchrun's restart attempt: hvd's key prefix in its "
                                  "agent store",
    "HOROVOD_START_TIMEOUT": "rendezvous deadline at init(), seconds (default 30)",
    "HVD_TORCH_SECRET": "the job's secret (hex, 16+ bytes), the same on every rank: under "
                        "torchrun or init_process_group('hvd') across hosts, required",
    # An elastic worker's conversation with its driver (elastic/worker_rendezvous.py).
    "HOROVOD_GLOO_RENDEZVOUS_ADDR": "rendezvous store address",
    "HOROVOD_GLOO_RENDEZVOUS_PORT": "rendezvous store port",
    "HOROVOD_SECRET_KEY": "rendezvous store secret",
    # Also an elastic worker's MASTER_ADDR offer: that interface's address.
    "HOROVOD_GLOO_IFACE": "network interface for the control plane and Gloo across hosts",
    elastic_keys.ENV_TIMEOUT: "seconds an elastic worker waits for a round assignment "
                              "(default 630)",
    # Where hvdrun put this rank, for frameworks that take the launcher's layout
    # (integrations/lightning.py); the engine reads its own copy.
    "HOROVOD_SIZE": "hvdrun's number of ranks",
    "HOROVOD_LOCAL_RANK": "hvdrun's rank on this host",
    "HOROVOD_LOCAL_SIZE": "hvdrun's ranks on this host",
    "HOROVOD_CROSS_RANK": "hvdrun's index of this host",
    "HOROVOD_CROSS_SIZE": "hvdrun's number of hosts",
    "HOROVOD_ELASTIC": "1 under elastic hvdrun: a worker learns its rank in hvd.init()",
    # The logger (log.py) and the GPU (gpu.py).
    "HOROVOD_LOG_LEVEL": "engine and hvd_torch logger level: trace, debug, info, warning, "
                         "error, fatal",
    "HOROVOD_LOG_HIDE_TIME": "1: log lines without the time stamp",
    "HOROVOD_GPU_OPERATIONS": "NCCL or GLOO (host-staged): how CUDA tensors move "
                              "(hvd_torch/gpu.py)",
    "CUDA_VISIBLE_DEVICES": "the physical GPUs behind this process's device numbers: ranks "
                            "that share one do not use NCCL",
}  # fmt: skip


def horovod_variables(environ: Mapping[str, str] | None = None) -> dict[str, str]:
    """Every HOROVOD_* variable in environ (None: os.environ, as it is now), for
    horovod_env.py's check of the whole family."""
    environ = os.environ if environ is None else environ
    return {k: v for k, v in environ.items() if k.startswith(HOROVOD_PREFIX)}


@dataclasses.dataclass(frozen=True)
class Launch(Snapshot):
    """How this process was started: hvd.init() takes it on every call, the "hvd"
    torch.distributed backend when it creates a group."""

    horovod_rank: str | None = variable(VARIABLES, "HOROVOD_RANK")
    elastic_worker_id: str | None = variable(VARIABLES, elastic_keys.ENV_WORKER_ID)
    rank: str | None = variable(VARIABLES, "RANK")
    world_size: str | None = variable(VARIABLES, "WORLD_SIZE")
    local_rank: str | None = variable(VARIABLES, "LOCAL_RANK")
    local_world_size: str | None = variable(VARIABLES, "LOCAL_WORLD_SIZE")
    group_rank: str | None = variable(VARIABLES, "GROUP_RANK")
    group_world_size: str | None = variable(VARIABLES, "GROUP_WORLD_SIZE")
    master_addr: str | None = variable(VARIABLES, "MASTER_ADDR")
    master_port: str | None = variable(VARIABLES, "MASTER_PORT")
    use_agent_store: str | None = variable(VARIABLES, "TORCHELASTIC_USE_AGENT_STORE")
    restart_count: str | None = variable(VARIABLES, "TORCHELASTIC_RESTART_COUNT")
    start_timeout: str | None = variable(VARIABLES, "HOROVOD_START_TIMEOUT")
    secret: str | None = variable(VARIABLES, "HVD_TORCH_SECRET")

    @property
    def torchrun(self) -> bool:
        """torch.distributed's variables (RANK, WORLD_SIZE) without hvdrun's."""
        return (self.horovod_rank is None and self.elastic_worker_id is None
                and self.rank is not None and self.world_size is not None)

    def torchrun_rank_size(self) -> tuple[int, int]:
        """(RANK, WORLD_SIZE); ValueError unless integers with 0 <= RANK < WORLD_SIZE."""
        try:
            rank, size = int(self.required("rank")), int(self.required("world_size"))
        except ValueError:
            raise ValueError(f"hvd_torch.init(): RANK={self.rank!r} and WORLD_SIZE="
                             f"{self.world_size!r} must be integers") from None
        if not 0 <= rank < size:
            raise ValueError(f"hvd_torch.init(): RANK={rank} is not in [0, WORLD_SIZE={size})")
        return rank, size

    def torchrun_topology(self, rank: int, size: int) -> dict | None:
        """local/cross rank and size from torchrun's variables when they are set and
        describe rank `rank` of `size`, else None."""
        if (self.local_rank is None or self.local_world_size is None or self.group_rank is None
                or self.rank != str(rank) or self.world_size != str(size)):
            return None
        local_size = int(self.local_world_size)
        hosts = self.group_world_size
        return dict(local_rank=int(self.local_rank), local_size=local_size,
                    cross_rank=int(self.group_rank),
                    cross_size=int(size // max(local_size, 1) if hosts is None else hosts))

    def torchrun_master(self) -> tuple[str, int]:
        """(MASTER_ADDR, MASTER_PORT); ValueError when either is missing or the port is
        not an integer."""
        try:
            return self.required("master_addr"), int(self.required("master_port"))
        except (KeyError, ValueError) as e:
            raise ValueError(
                "hvd_torch.init(): RANK and WORLD_SIZE are set (torchrun's variables) but "
                f"MASTER_ADDR/MASTER_PORT are not ({e}); launch with torchrun or hvdrun") from None

    def start_timeout_s(self) -> float:
        """HOROVOD_START_TIMEOUT in seconds; ValueError naming the variable and its
        value if it is not a positive number."""
        if self.start_timeout is None:
            return START_TIMEOUT_S
        try:
            seconds = float(self.start_timeout)
        except ValueError:
            seconds = float("nan")
        if not seconds > 0:  # also nan
            raise ValueError(f"HOROVOD_START_TIMEOUT={self.start_timeout!r}: expected a "
                             "positive number of seconds")
        return seconds

    @property
    def agent_store(self) -> bool:
        return self.use_agent_store == "True"

    @property
    def attempt(self) -> str:
        return "0" if self.restart_count is None else self.restart_count


@dataclasses.dataclass(frozen=True)
class HvdrunLayout(Snapshot):
    """Where hvdrun (or the Ray driver) put this rank, as it told the process: read by
    the integrations whose framework takes the launcher's layout (integrations/lightning.py)."""

    rank: str | None = variable(VARIABLES, "HOROVOD_RANK")
    size: str | None = variable(VARIABLES, "HOROVOD_SIZE")
    local_rank: str | None = variable(VARIABLES, "HOROVOD_LOCAL_RANK")
    local_size: str | None = variable(VARIABLES, "HOROVOD_LOCAL_SIZE")
    cross_rank: str | None = variable(VARIABLES, "HOROVOD_CROSS_RANK")
    cross_size: str | None = variable(VARIABLES, "HOROVOD_CROSS_SIZE")
    elastic: str | None = variable(VARIABLES, "HOROVOD_ELASTIC")
    master_addr: str | None = variable(VARIABLES, "MASTER_ADDR")
    master_port: str | None = variable(VARIABLES, "MASTER_PORT")

    def number(self, field: str) -> int:
        """The field as an int; KeyError naming its variable when unset."""
        return int(self.required(field))


@dataclasses.dataclass(frozen=True)
class ElasticWorker(Snapshot):
    """An elastic worker's identity and its driver's store (set by the driver)."""

    worker_id: str | None = variable(VARIABLES, elastic_keys.ENV_WORKER_ID)
    store_addr: str | None = variable(VARIABLES, "HOROVOD_GLOO_RENDEZVOUS_ADDR")
    store_port: str | None = variable(VARIABLES, "HOROVOD_GLOO_RENDEZVOUS_PORT")
    secret_key: str | None = variable(VARIABLES, "HOROVOD_SECRET_KEY")
    timeout: str | None = variable(VARIABLES, elastic_keys.ENV_TIMEOUT)
    iface: str | None = variable(VARIABLES, "HOROVOD_GLOO_IFACE")

    def store(self) -> tuple[str, int, str]:
        """(address, port, secret in hex); KeyError naming a variable that is unset."""
        return (self.required("store_addr"), int(self.required("store_port")),
                self.required("secret_key"))

    def timeout_s(self) -> float:
        return float(ELASTIC_TIMEOUT_S if self.timeout is None else self.timeout)


@dataclasses.dataclass(frozen=True)
class Logging(Snapshot):
    """The hvd_torch logger's level and format (hvd_torch/log.py parses the level)."""

    level: str | None = variable(VARIABLES, "HOROVOD_LOG_LEVEL")
    hide_time_flag: str | None = variable(VARIABLES, "HOROVOD_LOG_HIDE_TIME")

    @property
    def hide_time(self) -> bool:
        return self.hide_time_flag not in (None, "", "0")


@dataclasses.dataclass(frozen=True)
class Gpu(Snapshot):
    """Which plane moves CUDA tensors, and which physical GPU this rank has."""

    operations: str | None = variable(VARIABLES, "HOROVOD_GPU_OPERATIONS")
    visible_devices: str | None = variable(VARIABLES, "CUDA_VISIBLE_DEVICES")

    @property
    def requested_operations(self) -> str:
        """HOROVOD_GPU_OPERATIONS, upper case; "" when unset (gpu.py picks and checks)."""
        return (self.operations or "").strip().upper()

    def physical_gpu(self, device: int) -> str:
        """The GPU behind `device`, as named before CUDA_VISIBLE_DEVICES renumbered it."""
        if self.visible_devices:
            names = [v.strip() for v in self.visible_devices.split(",") if v.strip()]
            if device < len(names):
                return names[device]
        return str(device)
