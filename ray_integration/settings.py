"""What RayExecutor.create_settings() returns: the job's time limits and verbosity."""

from __future__ import annotations

import dataclasses

__all__ = ["RaySettings"]


@dataclasses.dataclass(frozen=True)
class RaySettings:
    """Time limits of one job, under Horovod's names.

    timeout_s bounds everything that happens once per start(): the worker
    actors coming up and reporting where they landed, and (as
    HOROVOD_START_TIMEOUT) every rank's rendezvous in hvd.init(). It never
    bounds run()/execute(): training takes as long as it takes.
    placement_group_timeout_s bounds the wait for the cluster to grant the
    placement group; past it start() raises PlacementTimeoutError.
    verbose: 0 is silent, 1 prints one line per start() on stderr, 2 adds
    one line per worker.
    """

    timeout_s: float = 30.0
    placement_group_timeout_s: float = 100.0
    verbose: int = 1

    def __post_init__(self):
        for name in ("timeout_s", "placement_group_timeout_s"):
            value = getattr(self, name)
            if not value > 0:
                raise ValueError(f"RaySettings.{name} must be positive, got {value!r}")
        if self.verbose not in (0, 1, 2):
            raise ValueError(f"RaySettings.verbose must be 0, 1 or 2, got {self.verbose!r}")
