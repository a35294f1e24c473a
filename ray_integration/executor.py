"""RayExecutor: Horovod's Ray driver API for hvd-torch jobs.

    settings = RayExecutor.create_settings(timeout_s=30)
    executor = RayExecutor(settings, num_workers=4)
    executor.start()                       # or start(executable_cls=MyModel)
    ranks = executor.run(fn)               # fn() on every worker, results by rank
    executor.shutdown()

start() reserves a placement group (placement.py), serves the job's Gloo
rendezvous store on the driver, starts one actor per rank (worker_group.py),
gives each its rank environment (hvdrun.env) and, for stateful jobs,
builds one executable per worker. The pieces are separate so an elastic
executor can reuse them with its own rendezvous and restart policy.

Not thread-safe: one driver thread owns an executor.
"""

from __future__ import annotations

import sys
from collections.abc import Callable, Sequence

import ray

from hvdrun.env import horovod_env
from hvdrun.store import KVStoreServer

from . import placement
from .refusals import refuse_cooldown_range, refuse_ray_client
from .settings import RaySettings
from .topology import visible_devices
from .worker_group import WorkerFailure, WorkerGroup

__all__ = ["RayExecutor"]


class RayExecutor:
    """A fixed-size hvd-torch job on Ray workers.

    Give num_workers (packed onto as few nodes as fit) or num_hosts with
    num_workers_per_host (exactly that many workers on each of num_hosts
    distinct nodes). cpus_per_slot/gpus_per_slot are Horovod's older names for
    cpus_per_worker/gpus_per_worker. use_gpu gives each worker
    gpus_per_worker (default 1) GPUs. use_current_placement_group: when called
    from inside a placement group (a Tune trial), put the workers in its last
    bundles instead of reserving a new group.

    Elastic mode: with min_workers and/or max_workers, RayExecutor(...)
    returns an ElasticRayExecutor (elastic.py) instead, which takes
    reset_limit and elastic_timeout too and discovers its slots from the
    cluster's nodes; num_workers, num_hosts and placement groups do not apply.
    """

    def __new__(
        cls,
        settings: RaySettings | None = None,
        *args,
        min_workers: int | None = None,
        max_workers: int | None = None,
        reset_limit: int | None = None,
        cooldown_range: tuple | None = None,
        elastic_timeout: float | None = None,
        override_discovery: bool = True,
        **kwargs,
    ):
        refuse_cooldown_range(cooldown_range)
        if not override_discovery:
            raise ValueError(
                "override_discovery=False is not supported: an elastic Ray job discovers its "
                "slots from the cluster's nodes (there is no discovery script to give)")
        if min_workers is None and max_workers is None:
            if reset_limit is not None or elastic_timeout is not None:
                raise ValueError(
                    "reset_limit and elastic_timeout are for elastic jobs: give min_workers "
                    "and/or max_workers"
                )
            return super().__new__(cls)
        # Not a subclass, so Python will not call __init__ on what we return.
        from .elastic import ElasticRayExecutor

        return ElasticRayExecutor.from_ray_executor_args(
            settings,
            min_workers=min_workers,
            max_workers=max_workers,
            reset_limit=reset_limit,
            elastic_timeout=elastic_timeout,
            **_elastic_resources(*args, **kwargs),
        )

    @classmethod
    def create_settings(
        cls,
        timeout_s: float = 30,
        placement_group_timeout_s: float = 100,
        verbose: int = 1,
        ssh_identity_file: str | None = None,
        ssh_str: str | None = None,
        nics: set | None = None,
    ) -> RaySettings:
        """Settings for RayExecutor (see RaySettings).

        ssh_identity_file and ssh_str are accepted for Horovod scripts and have
        no use here: Ray starts the workers, nobody logs in over SSH. nics has
        no equivalent: ranks talk over the address Ray knows each node by.
        """
        if nics:
            raise ValueError(
                "create_settings(nics=...) is not supported: hvd-torch workers on Ray use "
                "the node address Ray reports (see docs/ray.md, 'Clusters')"
            )
        return RaySettings(
            timeout_s=timeout_s,
            placement_group_timeout_s=placement_group_timeout_s,
            verbose=verbose,
        )

    def __init__(
        self,
        settings: RaySettings | None = None,
        num_workers: int | None = None,
        num_hosts: int | None = None,
        num_workers_per_host: int = 1,
        cpus_per_worker: float = 1,
        use_gpu: bool = False,
        gpus_per_worker: float | None = None,
        use_current_placement_group: bool = True,
        cpus_per_slot: float | None = None,
        gpus_per_slot: float | None = None,
        *,
        min_workers: None = None,  # always None here: see __new__
        max_workers: None = None,
        reset_limit: None = None,
        cooldown_range: None = None,
        elastic_timeout: None = None,
        override_discovery: bool = True,
    ):
        self.settings = settings if settings is not None else RaySettings()
        cpus = cpus_per_slot if cpus_per_slot is not None else cpus_per_worker
        gpus = gpus_per_slot if gpus_per_slot is not None else gpus_per_worker
        if gpus and not use_gpu:
            raise ValueError(
                f"gpus_per_worker={gpus!r} needs use_gpu=True (without it workers get no GPU)"
            )
        self.use_gpu = use_gpu
        self._plan = placement.plan(
            num_workers, num_hosts, num_workers_per_host, cpus, (gpus or 1) if use_gpu else 0
        )
        self._use_current = use_current_placement_group
        self._reservation: placement.Reservation | None = None
        self._store: KVStoreServer | None = None
        self._group: WorkerGroup | None = None

    @property
    def num_workers(self) -> int:
        return self._plan.num_workers

    @property
    def workers(self) -> list:
        """The worker actors in rank order (empty when not started): for
        inspection, or to kill one in a test."""
        return list(self._group.actors) if self._group is not None else []

    # -- lifecycle

    def start(
        self,
        executable_cls: type | None = None,
        executable_args: Sequence | None = None,
        executable_kwargs: dict | None = None,
        extra_env_vars: dict | None = None,
    ) -> None:
        """Reserves the workers' resources, starts them and sets their rank
        environment; with executable_cls, each worker then builds
        executable_cls(*executable_args, **executable_kwargs) and keeps it.

        Raises PlacementTimeoutError if the cluster cannot grant the resources
        within placement_group_timeout_s, TimeoutError if the workers do not
        start within timeout_s, WorkerFailure if a constructor raises. On any
        error nothing is left running.
        """
        if self._group is not None:
            raise RuntimeError("RayExecutor.start(): already started; shutdown() first")
        if not ray.is_initialized():
            ray.init()  # Horovod's behaviour: a local Ray, or RAY_ADDRESS's cluster
        refuse_ray_client("RayExecutor.start()")
        settings = self.settings
        try:
            self._reservation = placement.reserve(
                self._plan, settings.placement_group_timeout_s, self._use_current
            )
            # The store listens on the driver node's address, which every node
            # reaches (Ray's own services use it); the secret keeps other
            # jobs' ranks out.
            self._store = KVStoreServer(ray.util.get_node_ip_address(), 0).start()
            self._group = WorkerGroup.start(
                self._reservation, self._plan.worker_resources, settings.timeout_s
            )
            envs = self._rank_envs(extra_env_vars or {})
            self._group.gather(
                self._group.submit("setup", [(env,) for env in envs]),
                "start",
                timeout_s=settings.timeout_s,
            )
            self._log_layout()
            if executable_cls is not None:
                job = (executable_cls, tuple(executable_args or ()), dict(executable_kwargs or {}))
                # No timeout: a constructor may train, load data or call hvd.init().
                self._group.gather(
                    self._group.submit("construct", None, *job),
                    f"start({executable_cls.__name__})",
                )
        except BaseException:
            self.shutdown()
            raise

    def shutdown(self) -> None:
        """Stops the workers, frees the placement group, closes the store.
        Safe to call twice, and after a failure."""
        group, self._group = self._group, None
        reservation, self._reservation = self._reservation, None
        store, self._store = self._store, None
        if group is not None:
            group.kill()
        placement.release(reservation)
        if store is not None:
            store.stop()

    # -- calls

    def run(
        self,
        fn: Callable,
        args: Sequence | None = None,
        kwargs: dict | None = None,
        callbacks: Sequence[Callable] | None = None,
    ) -> list:
        """fn(*args, **kwargs) on every worker at once; the results in rank order.

        callbacks are called on the driver with each value rank 0 passes to
        ray_integration.report() while fn runs. If any worker raises or dies,
        every worker is stopped, the executor shuts down (start() it again to
        go on), and WorkerFailure names the rank, its host and the remote
        traceback.
        """
        group = self._require_started("run")
        job = ray.put((fn, tuple(args or ()), dict(kwargs or {})))
        return self._gather(group.submit("run", None, job), f"run({_name(fn)})", callbacks)

    def run_remote(
        self, fn: Callable, args: Sequence | None = None, kwargs: dict | None = None
    ) -> list:
        """Like run() but returns at once with one ObjectRef per rank, in rank
        order. Waiting for them, and stopping the others if one fails, is the
        caller's job."""
        group = self._require_started("run_remote")
        job = ray.put((fn, tuple(args or ()), dict(kwargs or {})))
        return group.submit("run", None, job)

    def execute(self, fn: Callable, callbacks: Sequence[Callable] | None = None) -> list:
        """fn(executable) on every worker's executable; the results in rank
        order. Failures as in run()."""
        group = self._require_started("execute")
        ref = ray.put(fn)
        return self._gather(group.submit("execute", None, ref), f"execute({_name(fn)})", callbacks)

    def execute_single(self, fn: Callable):
        """fn(executable) on rank 0 only; its result. A failure raises
        WorkerFailure but leaves the workers running: the other ranks were not
        part of the call, so none of them is waiting on rank 0."""
        group = self._require_started("execute_single")
        ref = group.actors[0].execute.remote(ray.put(fn))
        # One ref: gather's "rank 0" is this group's rank 0.
        return self._gather([ref], f"execute_single({_name(fn)})", stop_on_failure=False)[0]

    # -- internals

    def _gather(self, refs, what, callbacks=None, stop_on_failure=True) -> list:
        """group.gather, and a full shutdown whenever it stopped the workers: a
        job that lost a rank cannot go on, so its placement group and store
        are freed at once rather than when the caller remembers shutdown()."""
        try:
            return self._group.gather(
                refs, what, callbacks=callbacks or (), stop_on_failure=stop_on_failure
            )
        except WorkerFailure:
            if stop_on_failure:
                self.shutdown()
            raise
        except BaseException:
            self.shutdown()
            raise

    def _require_started(self, method: str) -> WorkerGroup:
        if self._group is None:
            raise RuntimeError(
                f"RayExecutor.{method}(): the executor is not started (call start(); after a "
                "worker failure the executor is shut down and must be started again)"
            )
        return self._group

    def _rank_envs(self, extra: dict) -> list[dict]:
        group, store = self._group, self._store
        size = group.size
        # torch.distributed's env:// rendezvous (MASTER_ADDR/MASTER_PORT): rank 0
        # serves a TCPStore at its node's address, on a port its own node says is free.
        # One ref: gather's "rank 0" is this group's rank 0.
        (master_port,) = group.gather(
            [group.actors[0].free_port.remote()], "start", timeout_s=self.settings.timeout_s
        )
        # Each rank binds Gloo to its node's address, which Ray knows is
        # reachable; with one node the engine uses loopback regardless.
        envs = [
            horovod_env(
                place.slot.rank,
                size,
                ray.util.get_node_ip_address(),
                store.port,
                store.secret,
                local_rank=place.slot.local_rank,
                local_size=place.slot.local_size,
                cross_rank=place.slot.cross_rank,
                cross_size=place.slot.cross_size,
                hostname=place.node_ip,
                start_timeout=self.settings.timeout_s,
                master_addr=group.places[0].node_ip,
                master_port=master_port,
            )
            for place in group.places
        ]
        if self.use_gpu:
            slots = [p.slot for p in group.places]
            gpu_ids = {p.slot.worker: p.gpu_ids for p in group.places}
            for env, devices in zip(envs, visible_devices(slots, gpu_ids)):
                env["CUDA_VISIBLE_DEVICES"] = devices
        for env in envs:
            env.update({k: str(v) for k, v in extra.items()})
        return envs

    def _log_layout(self) -> None:
        if self.settings.verbose == 0:
            return
        places = self._group.places
        nodes = {p.slot.node_id for p in places}
        print(
            f"[ray_integration] {len(places)} worker(s) on {len(nodes)} node(s), store at "
            f"{self._store.address}",
            file=sys.stderr,
        )
        if self.settings.verbose >= 2:
            for p in places:
                gpus = f", GPUs {','.join(p.gpu_ids)}" if p.gpu_ids else ""
                print(
                    f"[ray_integration]   rank {p.slot.rank} (local {p.slot.local_rank}, cross "
                    f"{p.slot.cross_rank}) on {p.describe()}{gpus}",
                    file=sys.stderr,
                )


def _elastic_resources(
    num_workers: int | None = None,
    num_hosts: int | None = None,
    num_workers_per_host: int = 1,
    cpus_per_worker: float = 1,
    use_gpu: bool = False,
    gpus_per_worker: float | None = None,
    use_current_placement_group: bool = True,
    cpus_per_slot: float | None = None,
    gpus_per_slot: float | None = None,
) -> dict:
    """The elastic executor's share of RayExecutor's arguments (same order).
    The size arguments are refused: min/max and the cluster decide it."""
    if num_workers is not None or num_hosts is not None or num_workers_per_host != 1:
        raise ValueError(
            "an elastic RayExecutor (min_workers/max_workers) sizes itself from the cluster's "
            "nodes: leave out num_workers, num_hosts and num_workers_per_host"
        )
    # use_current_placement_group has no meaning without a placement group.
    return {
        "cpus_per_worker": cpus_per_slot if cpus_per_slot is not None else cpus_per_worker,
        "use_gpu": use_gpu,
        "gpus_per_worker": gpus_per_slot if gpus_per_slot is not None else gpus_per_worker,
    }


def _name(fn) -> str:
    return getattr(fn, "__name__", type(fn).__name__)
