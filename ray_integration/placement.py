"""Where the workers go: the placement group's bundles, reserving them, and
saying clearly when the cluster cannot grant them.

Two layouts, Horovod's:
  num_workers=N                  N bundles of one worker each, strategy PACK:
                                 as few nodes as fit, the workers of one node
                                 next to each other in rank;
  num_hosts=H, num_workers_per_host=K
                                 H bundles of K workers each, STRICT_SPREAD:
                                 exactly K workers on each of H distinct nodes.
Workers are scheduled into their bundle with PlacementGroupSchedulingStrategy,
so Ray's node ids, not `node:<ip>` resources, decide where a worker runs.

Inside a Tune trial (or any task running in a placement group) the job can use
the current group instead: its last bundles, one per planned bundle, which is
where DistributedTrainableCreator puts them (the trial itself has bundle 0).
"""

from __future__ import annotations

import contextlib
import dataclasses

import ray
from ray.util.placement_group import (
    PlacementGroup,
    get_current_placement_group,
    placement_group,
    remove_placement_group,
)

__all__ = [
    "PlacementPlan",
    "PlacementTimeoutError",
    "Reservation",
    "describe_cluster",
    "plan",
    "release",
    "reserve",
]


class PlacementTimeoutError(TimeoutError):
    """The cluster did not grant the placement group in time. The message says
    what was asked and what the cluster has."""


@dataclasses.dataclass(frozen=True)
class PlacementPlan:
    """The bundles to reserve and which bundle each worker (by index) takes."""

    bundles: tuple[dict, ...]
    strategy: str
    worker_bundle: tuple[int, ...]
    worker_resources: dict  # what each worker actor asks of its bundle

    @property
    def num_workers(self) -> int:
        return len(self.worker_bundle)

    def describe(self) -> str:
        return f"{len(self.bundles)} bundle(s) of {_fmt(self.bundles[0])} ({self.strategy})"


@dataclasses.dataclass(frozen=True)
class Reservation:
    """A granted placement group and the bundle index of each worker.
    owned: we created the group (and remove it); otherwise it is the caller's."""

    group: PlacementGroup
    worker_bundle: tuple[int, ...]
    owned: bool


def plan(
    num_workers: int | None,
    num_hosts: int | None,
    num_workers_per_host: int,
    cpus_per_worker: float,
    gpus_per_worker: float,
) -> PlacementPlan:
    """The placement for RayExecutor's arguments; raises ValueError on a bad mix."""
    if (num_workers is None) == (num_hosts is None):
        raise ValueError(
            "RayExecutor needs exactly one of num_workers (packed on as few nodes as "
            "fit) or num_hosts (x num_workers_per_host, one group per node); got "
            f"num_workers={num_workers!r}, num_hosts={num_hosts!r}"
        )
    if cpus_per_worker < 0 or gpus_per_worker < 0 or cpus_per_worker + gpus_per_worker == 0:
        raise ValueError(
            "each worker must ask for some CPUs or GPUs: got cpus_per_worker="
            f"{cpus_per_worker!r}, gpus_per_worker={gpus_per_worker!r}"
        )
    worker = {"CPU": cpus_per_worker}
    if gpus_per_worker:
        worker["GPU"] = gpus_per_worker
    if num_workers is not None:
        _check_positive("num_workers", num_workers)
        return PlacementPlan(
            bundles=(dict(worker),) * num_workers,
            strategy="PACK",
            worker_bundle=tuple(range(num_workers)),
            worker_resources=worker,
        )
    _check_positive("num_hosts", num_hosts)
    _check_positive("num_workers_per_host", num_workers_per_host)
    host = {k: v * num_workers_per_host for k, v in worker.items()}
    return PlacementPlan(
        bundles=(host,) * num_hosts,
        strategy="STRICT_SPREAD",
        worker_bundle=tuple(h for h in range(num_hosts) for _ in range(num_workers_per_host)),
        worker_resources=worker,
    )


