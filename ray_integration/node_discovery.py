"""Host discovery for elastic jobs on Ray: the cluster's alive nodes as slots.

The elastic driver asks a discovery callable for {host: slots} about once a
second. Here a "host" is one Ray node, named by a label "<ip>/<node id[:8]>":
readable in the driver's log, and distinct for two nodes that share a machine
(ray.cluster_utils.Cluster), which Ray's node id is and an IP would not be.
The label is mapped back to the node id (where to schedule a worker) and its IP
(the engine's hostname) through node(); a node once seen stays known, so a
label the driver still holds resolves after its node is gone.

Slots come from a node's *total* resources, as in Horovod's Ray discovery:
the job is assumed to own the cluster. A node with 3 CPUs and cpus_per_worker=1
has 3 slots whether or not they are free right now; a worker started on a busy
node waits for its resources, bounded by the driver's join timeout.

Threading: called from the elastic driver's thread only.
"""

from __future__ import annotations

import dataclasses
import math

import ray

__all__ = ["NodeDiscovery", "RayNode"]


@dataclasses.dataclass(frozen=True)
class RayNode:
    node_id: str
    ip: str


class NodeDiscovery:
    """() -> {label: slots} over the alive nodes of the connected Ray cluster."""

    def __init__(self, cpus_per_worker: float, gpus_per_worker: float = 0):
        if not cpus_per_worker > 0 or gpus_per_worker < 0:
            raise ValueError(
                f"need cpus_per_worker > 0 and gpus_per_worker >= 0, got "
                f"{cpus_per_worker!r}, {gpus_per_worker!r}"
            )
        self._cpus = cpus_per_worker
        self._gpus = gpus_per_worker
        self._nodes: dict[str, RayNode] = {}

    def __call__(self) -> dict[str, int]:
        hosts = {}
        for info in ray.nodes():
            if not info.get("Alive"):
                continue
            node = RayNode(info["NodeID"], info["NodeManagerAddress"])
            label = f"{node.ip}/{node.node_id[:8]}"
            self._nodes[label] = node
            slots = self.slots(info.get("Resources", {}))
            if slots > 0:
                hosts[label] = slots
        return hosts

    def slots(self, resources: dict) -> int:
        """Workers a node with these total resources holds."""
        # A small epsilon: Ray reports fractional resources as floats (0.1 * 3).
        slots = math.floor(resources.get("CPU", 0) / self._cpus + 1e-9)
        if self._gpus:
            slots = min(slots, math.floor(resources.get("GPU", 0) / self._gpus + 1e-9))
        return slots

    def node(self, label: str) -> RayNode:
        """The node behind a label this discovery returned (KeyError otherwise)."""
        return self._nodes[label]
