"""Ranks from where the workers landed: local and cross ranks per Ray node.

Pure functions over node ids, so the layout is tested without starting Ray.
The engine reads these numbers from the environment (HOROVOD_LOCAL_RANK, ...)
and decides from HOROVOD_CROSS_SIZE whether it may use loopback only
(cross_size == 1) or must listen on the node's address.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

__all__ = ["Slot", "assign_ranks", "visible_devices"]


@dataclasses.dataclass(frozen=True)
class Slot:
    """One worker's place in the job."""

    worker: int  # index of the actor in creation order
    rank: int
    local_rank: int
    local_size: int
    cross_rank: int  # index of the worker's node among the job's nodes
    cross_size: int  # number of nodes in the job
    node_id: str


def assign_ranks(node_ids: Sequence[str]) -> list[Slot]:
    """node_ids[i] is the node worker i landed on; returns the slots in rank order.

    Workers on one node get consecutive ranks, as under horovodrun, so that
    local_rank is the rank's position on its node. Nodes are ordered by their
    first worker, which keeps worker 0 (the first bundle) at rank 0.

    cross_size is the number of nodes, and cross_rank the node's index, on every
    rank. Horovod counts, for heterogeneous layouts, only the nodes that have a
    worker with the same local rank; we do not, because the engine takes
    cross_size == 1 to mean "all ranks on one host, use loopback", which must
    not hold for a rank whose peers are on other nodes.
    """
    nodes: list[str] = []
    members: dict[str, list[int]] = {}
    for worker, node in enumerate(node_ids):
        if node not in members:
            nodes.append(node)
            members[node] = []
        members[node].append(worker)
    slots = []
    for cross_rank, node in enumerate(nodes):
        workers = members[node]
        for local_rank, worker in enumerate(workers):
            slots.append(
                Slot(
                    worker=worker,
                    rank=len(slots),
                    local_rank=local_rank,
                    local_size=len(workers),
                    cross_rank=cross_rank,
                    cross_size=len(nodes),
                    node_id=node,
                )
            )
    return slots


def visible_devices(slots: Sequence[Slot], gpu_ids: Sequence[Sequence[str]]) -> list[str]:
    """CUDA_VISIBLE_DEVICES for each slot (in the order given): every GPU Ray
    assigned to the workers on the slot's node, each listed once, with the
    worker's own first GPU at index local_rank % (GPUs on the node).

    gpu_ids[slot.worker] lists the GPU ids Ray assigned to that worker. The ids
    stay Ray's (physical) ids, not renumbered from 0. With one GPU per worker
    the list is the node's GPUs in local-rank order, the same on every local
    rank, and torch.cuda.set_device(hvd.local_rank()) picks the worker's own
    (Horovod's convention). Seeing its node peers' GPUs too is what lets CUDA
    peer-to-peer copies between local ranks work.

    With several GPUs per worker or a shared GPU (a fractional gpus_per_worker)
    the node has more or fewer GPUs than local ranks. Each worker's list is
    then rotated so that local_rank % count, the GPU hvd_torch uses for the
    rank (hvd_torch/gpu.py), is the one Ray assigned it; its other GPUs follow.
    """
    per_node: dict[str, list[str]] = {}
    for slot in sorted(slots, key=lambda s: (s.node_id, s.local_rank)):
        devices = per_node.setdefault(slot.node_id, [])
        devices.extend(str(g) for g in gpu_ids[slot.worker] if str(g) not in devices)
    return [",".join(_own_first(per_node[slot.node_id], gpu_ids[slot.worker], slot.local_rank))
            for slot in slots]


def _own_first(devices: list[str], own: Sequence[str], local_rank: int) -> list[str]:
    """`devices` rotated so that own[0] sits at index local_rank % len(devices)."""
    if not own or not devices:
        return devices
    shift = devices.index(str(own[0])) - local_rank % len(devices)
    return devices[shift:] + devices[:shift]
