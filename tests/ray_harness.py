"""A local Ray for the Ray driver's tests: small, quick to start, one per module.

    from ray_harness import ray_module_fixture, no_leaks

    ray_session = ray_module_fixture(num_cpus=6)      # module scope
    pytestmark = pytest.mark.usefixtures("ray_session", "no_leaks")

Ray's worker processes inherit PYTHONPATH from the processes ray.init()
starts, so the repository root (ray_integration) and tests/ (functions defined
in test modules travel by reference) are put there for the duration of the
init. no_leaks checks after every test that every CPU is free again: a test
that left an actor or a placement group behind fails.
"""

from __future__ import annotations

import contextlib
import os
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
TESTS = ROOT / "tests"
# Enough for the object store's minimum; the tests move kilobytes.
OBJECT_STORE_BYTES = 100 * 1024 * 1024
# Killing actors and removing placement groups is asynchronous in Ray.
_RELEASE_TIMEOUT_S = 15.0


@contextlib.contextmanager
def worker_pythonpath():
    """PYTHONPATH with the repository root and tests/ while Ray starts its processes."""
    old = os.environ.get("PYTHONPATH")
    os.environ["PYTHONPATH"] = os.pathsep.join([str(ROOT), str(TESTS)] + ([old] if old else []))
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


def ray_module_fixture(num_cpus: int, num_gpus: int = 0):
    """A module-scoped fixture that starts a local Ray and shuts it down after."""

    @pytest.fixture(scope="module")
    def ray_session():
        import ray

        start_local_ray(num_cpus, num_gpus)
        try:
            yield ray
        finally:
            ray.shutdown()

    return ray_session


@pytest.fixture
def no_leaks():
    """After the test: every CPU and GPU of the cluster is free again."""
    yield
    wait_all_free()


def wait_all_free(timeout_s: float = _RELEASE_TIMEOUT_S) -> None:
    import ray

    deadline = time.monotonic() + timeout_s
    while True:
        total, free = ray.cluster_resources(), ray.available_resources()
        busy = {k: total[k] - free.get(k, 0) for k in ("CPU", "GPU") if k in total}
        if not any(busy.values()):
            return
        if time.monotonic() > deadline:
            raise AssertionError(f"resources still held {timeout_s:g}s after the test: {busy}")
        time.sleep(0.1)


def run_example(script: str, *args: str, timeout: float = 240) -> str:
    """`python examples/<script> args...` with the repository on PYTHONPATH;
    returns its output, or fails the test with it (non-zero exit or timeout,
    after which the script is killed)."""
    import subprocess
    import sys

    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(ROOT), str(TESTS)]))
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
