"""The worker actor: one per rank. It takes the rank's environment before user
code calls hvd.init(), runs the driver's functions, and keeps the executable.

Threading: run, execute and the other job methods share Ray's default
concurrency group of one thread, so they run one at a time and always on the
same thread. take_reports lives in its own group ("reports") so the driver can
collect rank 0's reports while a run is in flight.

The module imports nothing of hvd_torch or torch: a worker pays for those only
when the user's function imports them.
"""

from __future__ import annotations

import os
import socket
import threading

import ray

from hvdrun.network import free_port

__all__ = ["HorovodWorker", "Worker", "report"]


class _ReportBuffer:
    """Rank 0's reports not yet collected by the driver: the process's one
    registry, behind a mutex because the run and take_reports threads share it."""

    def __init__(self):
        self._lock = threading.Lock()
        self._items: list = []

    def put(self, value) -> None:
        with self._lock:
            self._items.append(value)

    def take(self) -> list:
        with self._lock:
            items, self._items = self._items, []
        return items


_reports = _ReportBuffer()


def report(value) -> None:
    """Sends value (anything picklable, usually a dict of metrics) from inside a
    run()/execute() function to the driver's callbacks, e.g. tune.report.

    Only rank 0's reports are delivered; on other ranks this does nothing, so
    the same training function runs unchanged on every rank.
    """
    rank = os.environ.get("HOROVOD_RANK")
    if rank is None:
        raise RuntimeError(
            "ray_integration.report() was called outside a RayExecutor worker "
            "(HOROVOD_RANK is not set)"
        )
    if rank == "0":
        _reports.put(value)


class Worker:
    """The process of one rank. The driver calls, in order: where(), free_port() (on
    rank 0), setup(env),
    then optionally construct(cls, ...), then run()/execute() any number of times."""

    def __init__(self):
        self._executable = None

    def __repr__(self):
        # Ray shows this in remote tracebacks (and, taken at creation, before
        # the rank is known, as the prefix of the worker's output lines).
        rank = os.environ.get("HOROVOD_RANK")
        return "hvd_torch worker" if rank is None else f"hvd_torch worker rank {rank}"

    def where(self) -> dict:
        """The node this actor landed on and the GPUs Ray assigned it."""
        context = ray.get_runtime_context()
        return {
            "node_id": context.get_node_id(),
            "node_ip": ray.util.get_node_ip_address(),
            "hostname": socket.gethostname(),
            "pid": os.getpid(),
            "gpu_ids": [str(g) for g in context.get_accelerator_ids().get("GPU", [])],
        }

    def free_port(self) -> int:
        """A TCP port free on this actor's node now: rank 0's answer becomes every
        rank's MASTER_PORT (rank 0 binds torch.distributed's TCPStore there)."""
        return free_port()

    def setup(self, env: dict) -> None:
        # hvd.init() reads os.environ when it is called, so setting it here,
        # before any user code runs, is all the engine needs.
        os.environ.update(env)

    def construct(self, cls, args, kwargs) -> None:
        self._executable = cls(*args, **kwargs)

    def run(self, job):
        """job is (fn, args, kwargs): one object the driver puts in the object
        store once for all workers."""
        fn, args, kwargs = job
        _reports.take()  # reports left by an earlier call belong to no one now
        return fn(*args, **kwargs)

    def execute(self, fn):
        _reports.take()
        # Horovod's rule: without an executable_cls, fn gets None.
        return fn(self._executable)

    @ray.method(concurrency_group="reports")
    def take_reports(self) -> list:
        return _reports.take()


# The actor class is made from the plain class rather than by decorating it:
# Ray pickles an actor class's methods, and methods found by name in this
# module (Worker.run) travel by reference instead of dragging _reports along.
HorovodWorker = ray.remote(concurrency_groups={"reports": 1})(Worker)
