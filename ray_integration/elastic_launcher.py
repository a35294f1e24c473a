"""The elastic driver's launcher on Ray: one actor per elastic worker.

hvdrun.elastic_driver.ElasticDriver starts, replaces and regroups
workers through a launcher (start(worker_id, host, env) -> handle with poll()
and kill(), and engine_host(host)); elastic hvdrun plugs in local processes
(hvdrun/elastic_launch.py), this module plugs in Ray actors. A
"host" is a node label from node_discovery.NodeDiscovery.

One worker is one actor, which is one process: the worker's identity and its
rendezvous client are process-wide (hvd_torch/elastic/worker_rendezvous.py),
so an actor is never reused. The actor runs the user's function once and the
handle then kills it, as the process of an hvdrun worker exits when its script
ends. That matters on failures: a function that raised leaves its engine
connected, and its peers, blocked in a collective, would wait for the engine's
timeout instead of seeing a broken connection within seconds.

Exit codes, as the driver reads a process's:
    running                          None
    the function returned            0      (its value and final rank are kept)
    SystemExit(code)                 code   (a worker asked to leave exits 0)
    the function raised              1      (the remote traceback is kept)
    the actor died (ray.kill, crash) -9     (as SIGKILL)

Reports: ray_integration.report() works in elastic workers as in static ones
(rank 0 of the current round buffers them). While the job runs, poll() pulls
them from every running worker every _REPORT_S without waiting, and from a
worker whose function just ended before its actor is killed, and calls the
callbacks on the driver's thread.

Threading: the driver's thread calls start(), engine_host() and every handle's
poll() and kill(). workers() and results() may be read from any thread: they
copy the list of handles, which only the driver's thread appends to.
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import re
import signal
import sys
import time
from collections.abc import Callable, Mapping, Sequence

import ray
from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

from . import worker as static_worker
from .node_discovery import NodeDiscovery

__all__ = ["ElasticWorker", "RayLauncher", "RayWorkerHandle"]

_KILLED = -signal.SIGKILL
_ANSI = re.compile(r"\x1b\[[0-9;]*m")  # Ray colours remote tracebacks for terminals
# How often running workers' reports are pulled (as the static executor's 0.2 s).
_REPORT_S = 0.2
# Bound on pulling a finished worker's last reports; its reports thread is idle.
_LAST_REPORTS_TIMEOUT_S = 10.0


@dataclasses.dataclass(frozen=True)
class _Ended:
    """What the actor's run() returns when the function did not raise."""

    code: int
    returned: bool = False  # the function returned (else it called sys.exit)
    rank: int = -1  # HOROVOD_RANK of the last round the worker trained in
    value: object = None


class _ElasticWorker:
    """The process of one elastic worker. The driver calls run() once."""

    def __init__(self, worker_id: str):
        self._worker_id = worker_id

    def __repr__(self):
        # Ray prefixes the worker's output lines with this, taken at creation;
        # ranks change from round to round, the worker id does not.
        return f"hvd_torch elastic worker {self._worker_id}"

    def run(self, env: dict, job) -> _Ended:
        # hvd.init() reads os.environ when called: setting it first is all the
        # worker rendezvous needs (HVD_TORCH_ELASTIC_WORKER_ID and the store).
        os.environ.update(env)
        fn, args, kwargs = job
        try:
            value = fn(*args, **kwargs)
        except SystemExit as e:
            # The worker rendezvous exits 0 when asked to leave or when the job
            # already succeeded; in a plain process that ends the process. Ray
            # would end the actor and report a death, which reads as a failure.
            return _Ended(code=_exit_code(e.code))
        hvd = sys.modules.get("hvd_torch")
        if hvd is not None:
            # What atexit does at the end of an hvdrun worker: leave the engine
            # cleanly before the handle kills the process.
            hvd.shutdown()
        return _Ended(
            code=0, returned=True, rank=int(os.environ.get("HOROVOD_RANK", "-1")), value=value
        )

    @ray.method(concurrency_group="reports")
    def take_reports(self) -> list:
        return static_worker._reports.take()


# As in worker.py, the actor class is made from a plain class, with a thread
# of its own for take_reports so that it answers while run() trains.
ElasticWorker = ray.remote(concurrency_groups={"reports": 1})(_ElasticWorker)


def _exit_code(code) -> int:
    if code is None:
        return 0
    return code if isinstance(code, int) else 1  # sys.exit("message") exits 1


class RayWorkerHandle:
    """One worker actor and the run() call in flight on it."""

    def __init__(self, worker_id: str, host: str, actor, ref, launcher: RayLauncher):
        self.worker_id = worker_id
        self.host = host
        self.actor = actor
        self._ref = ref
        self._launcher = launcher
        self.reports_ref = None  # a take_reports call in flight
        self.code: int | None = None
        self.ended: _Ended | None = None  # set when the function returned or exited
        self.error = ""  # the remote traceback, or why the actor died

    def poll(self) -> int | None:
        self._launcher.pump_reports()
        if self.code is None:
            ready, _ = ray.wait([self._ref], timeout=0)
            if ready:
                self._collect()
        return self.code

    def kill(self) -> None:
        # A dead actor, or one Ray no longer knows, is already gone.
        with contextlib.suppress(ray.exceptions.RayError, ValueError):
            ray.kill(self.actor, no_restart=True)

    def _collect(self) -> None:
        try:
            self.ended = ray.get(self._ref)
            self.code = self.ended.code
        except ray.exceptions.RayTaskError as e:
            self.code = 1
            cause = e.cause
            summary = f"{type(cause).__name__}: {cause}" if cause is not None else ""
            # The copy ray.get raises keeps no traceback_str; its str() is Ray's
            # remote traceback (headed by the method, pid and ip).
            self.error = _ANSI.sub("", getattr(e, "traceback_str", None) or str(e)).rstrip()
            self.error = self.error or summary
        except ray.exceptions.RayActorError as e:
            self.code = _KILLED
            self.error = f"the worker process died ({type(e).__name__}): {e}"
        except ray.exceptions.RayError as e:
            self.code = 1
            self.error = f"{type(e).__name__}: {e}"
        self._launcher.last_reports(self)
        self.kill()  # the process ends with the function (see the module doc)
        self._launcher.exited(self)


