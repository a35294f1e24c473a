"""What RayExecutor.create_settings() and ElasticRayExecutor.create_settings() return:
the job's size limits (elastic), time limits and verbosity."""

from __future__ import annotations

import dataclasses

__all__ = ["ElasticRaySettings", "RaySettings"]


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


@dataclasses.dataclass(frozen=True)
class ElasticRaySettings:
    """What ElasticRayExecutor.create_settings() returns, under Horovod's names.

    min_num_proc/max_num_proc bound the number of workers (max None: every
    slot the cluster has). reset_limit: how many membership changes the job
    survives (None: any number). elastic_timeout bounds every wait for workers
    or slots once training started (Horovod's default, 600 s). timeout_s
    bounds a new worker's start: the actor coming up and reaching hvd.init()
    (the driver's join phase never ends sooner), and, as HOROVOD_START_TIMEOUT,
    each engine rendezvous. verbose as in RaySettings; 1 also prints the
    elastic driver's log (rounds, failures), which is short.
    """

    min_num_proc: int = 1
    max_num_proc: int | None = None
    reset_limit: int | None = None
    elastic_timeout: float = 600.0
    timeout_s: float = 30.0
    verbose: int = 1

    def __post_init__(self):
        if not (isinstance(self.min_num_proc, int) and self.min_num_proc >= 1):
            raise ValueError(f"min_num_proc must be an integer >= 1, got {self.min_num_proc!r}")
        if self.max_num_proc is not None and not (
            isinstance(self.max_num_proc, int) and self.max_num_proc >= self.min_num_proc
        ):
            raise ValueError(
                f"max_num_proc must be an integer >= min_num_proc {self.min_num_proc}, "
                f"got {self.max_num_proc!r}"
            )
        if self.reset_limit is not None and not (
            isinstance(self.reset_limit, int) and self.reset_limit >= 0
        ):
            raise ValueError(f"reset_limit must be an integer >= 0, got {self.reset_limit!r}")
        for name in ("elastic_timeout", "timeout_s"):
            value = getattr(self, name)
            if not value > 0:
                raise ValueError(f"ElasticRaySettings.{name} must be positive, got {value!r}")
        if self.verbose not in (0, 1, 2):
            raise ValueError(f"verbose must be 0, 1 or 2, got {self.verbose!r}")
