"""A local Ray for the Ray driver's tests: small, and one for every module of a shape.

    from ray_harness import ray_module_fixture, no_leaks

    RAY_SHAPE = dict(num_cpus=4, num_gpus=4)          # conftest groups modules by it
    ray_session = ray_module_fixture(**RAY_SHAPE)
    pytestmark = pytest.mark.usefixtures("ray_session", "no_leaks")

A started Ray outlives its module: the next module of the same shape uses it
(tests/conftest.py runs such modules one after another), a module of another
shape replaces it, and the session's end shuts it down.  A test about the
cluster itself (several nodes, a killed raylet) first calls release_shared_ray().

Warm workers: a test about what a function computes on started workers, not
about starting, placing or losing them, takes a started RayExecutor from the
warm_executor fixture instead of starting its own (each worker actor imports
torch and hvd_torch: seconds of CPU):

    @pytest.mark.parametrize("warm_executor", [2, 3], indirect=True)   # num_workers
    def test_sums(warm_executor):
        results = warm_executor.run(fn)

One warm executor lives at a time, through the consecutive tests that ask for
its number of workers (conftest.py runs a shape's warm tests first, by size).
The first test that asks for another size, or for none, shuts it down, so such
a test finds the whole cluster free, as before.  A warm worker has already run
other tests' functions: hvd.init() there is a no-op (same job, same store), and
a function must leave no state behind that the next one could see.  A test that
fails or kills a warm worker leaves a stopped executor; the next test starts a
new one.

Ray's worker processes inherit PYTHONPATH from the processes ray.init()
starts, so the repository root (ray_integration) and tests/ (functions defined
in test modules travel by reference) are put there for the duration of the
init. no_leaks checks after every test that every CPU is free again, apart
from the warm executor's own workers: a test that left an actor or a placement
group behind fails.
"""

from __future__ import annotations

import contextlib
import os
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
TESTS = ROOT / "tests"
# Where Ray workers find test modules and harness code by name: every tier's folder.
TEST_PATHS = [str(p) for p in sorted(TESTS.iterdir())
              if p.is_dir() and p.name not in ("cpp", "__pycache__")]
# Enough for the object store's minimum; the tests move kilobytes.
OBJECT_STORE_BYTES = 100 * 1024 * 1024
# Killing actors and removing placement groups is asynchronous in Ray.
_RELEASE_TIMEOUT_S = 15.0


@contextlib.contextmanager
def worker_pythonpath():
    """PYTHONPATH with the repository root and the test folders while Ray starts its processes."""
    old = os.environ.get("PYTHONPATH")
    os.environ["PYTHONPATH"] = os.pathsep.join([str(ROOT), *TEST_PATHS] + ([old] if old else []))
    try:
        yield
    finally:
        if old is None:
            del os.environ["PYTHONPATH"]
        else:
            os.environ["PYTHONPATH"] = old


def start_local_ray(num_cpus: int, num_gpus: int = 0) -> None:
    import ray

    with worker_pythonpath():
        ray.init(
            # "local": a fresh instance, never a cluster some other process left
            # running (ray.init() would join the newest one in /tmp/ray).
            address="local",
            num_cpus=num_cpus,
            num_gpus=num_gpus,  # logical GPUs: Ray assigns ids, no device is touched
            include_dashboard=False,
            object_store_memory=OBJECT_STORE_BYTES,
            log_to_driver=True,
        )


# The shape (num_cpus, num_gpus) of the Ray this process started and still runs.
_shared_shape = None


def ray_module_fixture(num_cpus: int, num_gpus: int = 0):
    """A module-scoped fixture: a local Ray of this shape, shared with the other
    modules of the same shape."""

    @pytest.fixture(scope="module")
    def ray_session():
        global _shared_shape
        import ray

        if _shared_shape != (num_cpus, num_gpus) or not ray.is_initialized():
            release_shared_ray()
            start_local_ray(num_cpus, num_gpus)
            _shared_shape = (num_cpus, num_gpus)
        yield ray

    return ray_session


