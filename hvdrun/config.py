"""The launcher's one reader of the environment: every variable hvdrun reads for its
own behaviour, each with its meaning (VARIABLES), and the frozen snapshots its call
sites take the values from.

What hvdrun hands the ranks is another matter: env.py builds that (this shell's
environment, whole or less a deny list, plus each rank's variables), and the launch
modules copy os.environ for it without reading any variable of it.

One reader per layer: the engine's is EngineConfig::fromEnvironment
(csrc/core/topology.cc), the Python API's hvd_torch/config.py, which builds its
snapshots on Snapshot below (docs/architecture.md, "Configuration").
tests/unit/test_config.py fails when other code reads os.environ.

When a value is read.  A snapshot is taken where its values are used, as each
variable was read before there was a reader: parse_args() takes Launch and Slurm
once per command line, ssh takes Launch per connection and the elastic launcher per
host, a store its Store when it is made.  from_environment() never fails: a value is
parsed, and a bad one refused, where it is used.  Standard library only, like the
rest of hvdrun.
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Callable, Mapping

__all__ = ["VARIABLES", "Launch", "Slurm", "Snapshot", "Store", "variable"]

IFACE = "HOROVOD_GLOO_IFACE"
SECRET = "HVD_TORCH_SECRET"
SSH_STRICT = "HVD_TORCH_SSH_STRICT"
ELASTIC_LOCAL = "HVD_TORCH_ELASTIC_LOCAL"
STORE_BIND = "HVD_TORCH_STORE_BIND"
STORE_AUTH_TIMEOUT = "HVD_TORCH_STORE_AUTH_TIMEOUT"
STORE_MAX_PENDING = "HVD_TORCH_STORE_MAX_PENDING"
STORE_MAX_CLIENTS = "HVD_TORCH_STORE_MAX_CLIENTS"
STORE_MAX_FRAME = "HVD_TORCH_STORE_MAX_FRAME"

VARIABLES = {
    IFACE: "--network-interface's default: the NIC for the store, the control plane and Gloo",
    SECRET: "per-node mode: the job's secret (hex, 16+ bytes), the same on every node, "
            "unless --rdzv-secret-file",
    SSH_STRICT: "ssh's host key check: unset, accept-new (a new host's key is recorded, a "
                "changed key refused); 1, only keys already known; 0, none (horovodrun's)",
    ELASTIC_LOCAL: "1: elastic mode starts every discovered host's workers on this machine",
    STORE_BIND: "per-node mode: the address node 0's store listens on (0.0.0.0: every one); "
                "default --network-interface's, else the endpoint's",
    STORE_AUTH_TIMEOUT: "seconds a store client has to authenticate (default 5)",
    STORE_MAX_PENDING: "unauthenticated store connections held at once (default 64)",
    STORE_MAX_CLIENTS: "authenticated store connections at once (default 4 per rank + 64)",
    STORE_MAX_FRAME: "bytes in one store request (default 16 MiB)",
    # Under srun the SLURM_* variables give per-node mode's defaults (slurm.py).
    "SLURM_PROCID": "set in a job step (with SLURM_NODEID): per-node mode by default",
    "SLURM_NODEID": "--node-rank's default",
    "SLURM_JOB_NUM_NODES": "--nnodes's default",
    "SLURM_NNODES": "--nnodes's default where SLURM_JOB_NUM_NODES is unset",
    "SLURM_JOB_NODELIST": "--rdzv-endpoint's default host: the list's first node",
    "SLURM_NODELIST": "the node list where SLURM_JOB_NODELIST is unset",
    "SLURM_JOB_ID": "--rdzv-endpoint's default port: 29400 + SLURM_JOB_ID % 1000",
}  # fmt: skip

_NAME = "environment variable"


def variable(table: Mapping[str, str], name: str):
    """A Snapshot field holding `name`'s text (None when unset); name must be listed,
    with its meaning, in `table` (the reader's VARIABLES)."""
    if name not in table:
        raise KeyError(f"{name} is not listed with its meaning in the reader's VARIABLES")
    return dataclasses.field(default=None, metadata={_NAME: name})


class Snapshot:
    """The base of a reader's frozen dataclasses: each field (made by variable()) is
    one variable's text as from_environment() found it, None when unset."""

    @classmethod
    def from_environment(cls, environ: Mapping[str, str] | None = None):
        """The variables' values in environ (None: os.environ, as it is now)."""
        environ = os.environ if environ is None else environ
        return cls(**{f.name: environ.get(f.metadata[_NAME]) for f in dataclasses.fields(cls)})

    @classmethod
    def variables(cls) -> tuple[str, ...]:
        """The names of the variables this snapshot reads."""
        return tuple(f.metadata[_NAME] for f in dataclasses.fields(cls))

    @classmethod
    def name_of(cls, field: str) -> str:
        """The variable behind a field."""
        return next(f.metadata[_NAME] for f in dataclasses.fields(cls) if f.name == field)

    def required(self, field: str) -> str:
        """The field's text; KeyError naming its variable when unset, as os.environ[name]."""
        value = getattr(self, field)
        if value is None:
            raise KeyError(self.name_of(field))
        return value


@dataclasses.dataclass(frozen=True)
class Launch(Snapshot):
    """How hvdrun starts ranks: the interface and the per-node secret (parse_args()),
    ssh's host key checks (each connection), elastic local labels (each host)."""

    iface: str | None = variable(VARIABLES, IFACE)
    secret: str | None = variable(VARIABLES, SECRET)
    ssh_strict: str | None = variable(VARIABLES, SSH_STRICT)
    elastic_local: str | None = variable(VARIABLES, ELASTIC_LOCAL)

    def host_key_checking(self) -> str:
        """ssh's StrictHostKeyChecking for HVD_TORCH_SSH_STRICT; ValueError for a
        value that is none of unset, 1 and 0."""
        text = (self.ssh_strict or "").strip()
        policy = {"": "accept-new", "1": "yes", "0": "no"}.get(text)
        if policy is None:
            raise ValueError(f"{SSH_STRICT} must be 1 (only known host keys), 0 (no check) "
                             f"or unset (accept new hosts, refuse changed keys), got {text!r}")
        return policy

    @property
    def local_labels(self) -> bool:
        return self.elastic_local == "1"


@dataclasses.dataclass(frozen=True)
class Slurm(Snapshot):
    """A Slurm job step's description of the job (slurm.node_defaults())."""

    procid: str | None = variable(VARIABLES, "SLURM_PROCID")
    nodeid: str | None = variable(VARIABLES, "SLURM_NODEID")
    job_num_nodes: str | None = variable(VARIABLES, "SLURM_JOB_NUM_NODES")
    nnodes: str | None = variable(VARIABLES, "SLURM_NNODES")
    job_nodelist: str | None = variable(VARIABLES, "SLURM_JOB_NODELIST")
    nodelist: str | None = variable(VARIABLES, "SLURM_NODELIST")
    job_id: str | None = variable(VARIABLES, "SLURM_JOB_ID")

    @property
    def in_job_step(self) -> bool:
        """True inside `srun` (a job step), not in the batch script itself."""
        return self.procid is not None and self.nodeid is not None

    @property
    def nodes(self) -> str | None:
        return self.job_num_nodes or self.nnodes

    @property
    def node_list(self) -> str | None:
        return self.job_nodelist or self.nodelist

    def job_number(self) -> int:
        """SLURM_JOB_ID as a number (0 when unset or empty); ValueError if not one."""
        return int(self.job_id or 0)


@dataclasses.dataclass(frozen=True)
class Store(Snapshot):
    """A store's overrides: where node 0's listens, and StoreLimits.for_job()'s limits."""

    bind: str | None = variable(VARIABLES, STORE_BIND)
    auth_timeout: str | None = variable(VARIABLES, STORE_AUTH_TIMEOUT)
    max_pending: str | None = variable(VARIABLES, STORE_MAX_PENDING)
    max_clients: str | None = variable(VARIABLES, STORE_MAX_CLIENTS)
    max_frame: str | None = variable(VARIABLES, STORE_MAX_FRAME)

    def limit(self, field: str, parse: Callable[[str, str], object], default):
        """field's value by parse(variable name, text), or default when unset or blank;
        parse raises for a malformed one (args.positive_int: UsageError)."""
        text = (getattr(self, field) or "").strip()
        return parse(self.name_of(field), text) if text else default
