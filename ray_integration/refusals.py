"""What the Ray drivers (RayExecutor, ElasticRayExecutor) refuse with a clear
message instead of ignoring: Horovod arguments that have no meaning here, and a
driver connected through Ray Client."""

from __future__ import annotations

__all__ = ["refuse_cooldown_range", "refuse_ray_client"]


def refuse_cooldown_range(cooldown_range) -> None:
    """Horovod's cooldown_range (seconds a failing host stays blacklisted,
    growing between the bounds): the elastic driver here blacklists a host
    after 3 failures for good, so a range would be ignored. Refused instead."""
    if cooldown_range is not None:
        raise ValueError(
            f"cooldown_range={cooldown_range!r} is not supported: a host that fails 3 times is "
            "blacklisted for the rest of the job (no cooldown); leave cooldown_range=None")


def refuse_ray_client(what: str) -> None:
    """Ray Client (ray.init("ray://...")): the driver runs outside the cluster,
    but the job's rendezvous store lives in the driver process and every worker
    must reach it. Refused with a clear message rather than a rendezvous that
    times out."""
    try:
        from ray.util.client import ray as client_ray

        connected = client_ray.is_connected()
    except ImportError:  # a Ray without the client
        connected = False
    if connected:
        raise RuntimeError(
            f"{what}: Ray Client (ray://) connections are not supported: the job's rendezvous "
            "store runs in this driver process, which the cluster's workers must reach. Run "
            "the driver on the cluster instead (ray job submit, or a script on the head node; "
            "docs/ray.md, 'Clusters')")
