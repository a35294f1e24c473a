"""A started set of worker actors, one per rank, and calling them all at once.

The group owns the actors; its placement group and store belong to the caller
(RayExecutor, later its elastic sibling), which decides when to give them back.
Methods are for the one driver thread that owns the group.

Failure rule: while a call is in flight on every rank, one rank failing leaves
the others blocked in a collective that can no longer finish, so gather() stops
every worker at the first failure and raises WorkerFailure naming the rank, its
host and the remote traceback. Failures are noticed within _POLL_S.
"""

from __future__ import annotations

import contextlib
import dataclasses
import re
import time
from collections.abc import Callable, Sequence

import ray
from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

from .placement import Reservation
from .topology import Slot, assign_ranks
from .worker import HorovodWorker

__all__ = ["WorkerFailure", "WorkerGroup", "WorkerPlace"]

# How often a waiting driver wakes to deliver reports and notice failures.
_POLL_S = 0.2
# After a failure that is only a consequence (a rank saw its peer vanish), how
# long to wait for the failure that caused it, which names the rank to look at.
_ROOT_CAUSE_GRACE_S = 2.0
# Bound on collecting rank 0's reports; its take_reports thread is never busy.
_REPORT_TIMEOUT_S = 30.0
# Ray colours the header of a remote traceback for terminals.
_ANSI = re.compile(r"\x1b\[[0-9;]*m")


class WorkerFailure(RuntimeError):
    """A worker raised or died during a call on the driver's behalf.

    rank, host (the node's IP), node_id and remote_traceback describe the first
    failure; failed_ranks lists every rank seen failing by then.
    """

    def __init__(self, message, *, rank, host, node_id, remote_traceback, failed_ranks):
        super().__init__(message)
        self.rank = rank
        self.host = host
        self.node_id = node_id
        self.remote_traceback = remote_traceback
        self.failed_ranks = failed_ranks

    def __reduce__(self):
        # Keyword-only fields: pickle (Ray Tune sends a trial's error to the
        # driver) must pass them by name, or unpickling fails with a TypeError.
        return (_worker_failure, (self.args[0], self.rank, self.host, self.node_id,
                                  self.remote_traceback, self.failed_ranks))


def _worker_failure(message, rank, host, node_id, remote_traceback, failed_ranks):
    return WorkerFailure(message, rank=rank, host=host, node_id=node_id,
                         remote_traceback=remote_traceback, failed_ranks=failed_ranks)


@dataclasses.dataclass(frozen=True)
class WorkerPlace:
    """Where one rank's actor runs."""

    slot: Slot
    node_ip: str
    hostname: str
    pid: int
    gpu_ids: tuple[str, ...]

    def describe(self) -> str:
        return f"host {self.node_ip} (node {self.slot.node_id[:8]}, pid {self.pid})"


