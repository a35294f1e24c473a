"""The store keys shared by the elastic driver and its workers, and how values are encoded.

The protocol itself (who writes what, in which order, and why) is described at the
top of elastic_driver.py and in docs/elastic.md; this module only names the keys so
that the two sides cannot drift apart.  Standard library only: the worker side
(hvd_torch/elastic/worker_rendezvous.py) and the driver both import it.
"""

from __future__ import annotations

import dataclasses
import json

__all__ = [
    "ENV_HOST",
    "ENV_TIMEOUT",
    "ENV_WORKER_ID",
    "ROUND",
    "STOP",
    "Assignment",
    "assign_key",
    "JoinOffer",
    "decode_assignment",
    "decode_join",
    "decode_stop",
    "encode_assignment",
    "encode_join",
    "encode_stop",
    "join_key",
    "join_prefix",
    "leave_key",
    "open_key",
    "reset_key",
    "reset_prefix",
    "scope",
]

# Set by the driver for every worker it starts (with the store's address and secret).
ENV_WORKER_ID = "HVD_TORCH_ELASTIC_WORKER_ID"  # unique for the life of the job: "w7"
ENV_HOST = "HVD_TORCH_ELASTIC_HOST"  # the discovery host (slot) the worker runs for
ENV_TIMEOUT = "HVD_TORCH_ELASTIC_TIMEOUT"  # seconds a worker waits for an assignment

ROUND = "elastic/round"  # the newest open round, decimal; "0" before the first
STOP = "elastic/stop"  # the driver is ending the job (JSON: success, reason)


def open_key(round_: int) -> str:
    """Set once round_ is open, so that a worker can block on it instead of polling ROUND."""
    return f"elastic/rounds/{round_}/open"


def leave_key(worker_id: str) -> str:
    """The driver asks this worker to leave the job (its host was removed or blacklisted)."""
    return f"elastic/leave/{worker_id}"


def join_prefix(round_: int) -> str:
    return f"elastic/rounds/{round_}/join/"


def join_key(round_: int, worker_id: str) -> str:
    return join_prefix(round_) + worker_id


def assign_key(round_: int, worker_id: str) -> str:
    return f"elastic/rounds/{round_}/assign/{worker_id}"


def reset_prefix(round_: int) -> str:
    return f"elastic/rounds/{round_}/reset/"


def reset_key(round_: int, worker_id: str) -> str:
    return reset_prefix(round_) + worker_id


def scope(round_: int) -> str:
    """The engine's rendezvous scope (HVD_TORCH_RENDEZVOUS_SCOPE) for a round: keys of
    different rounds never mix, whatever each process's own init count is."""
    return f"r{round_}"


@dataclasses.dataclass(frozen=True)
class Assignment:
    """What one worker is in one round: the engine topology it initialises with."""

    round: int
    rank: int = -1
    size: int = 0
    local_rank: int = -1
    local_size: int = 0
    cross_rank: int = 0
    cross_size: int = 1
    hostname: str = ""
    # torch.distributed's env:// rendezvous for the round (MASTER_ADDR/MASTER_PORT):
    # what rank 0's worker offered when it joined (JoinOffer).
    master_addr: str = ""
    master_port: int = 0


@dataclasses.dataclass(frozen=True)
class JoinOffer:
    """What a worker posts when it joins a round (the join key's value): its address
    as the others reach it and a port free on its host then.  The driver hands rank
    0's to every member in its Assignment, so a DDP script's init_process_group with
    env:// finds rank 0's TCPStore, round after round."""

    pid: int
    master_addr: str
    master_port: int


def encode_join(offer: JoinOffer) -> bytes:
    return json.dumps(dataclasses.asdict(offer), sort_keys=True).encode()


def decode_join(value: bytes) -> JoinOffer:
    return JoinOffer(**json.loads(value.decode()))


def encode_assignment(a: Assignment) -> bytes:
    return json.dumps(dataclasses.asdict(a), sort_keys=True).encode()


def decode_assignment(value: bytes) -> Assignment:
    return Assignment(**json.loads(value.decode()))


def encode_stop(success: bool, reason: str) -> bytes:
    return json.dumps({"success": success, "reason": reason}).encode()


def decode_stop(value: bytes) -> tuple[bool, str]:
    d = json.loads(value.decode())
    return bool(d["success"]), str(d["reason"])