class RayLauncher:
    """Starts elastic workers as actors pinned to the discovered nodes.

    job: an ObjectRef of (fn, args, kwargs), put once for all workers.
    callbacks: called with each value rank 0 reports (see the module doc).
    on_all_failed: called (on the driver's thread) when no worker is running,
    none returned and at least one failed: Horovod's rule that such a job has
    failed. Without it the driver would start new workers from the initial
    state, since no survivor holds the committed one, or, once the node is
    blacklisted, wait elastic_timeout for slots.
    """

    def __init__(
        self,
        discovery: NodeDiscovery,
        job,
        *,
        cpus_per_worker: float,
        gpus_per_worker: float = 0,
        callbacks: Sequence[Callable] = (),
        on_all_failed: Callable[[], None] = lambda: None,
    ):
        self._discovery = discovery
        self._job = job
        self._cpus = cpus_per_worker
        self._gpus = gpus_per_worker
        self._callbacks = list(callbacks)
        self._on_all_failed = on_all_failed
        self._next_pump = 0.0
        self._handles: list[RayWorkerHandle] = []
        self.all_failed = False

    def start(self, worker_id: str, host: str, env: Mapping[str, str]) -> RayWorkerHandle:
        if self.all_failed:
            # The driver may plan a round in the same pass that saw the last
            # failure, before it looks at the stop request.
            raise OSError("every worker of the job failed; starting no more")
        node = self._discovery.node(host)
        actor = ElasticWorker.options(
            num_cpus=self._cpus,
            num_gpus=self._gpus,
            # Hard affinity: the driver counted this worker against host's
            # slots; if the node is gone, creation fails and the driver sees an
            # exit, not a worker running somewhere it does not know.
            scheduling_strategy=NodeAffinitySchedulingStrategy(node.node_id, soft=False),
            # The driver replaces lost workers itself, with a new identity.
            max_restarts=0,
        ).remote(worker_id)
        ref = actor.run.remote(dict(env), self._job)
        handle = RayWorkerHandle(worker_id, host, actor, ref, self)
        self._handles.append(handle)
        return handle

    def engine_host(self, host: str) -> str:
        # Workers on one node share its IP and so a machine in the engine's
        # eyes: local ranks, loopback. Two Ray nodes on one machine do too.
        return self._discovery.node(host).ip

    def workers(self) -> dict:
        """{worker id: actor handle} of the workers still running."""
        return {h.worker_id: h.actor for h in list(self._handles) if h.code is None}

    def results(self) -> list:
        """The values of the functions that returned, by final rank."""
        done = [h.ended for h in list(self._handles) if h.ended is not None and h.ended.returned]
        return [e.value for e in sorted(done, key=lambda e: e.rank)]

    def last_failure(self) -> str:
        """The latest worker failure with its traceback, or ""."""
        for h in reversed(self._handles):
            if h.error:
                return f"worker {h.worker_id} on {h.host}:\n{h.error}"
        return ""

    def stop(self) -> None:
        """Kills every actor still alive; safe to call twice."""
        for h in self._handles:
            h.kill()

    def pump_reports(self) -> None:
        """Delivers what running workers reported, at most every _REPORT_S;
        never waits."""
        now = time.monotonic()
        if not self._callbacks or now < self._next_pump:
            return
        self._next_pump = now + _REPORT_S
        for h in list(self._handles):
            if h.code is not None:
                continue
            if h.reports_ref is None:
                h.reports_ref = h.actor.take_reports.remote()
            elif ray.wait([h.reports_ref], timeout=0)[0]:
                self._deliver(h, timeout=0)

    def last_reports(self, handle: RayWorkerHandle) -> None:
        """Delivers a worker's remaining reports before its actor is killed."""
        if not self._callbacks or handle.code == _KILLED:
            return  # a dead actor answers nothing
        if handle.reports_ref is not None:
            self._deliver(handle, _LAST_REPORTS_TIMEOUT_S)
        handle.reports_ref = handle.actor.take_reports.remote()
        self._deliver(handle, _LAST_REPORTS_TIMEOUT_S)

    def _deliver(self, handle: RayWorkerHandle, timeout: float) -> None:
        ref, handle.reports_ref = handle.reports_ref, None
        try:
            values = ray.get(ref, timeout=timeout)
        except ray.exceptions.RayError:
            return  # the actor is gone; its run() ref says why
        # A callback's exception propagates out of the driver's run(), which
        # stops every worker: the static executor's rule.
        for value in values:
            for callback in self._callbacks:
                callback(value)

    def exited(self, handle: RayWorkerHandle) -> None:
        if handle.code == 0 or self.all_failed:
            return
        handles = list(self._handles)
        running = any(h.code is None for h in handles)
        returned = any(h.ended is not None and h.ended.returned for h in handles)
        if not running and not returned:
            self.all_failed = True
            self._on_all_failed()
