"""ElasticRayExecutor: elastic hvd-torch jobs on a Ray cluster.

    executor = RayExecutor(settings, min_workers=2, max_workers=4)   # or:
    executor = ElasticRayExecutor(ElasticRayExecutor.create_settings(min_num_proc=2))
    executor.start()
    results = executor.run(train)     # train() calls an @hvd.elastic.run loop
    executor.shutdown()

The job's workers are actors on the cluster's nodes, as many as the nodes'
resources hold (node_discovery.py), between min and max. Workers that die are
replaced, workers for new nodes are started, and the training loop goes on
from its last commit: hvdrun.elastic_driver.ElasticDriver does all
of that, here with Ray actors as its workers (elastic_launcher.py), and runs
in the thread that calls run(). Protocol: docs/elastic.md; this mode:
docs/ray.md, "Elastic mode".

Each run() is one elastic job with its own store (and secret), so run() may be
called again after a failure. Not thread-safe: one driver thread owns an
executor; `workers` may be read from another thread (a test killing one).
"""

from __future__ import annotations

import re
import sys
from collections.abc import Callable, Sequence

import ray

from hvdrun import elastic_keys as keys
from hvdrun.elastic_driver import ElasticDriver
from hvdrun.store import KVStoreClient, KVStoreServer, StoreError, secret_to_hex

from .elastic_launcher import RayLauncher
from .node_discovery import NodeDiscovery
from .refusals import refuse_cooldown_range, refuse_ray_client
from .settings import ElasticRaySettings, RaySettings

__all__ = ["ElasticRayExecutor"]

# The driver speaks hvdrun's flag names; a Ray user set these parameters.
_FLAG_NAMES = {
    "--min-np": "min_workers",
    "--max-np": "max_workers",
    "--reset-limit": "reset_limit",
    "--elastic-timeout": "elastic_timeout",
    "--start-timeout": "timeout_s",
}
_FLAGS = re.compile("|".join(re.escape(f) for f in _FLAG_NAMES))


def _ray_names(text: str) -> str:
    return _FLAGS.sub(lambda m: _FLAG_NAMES[m.group(0)], text)