def release_shared_ray() -> None:
    """Shuts down the shared local Ray (and its warm executor), if one runs."""
    global _shared_shape
    import ray

    release_warm_executor()
    if ray.is_initialized():
        ray.shutdown()
    _shared_shape = None


# ---------------------------------------------------------------- warm executors

# The one warm executor: (num_workers, a started RayExecutor), or None.
_warm = None
# Executors started for the warm fixture and tests served, for the docs' figures.
warm_stats = {"started": 0, "served": 0}
# Generous: the workers of a loaded 2-core machine import torch for seconds.
_WARM_TIMEOUT_S = 90


def _warm_held() -> dict:
    """The CPUs and GPUs the warm executor's workers hold now: its placement
    group's bundles (nothing once the executor was stopped by a failure)."""
    if _warm is None or not _warm[1].workers:
        return {}
    num_workers, _ = _warm
    return {"CPU": float(num_workers)}  # one CPU per worker, as _start_warm asks


def _start_warm(num_workers: int):
    from ray_integration import RayExecutor

    settings = RayExecutor.create_settings(
        timeout_s=_WARM_TIMEOUT_S, placement_group_timeout_s=30, verbose=0)
    executor = RayExecutor(settings, num_workers=num_workers, cpus_per_worker=1)
    executor.start()
    warm_stats["started"] += 1
    return executor


def release_warm_executor() -> None:
    """Shuts the warm executor down, if there is one."""
    global _warm
    warm, _warm = _warm, None
    if warm is not None:
        warm[1].shutdown()


@pytest.fixture
def warm_executor(request):
    """A started RayExecutor of request.param workers (parametrize indirectly),
    shared with the neighbouring tests that ask for as many."""
    global _warm
    num_workers = request.param
    if _warm is None or _warm[0] != num_workers or not _warm[1].workers:
        release_warm_executor()
        _warm = (num_workers, _start_warm(num_workers))
    warm_stats["served"] += 1
    return _warm[1]


@pytest.fixture
def no_leaks(request):
    """After the test: every CPU and GPU of the cluster is free again, except
    what the warm executor holds.  A test that does not use the warm executor
    first gets the cluster without it."""
    if "warm_executor" not in request.fixturenames:
        release_warm_executor()
    yield
    wait_all_free()


def wait_all_free(timeout_s: float = _RELEASE_TIMEOUT_S) -> None:
    """Waits until every CPU and GPU is free, apart from the warm executor's."""
    import ray

    deadline = time.monotonic() + timeout_s
    while True:
        total, free = ray.cluster_resources(), ray.available_resources()
        held = _warm_held()
        busy = {k: total[k] - free.get(k, 0) - held.get(k, 0)
                for k in ("CPU", "GPU") if k in total}
        if not any(busy.values()):
            return
        if time.monotonic() > deadline:
            raise AssertionError(f"resources still held {timeout_s:g}s after the test: {busy} "
                                 f"(the warm executor's own {held or 'none'} not counted)")
        time.sleep(0.1)


def run_example(script: str, *args: str, timeout: float = 240) -> str:
    """`python examples/<script> args...` with the repository on PYTHONPATH;
    returns its output, or fails the test with it (non-zero exit or timeout,
    after which the script is killed)."""
    import subprocess
    import sys

    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(ROOT), *TEST_PATHS]))
    proc = subprocess.Popen(
        [sys.executable, str(ROOT / "examples" / script), *args],
        cwd=ROOT,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    try:
        out, _ = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        out, _ = proc.communicate()
        raise AssertionError(f"{script} {' '.join(args)}: no exit within {timeout:g}s\n{out}")
    assert proc.returncode == 0, f"{script} exited with {proc.returncode}\n{out}"
    return out


def ray_address() -> str:
    """The running local Ray's address, for a script to join with --address."""
    import ray

    return ray.get_runtime_context().gcs_address