class WorkerGroup:
    """The actors of one job, in rank order."""

    def __init__(self, actors: Sequence, places: Sequence[WorkerPlace]):
        self.actors = list(actors)
        self.places = list(places)

    @property
    def size(self) -> int:
        return len(self.actors)

    @classmethod
    def start(cls, reservation: Reservation, resources: dict, timeout_s: float) -> WorkerGroup:
        """Creates one actor per reserved worker slot and waits (up to timeout_s)
        until each has said where it landed; then ranks follow the nodes."""
        actors = [
            HorovodWorker.options(
                num_cpus=resources.get("CPU", 0),
                num_gpus=resources.get("GPU", 0),
                scheduling_strategy=PlacementGroupSchedulingStrategy(
                    placement_group=reservation.group, placement_group_bundle_index=bundle
                ),
                # A restarted rank would rejoin a job that has already failed.
                max_restarts=0,
            ).remote()
            for bundle in reservation.worker_bundle
        ]
        # Rank order is not known until the actors report their nodes; until
        # then the group is in creation order, which gather() only uses to name
        # workers in errors.
        unranked = cls(actors, [None] * len(actors))
        where = unranked.gather(
            [a.where.remote() for a in actors], "start", timeout_s=timeout_s, by_worker=True
        )
        slots = assign_ranks([w["node_id"] for w in where])
        places = [
            WorkerPlace(
                slot=s,
                node_ip=where[s.worker]["node_ip"],
                hostname=where[s.worker]["hostname"],
                pid=where[s.worker]["pid"],
                gpu_ids=tuple(where[s.worker]["gpu_ids"]),
            )
            for s in slots
        ]
        return cls([actors[s.worker] for s in slots], places)

    def submit(self, method: str, args_per_rank: Sequence[tuple] | None = None, *args) -> list:
        """Starts actor.method on every rank; returns the refs in rank order.
        args_per_rank[r], when given, are rank r's arguments, else args for all."""
        return [
            getattr(actor, method).remote(*(args_per_rank[r] if args_per_rank else args))
            for r, actor in enumerate(self.actors)
        ]

    def gather(
        self,
        refs: Sequence,
        what: str,
        *,
        callbacks: Sequence[Callable] = (),
        timeout_s: float | None = None,
        stop_on_failure: bool = True,
        by_worker: bool = False,
    ) -> list:
        """The results of refs (refs[i] from rank i) in order, while delivering
        rank 0's reports to callbacks. On a failure, a timeout or an exception
        from a callback, stops every worker first (unless stop_on_failure is
        off) and raises. by_worker: the group is not ranked yet (start())."""
        index = {ref: i for i, ref in enumerate(refs)}
        results = [None] * len(refs)
        pending = list(refs)
        deadline = None if timeout_s is None else time.monotonic() + timeout_s
        try:
            while pending:
                wait_s = _POLL_S if deadline is None else min(_POLL_S, deadline - time.monotonic())
                ready, pending = ray.wait(pending, num_returns=1, timeout=max(wait_s, 0))
                if ready and pending:  # take everything else already done, without waiting
                    more, pending = ray.wait(pending, num_returns=len(pending), timeout=0)
                    ready += more
                failures = _collect(ready, index, results)
                if failures and all(_is_consequence(e) for _, e in failures) and pending:
                    late, pending = ray.wait(
                        pending, num_returns=len(pending), timeout=_ROOT_CAUSE_GRACE_S
                    )
                    failures += _collect(late, index, results)
                self._deliver(callbacks)
                if failures:
                    raise self._failure(what, failures, stop_on_failure, by_worker)
                if pending and deadline is not None and time.monotonic() >= deadline:
                    raise TimeoutError(
                        f"{what}: {self._names([index[r] for r in pending], by_worker)} did not "
                        f"finish within {timeout_s:g}s (settings timeout_s); every worker was "
                        "stopped"
                    )
            self._deliver(callbacks)  # what rank 0 reported just before returning
        except BaseException as e:
            if stop_on_failure or not isinstance(e, WorkerFailure):
                self.kill()
            raise
        return results

    def kill(self) -> None:
        """Stops every actor now; safe to call twice."""
        for actor in self.actors:
            # Killing a dead actor is a no-op; after ray.shutdown() the handle
            # is unknown (ActorHandleNotFoundError) and the actor already gone.
            with contextlib.suppress(ray.exceptions.RayError):
                ray.kill(actor, no_restart=True)

    def _deliver(self, callbacks: Sequence[Callable]) -> None:
        if not callbacks:
            return
        try:
            values = ray.get(self.actors[0].take_reports.remote(), timeout=_REPORT_TIMEOUT_S)
        except ray.exceptions.RayError:
            return  # rank 0 is gone; its run's ref reports why
        for value in values:
            for callback in callbacks:
                callback(value)

    def _names(self, workers: Sequence[int], by_worker: bool) -> str:
        noun = "worker(s)" if by_worker else "rank(s)"
        return f"{noun} {', '.join(str(w) for w in sorted(workers))}"

    def _failure(self, what, failures, stopped, by_worker) -> WorkerFailure:
        # Report the cause, not its echo: a rank that died or raised on its own
        # before the ranks that only saw a peer vanish.
        first_rank, first = min(failures, key=lambda f: (_is_consequence(f[1]), f[0]))
        place = None if by_worker else self.places[first_rank]
        who = (f"worker {first_rank}" if by_worker else f"rank {first_rank} of {self.size}") + (
            f" on {place.describe()}" if place else ""
        )
        summary, remote_tb = _explain(first)
        lines = [f"{what}: {who} failed: {summary}"]
        if remote_tb:
            lines += ["remote traceback:", remote_tb.rstrip()]
        others = sorted(r for r, _ in failures if r != first_rank)
        if others:
            lines.append(f"{self._names(others, by_worker)} failed too")
        lines.append(
            "every worker was stopped; shutdown() and start() the executor to run again"
            if stopped
            else "the other workers were left running"
        )
        return WorkerFailure(
            "\n".join(lines),
            rank=first_rank,
            host=place.node_ip if place else None,
            node_id=place.slot.node_id if place else None,
            remote_traceback=remote_tb,
            failed_ranks=sorted(r for r, _ in failures),
        )


def _collect(ready, index, results) -> list[tuple[int, Exception]]:
    """Stores the results of ready refs; returns the failed ones as (rank, error)."""
    failures = []
    for ref in ready:
        try:
            results[index[ref]] = ray.get(ref)
        except ray.exceptions.RayError as e:
            failures.append((index[ref], e))
    return failures


def _is_consequence(error: Exception) -> bool:
    # By name: importing hvd_torch here would load torch into every driver.
    cause = getattr(error, "cause", None)
    return type(cause).__name__ == "HorovodInternalError"


def _explain(error: Exception) -> tuple[str, str]:
    """(one-line summary, remote traceback or "")."""
    if isinstance(error, ray.exceptions.RayTaskError):
        cause = error.cause
        summary = f"{type(cause).__name__}: {cause}" if cause is not None else str(error)
        # ray.get raises a copy that is also an instance of the cause's class;
        # the copy keeps no traceback_str, but its str() is Ray's remote
        # traceback (headed by the actor's method, pid and ip).
        return summary, _ANSI.sub("", getattr(error, "traceback_str", None) or str(error))
    if isinstance(error, ray.exceptions.RayActorError):
        return f"the worker process died ({type(error).__name__}): {error}", ""
    return f"{type(error).__name__}: {error}", ""