class ElasticRayExecutor:
    """An elastic hvd-torch job on the whole Ray cluster (Horovod's API).

    use_gpu, cpus_per_slot, gpus_per_slot: each worker's resources, which
    also decide how many workers a node holds. env_vars: set on every worker
    before the function runs. override_discovery is accepted for Horovod
    scripts; discovery is always the cluster's nodes.
    """

    @staticmethod
    def create_settings(
        min_num_proc: int = 1,
        max_num_proc: int | None = None,
        reset_limit: int | None = None,
        elastic_timeout: float = 600,
        timeout_s: float = 30,
        ssh_identity_file: str | None = None,
        nics: set | None = None,
        verbose: int = 1,
        cooldown_range: tuple | None = None,
    ) -> ElasticRaySettings:
        """Settings for ElasticRayExecutor (see ElasticRaySettings).
        ssh_identity_file is accepted and unused, nics refused, as in
        RayExecutor.create_settings; cooldown_range refused (see
        refuse_cooldown_range)."""
        refuse_cooldown_range(cooldown_range)
        if nics:
            raise ValueError(
                "create_settings(nics=...) is not supported: hvd-torch workers on Ray use "
                "the node address Ray reports (see docs/ray.md, 'Clusters')"
            )
        return ElasticRaySettings(
            min_num_proc=min_num_proc,
            max_num_proc=max_num_proc,
            reset_limit=reset_limit,
            elastic_timeout=elastic_timeout,
            timeout_s=timeout_s,
            verbose=verbose,
        )

    def __init__(
        self,
        settings: ElasticRaySettings | None = None,
        use_gpu: bool = False,
        cpus_per_slot: float = 1,
        gpus_per_slot: float | None = None,
        env_vars: dict | None = None,
        override_discovery: bool = True,
    ):
        if gpus_per_slot and not use_gpu:
            raise ValueError(
                f"gpus_per_slot={gpus_per_slot!r} needs use_gpu=True (without it workers get "
                "no GPU)"
            )
        if not override_discovery:
            raise ValueError(
                "override_discovery=False is not supported: an elastic Ray job discovers its "
                "slots from the cluster's nodes"
            )
        self.settings = settings if settings is not None else ElasticRaySettings()
        self.use_gpu = use_gpu
        self.cpus_per_slot = cpus_per_slot
        self.gpus_per_slot = (gpus_per_slot or 1) if use_gpu else 0
        # Checked now rather than at the first discovery, in the driver's thread.
        NodeDiscovery(self.cpus_per_slot, self.gpus_per_slot)
        self._env = {k: str(v) for k, v in (env_vars or {}).items()}
        self._started = False
        self._executable = (None, (), {})
        self._launcher: RayLauncher | None = None
        self._driver: ElasticDriver | None = None

    @classmethod
    def from_ray_executor_args(
        cls,
        settings: RaySettings | None,
        *,
        min_workers: int | None,
        max_workers: int | None,
        reset_limit: int | None,
        elastic_timeout: float | None,
        cpus_per_worker: float,
        use_gpu: bool,
        gpus_per_worker: float | None,
    ) -> ElasticRayExecutor:
        """RayExecutor(settings, min_workers=..., ...)'s elastic executor: the
        time limit and verbosity come from the RaySettings."""
        settings = settings if settings is not None else RaySettings()
        elastic = ElasticRaySettings(
            min_num_proc=1 if min_workers is None else min_workers,
            max_num_proc=max_workers,
            reset_limit=reset_limit,
            elastic_timeout=600.0 if elastic_timeout is None else elastic_timeout,
            timeout_s=settings.timeout_s,
            verbose=settings.verbose,
        )
        return cls(elastic, use_gpu=use_gpu, cpus_per_slot=cpus_per_worker,
                   gpus_per_slot=gpus_per_worker)  # fmt: skip

    @property
    def workers(self) -> dict:
        """{worker id: actor handle} of the running workers of the job in
        flight (empty between jobs): for inspection, or to kill one in a test."""
        launcher = self._launcher
        return launcher.workers() if launcher is not None else {}

    @property
    def resets(self) -> int:
        """Rounds after the first in the last (or current) job: every failure,
        replacement or resize costs one."""
        return self._driver.resets if self._driver is not None else 0

    # -- lifecycle

    def start(
        self,
        executable_cls: type | None = None,
        executable_args: Sequence | None = None,
        executable_kwargs: dict | None = None,
        extra_env_vars: dict | None = None,
    ) -> None:
        """Connects to Ray (ray.init() if needed, as RayExecutor.start()).
        Workers start in run()/execute(), as the cluster's nodes allow; with
        executable_cls, each worker of each round builds
        executable_cls(*executable_args, **executable_kwargs) for execute()
        (Horovod's elastic adapter: workers come and go, so the executable is
        built where the worker runs, not kept from start())."""
        if not ray.is_initialized():
            ray.init()
        refuse_ray_client("ElasticRayExecutor.start()")
        self._env.update({k: str(v) for k, v in (extra_env_vars or {}).items()})
        self._executable = (executable_cls, tuple(executable_args or ()),
                            dict(executable_kwargs or {}))
        self._started = True

    def execute(self, fn: Callable, callbacks: Sequence[Callable] | None = None) -> list:
        """fn(executable) on every elastic worker until training ends, the
        executable built on the worker from start()'s executable_cls (None
        without one); results as run()'s."""
        return self.run(_execute_on_worker, args=(fn, *self._executable), callbacks=callbacks)

    def run_remote(self, fn: Callable, args: Sequence | None = None,
                   kwargs: dict | None = None) -> list:
        """Not in elastic mode, as in Horovod: elastic workers are ephemeral."""
        raise NotImplementedError(
            "ObjectRefs cannot be returned from elastic runs as the workers are ephemeral; "
            "use run() or execute()")

    def execute_single(self, fn: Callable):
        """Not in elastic mode, as in Horovod: there is no fixed rank 0 to run it on."""
        raise NotImplementedError(
            "elastic mode does not support execute_single(); use execute() instead")

    def shutdown(self) -> None:
        """Stops the workers of a job still in flight; safe to call twice."""
        launcher, self._launcher = self._launcher, None
        if launcher is not None:
            launcher.stop()
        self._started = False

    # -- the job

    def run(
        self,
        worker_fn: Callable,
        args: Sequence | None = None,
        kwargs: dict | None = None,
        callbacks: Sequence[Callable] | None = None,
    ) -> list:
        """Runs worker_fn(*args, **kwargs) on elastic workers until training ends.

        worker_fn calls hvd.init() and an @hvd.elastic.run training function,
        as a script under elastic hvdrun does. The job ends when a worker of
        the current round returns (training finished: the others get
        elastic_timeout to return too), or fails when every worker failed,
        when reset_limit is reached, or when fewer than min_num_proc slots
        exist for elastic_timeout. Returns the values of the workers that
        returned, in their final rank order; otherwise raises RuntimeError
        with the driver's reason and the last worker traceback.

        callbacks are called on the driver with each value the current rank 0
        passes to ray_integration.report() (within 0.2 s), as in RayExecutor;
        an exception from one stops the job and propagates.
        """
        if not self._started:
            raise RuntimeError("ElasticRayExecutor.run(): call start() first")
        s = self.settings
        job = ray.put((worker_fn, tuple(args or ()), dict(kwargs or {})))
        discovery = NodeDiscovery(self.cpus_per_slot, self.gpus_per_slot)
        driver = None

        def all_failed():
            self._log("every worker failed and none is left with the committed state; stopping")
            driver.request_stop()

        launcher = RayLauncher(
            discovery, job, cpus_per_worker=self.cpus_per_slot,
            gpus_per_worker=self.gpus_per_slot, callbacks=callbacks or (),
            on_all_failed=all_failed,
        )  # fmt: skip
        self._launcher = launcher
        # As in RayExecutor: the store listens on the driver node's address,
        # which every node reaches; the fresh secret keeps other jobs out.
        store = KVStoreServer(ray.util.get_node_ip_address(), 0).start()
        try:
            with KVStoreClient(store.host, store.port, store.secret) as client:
                driver = ElasticDriver(
                    client, discovery, launcher,
                    min_np=s.min_num_proc, max_np=s.max_num_proc, reset_limit=s.reset_limit,
                    elastic_timeout=s.elastic_timeout, start_timeout=s.timeout_s,
                    worker_env=self._worker_env(store), log=self._driver_log(launcher),
                )  # fmt: skip
                self._driver = driver
                self._log(
                    f"elastic job: {s.min_num_proc}..{s.max_num_proc or 'all'} workers, "
                    f"store at {store.address}"
                )
                code = driver.run()
                reason = _stop_reason(client)
        finally:
            launcher.stop()
            store.stop()
            self._launcher = None
        results = launcher.results()
        if code == 0:
            return results
        failure = launcher.last_failure()
        if results:
            # Horovod's rule: the job ends when one worker finishes training.
            # A worker lost after that (a late ray.kill, a node gone) costs
            # nothing that was trained; say so, and return what finished.
            self._log(
                f"{len(results)} worker(s) finished training; a later failure is not the "
                f"job's: {failure.splitlines()[0] if failure else 'unknown'}"
            )
            return results
        if launcher.all_failed:
            reason = "every worker failed"
        raise RuntimeError(
            f"elastic job failed: {_ray_names(reason)}"
            + (f"\nlast worker failure: {failure}" if failure else "")
        )

    # -- internals

    def _worker_env(self, store: KVStoreServer) -> dict:
        """The store's part of horovod_env(); rank, size and hostname come from
        the driver, round by round."""
        env = {
            "HOROVOD_GLOO_RENDEZVOUS_ADDR": store.host,
            "HOROVOD_GLOO_RENDEZVOUS_PORT": str(store.port),
            "HOROVOD_SECRET_KEY": secret_to_hex(store.secret),
            "HOROVOD_CONTROLLER": "gloo",
            "HOROVOD_CPU_OPERATIONS": "gloo",
            "HOROVOD_START_TIMEOUT": f"{self.settings.timeout_s:g}",
            "PYTHONUNBUFFERED": "1",
        }
        env.update(self._env)
        return env

    def _driver_log(self, launcher: RayLauncher) -> Callable[[str], None]:
        def log(line: str) -> None:
            # all_failed() stops the driver through request_stop(), which the
            # driver reports as a signal; the line above already said why.
            if launcher.all_failed and line.startswith("received SIG"):
                return
            self._log(_ray_names(line))

        return log

    def _log(self, line: str) -> None:
        if self.settings.verbose:
            print(f"[ray_integration] {line}", file=sys.stderr, flush=True)


def _execute_on_worker(fn, executable_cls, args, kwargs):
    """execute()'s worker function: the executable is built where the worker runs."""
    return fn(executable_cls(*args, **kwargs) if executable_cls is not None else None)


def _stop_reason(client) -> str:
    """Why the driver ended the job (it posts the reason for its workers)."""
    try:
        _, reason = keys.decode_stop(client.get(keys.STOP, timeout=1.0))
    except StoreError:
        return "the elastic driver stopped"
    return reason