def reserve(spec: PlacementPlan, timeout_s: float, use_current: bool) -> Reservation:
    """Returns once every bundle is granted; raises PlacementTimeoutError after
    timeout_s (and removes the group, so nothing stays half-reserved)."""
    current = get_current_placement_group() if use_current else None
    if current is not None:
        return _inside(current, spec)
    group = placement_group(list(spec.bundles), strategy=spec.strategy)
    ready, _ = ray.wait([group.ready()], timeout=timeout_s)
    if not ready:
        remove_placement_group(group)
        raise PlacementTimeoutError(
            f"the cluster did not grant {spec.describe()} for {spec.num_workers} worker(s) "
            f"within placement_group_timeout_s={timeout_s:g}s. {describe_cluster()}. " + _hint(spec)
        )
    return Reservation(group=group, worker_bundle=spec.worker_bundle, owned=True)


def release(reservation: Reservation | None) -> None:
    """Removes the group if we created it; safe to call twice."""
    if reservation is None or not reservation.owned:
        return
    # Removing twice is a no-op in Ray; an error here means Ray itself is
    # gone, and the group with it.
    with contextlib.suppress(ray.exceptions.RayError):
        remove_placement_group(reservation.group)


def describe_cluster() -> str:
    """One line: the cluster's CPU/GPU (and custom) resources, total and free,
    and each alive node's share."""
    total, free = ray.cluster_resources(), ray.available_resources()
    keys = [k for k in sorted(total) if _interesting(k)]
    summary = ", ".join(f"{k} {_num(free.get(k, 0))} free of {_num(total[k])}" for k in keys)
    nodes = [n for n in ray.nodes() if n.get("Alive")]
    per_node = "; ".join(
        f"{n['NodeManagerAddress']} ({n['NodeID'][:8]}): "
        + _fmt({k: v for k, v in n["Resources"].items() if _interesting(k)})
        for n in nodes
    )
    return f"The cluster has {summary or 'no CPUs or GPUs'} on {len(nodes)} node(s): {per_node}"


def _inside(current: PlacementGroup, spec: PlacementPlan) -> Reservation:
    """Uses the last len(spec.bundles) bundles of the caller's group."""
    have = current.bundle_specs
    need = len(spec.bundles)
    if len(have) < need:
        raise ValueError(
            f"use_current_placement_group=True, but the current placement group has "
            f"{len(have)} bundle(s) and the job needs {need} ({spec.describe()}): create the "
            "trial with DistributedTrainableCreator, or pass use_current_placement_group=False"
        )
    offset = len(have) - need
    for i, wanted in enumerate(spec.bundles):
        got = have[offset + i]
        if any(got.get(k, 0) < v for k, v in wanted.items()):
            raise ValueError(
                f"bundle {offset + i} of the current placement group holds {_fmt(got)}, "
                f"but a worker bundle needs {_fmt(wanted)}"
            )
    return Reservation(
        group=current,
        worker_bundle=tuple(offset + b for b in spec.worker_bundle),
        owned=False,
    )


def _hint(spec: PlacementPlan) -> str:
    if spec.strategy == "STRICT_SPREAD":
        return (
            f"STRICT_SPREAD needs {len(spec.bundles)} distinct nodes, each with "
            f"{_fmt(spec.bundles[0])} free."
        )
    return "Ask for fewer workers or resources per worker, or add nodes."


def _check_positive(name: str, value) -> None:
    if not isinstance(value, int) or value < 1:
        raise ValueError(f"{name} must be a positive integer, got {value!r}")


def _interesting(key: str) -> bool:
    # node:<ip>, memory and object_store_memory are bookkeeping, not what a worker asks for.
    return not key.startswith("node:") and key not in ("memory", "object_store_memory")


def _num(x: float) -> str:
    return f"{x:g}"


def _fmt(resources: dict) -> str:
    return "{" + ", ".join(f"{k}: {_num(v)}" for k, v in sorted(resources.items())) + "}"
