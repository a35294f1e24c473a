"""The worker's side of the elastic round protocol: how a worker learns its rank, size
and rendezvous scope from the driver, and how it tells the driver a round failed.

The protocol is described at the top of hvdrun/elastic_driver.py.  In a
worker started by an elastic driver (ENV_WORKER_ID is set), hvd.init() calls
join_round() first: it waits for the driver to assign this worker a place in a round,
and writes the assignment into os.environ (HOROVOD_RANK, HOROVOD_SIZE, ...,
HVD_TORCH_RENDEZVOUS_SCOPE), which the engine reads at init, with torch.distributed's
names (RANK, ..., MASTER_ADDR, MASTER_PORT: rank 0's offer, see keys.JoinOffer).

Threading: one process is one worker, so the worker's identity and the last round it
was assigned in are process-wide (_WORKER), created on first use; they must outlive
hvd.shutdown()/hvd.init().  Call these functions from the training thread only.
"""

from __future__ import annotations

import os
import sys
import time

from hvd_torch import config
from hvdrun import elastic_keys as keys
from hvdrun.env import horovod_env
from hvdrun.store import KVStoreClient, secret_from_hex
from hvdrun.network import free_port, reachable_address

__all__ = [
    "RendezvousError",
    "WorkerRendezvous",
    "current_round",
    "enabled",
    "join_round",
    "new_round_open",
    "request_reset",
]

# How long one store wait lasts before the worker looks again at whether its round
# was superseded or the job stopped.  The wait returns at once when the key appears,
# so this bounds only how late a worker notices a superseded round.
_SLICE = 0.5


class RendezvousError(RuntimeError):
    """No assignment came: the driver ended the job, or did not answer in time."""


class WorkerRendezvous:
    """One worker's conversation with the driver through the store."""

    def __init__(self, client, worker_id: str, timeout: float):
        self.client = client
        self.worker_id = worker_id
        self.timeout = timeout
        self.round = 0  # the last round this worker was assigned in

    def join(self) -> keys.Assignment:
        """Blocks until the driver assigns this worker a place in a round newer than
        the last one.  Raises SystemExit(0) when asked to leave, RendezvousError when
        the job stops or after the timeout."""
        deadline = time.monotonic() + self.timeout
        while True:
            self._check_stop()
            newest = self.current_round()
            if newest <= self.round:
                self.client.wait([keys.open_key(self.round + 1)], self._slice(deadline))
                continue
            self.client.set(keys.join_key(newest, self.worker_id), keys.encode_join(self._offer()))
            key = keys.assign_key(newest, self.worker_id)
            while self.client.wait([key], self._slice(deadline)):
                self._check_stop()
                if self.current_round() != newest:
                    break  # superseded before it was assigned: join the newer one
            else:
                assignment = keys.decode_assignment(self.client.get(key, timeout=_SLICE))
                self.round = newest
                return assignment

    def _offer(self) -> keys.JoinOffer:
        """MASTER_ADDR/MASTER_PORT for the round, should this worker become its rank 0:
        the address the engine would use (the route to the store) and a port free now."""
        host, _, port = self.client.address.rpartition(":")
        iface = config.ElasticWorker.from_environment().iface
        address = reachable_address(host, int(port), iface)
        return keys.JoinOffer(os.getpid(), address, free_port())

    def request_reset(self) -> None:
        """Tells the driver that a collective of our round failed (a peer may have died
        without the driver noticing yet, or the network failed)."""
        if self.round > 0:
            self.client.set(keys.reset_key(self.round, self.worker_id), "")

    def current_round(self) -> int:
        return int(self.client.get(keys.ROUND, timeout=_SLICE))

    def _slice(self, deadline: float) -> float:
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            raise RendezvousError(
                f"elastic worker {self.worker_id}: no round assignment from the driver "
                f"within {self.timeout:g}s (store {self.client.address})"
            )
        return min(_SLICE, remaining)

    def _check_stop(self) -> None:
        if self.client.check([keys.leave_key(self.worker_id)]):
            reason = self.client.get(keys.leave_key(self.worker_id), timeout=_SLICE).decode()
            sys.stderr.write(
                f"hvd_torch.elastic: worker {self.worker_id} leaves the job ({reason})\n"
            )
            raise SystemExit(0)
        if self.client.check([keys.STOP]):
            success, reason = keys.decode_stop(self.client.get(keys.STOP, timeout=_SLICE))
            if success:
                raise SystemExit(0)  # the others finished without us: nothing to do
            raise RendezvousError(f"the elastic driver ended the job: {reason}")


_WORKER: WorkerRendezvous | None = None


def enabled() -> bool:
    """True in a worker started by an elastic driver."""
    return config.ElasticWorker.from_environment().worker_id is not None


def _worker() -> WorkerRendezvous:
    global _WORKER
    if _WORKER is None:
        env = config.ElasticWorker.from_environment()
        host, port, secret = env.store()
        client = KVStoreClient(host, port, secret_from_hex(secret))
        timeout = env.timeout_s()
        _WORKER = WorkerRendezvous(client, env.required("worker_id"), timeout)
    return _WORKER


def join_round() -> keys.Assignment:
    """Joins the next round and puts its assignment in os.environ for the engine."""
    worker = _worker()
    a = worker.join()
    host, port, secret = config.ElasticWorker.from_environment().store()
    os.environ.update(horovod_env(
        a.rank, a.size, host, port, secret_from_hex(secret),
        local_rank=a.local_rank, local_size=a.local_size, cross_rank=a.cross_rank,
        cross_size=a.cross_size, hostname=a.hostname,
        master_addr=a.master_addr, master_port=a.master_port or None,
    ))  # fmt: skip
    os.environ["HVD_TORCH_RENDEZVOUS_SCOPE"] = keys.scope(a.round)
    return a


def request_reset() -> None:
    if enabled():
        _worker().request_reset()


def current_round() -> int:
    """The round this worker was last assigned in (0 before the first)."""
    return _worker().round if enabled() else 0


def new_round_open() -> bool:
    """True when the driver opened a round newer than ours (membership will change)."""
    worker = _worker()
    return worker.current_round() > worker.round
