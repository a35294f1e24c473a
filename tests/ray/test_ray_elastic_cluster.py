"""Elastic mode on a Ray cluster whose nodes come and go
(ray.cluster_utils.Cluster: raylets on this machine, each its own node): a
node that joins gets workers at the next discovery, and a node that leaves
takes its workers with it while the others go on. The final weights equal
tests/harness/elastic_job.py's reference for the sizes the job went through."""

from __future__ import annotations

import time

import pytest
import ray
from ray_harness import (  # noqa: F401
    OBJECT_STORE_BYTES, no_leaks, release_shared_ray, worker_pythonpath)
from test_ray_elastic import _ATOL, _ENV, _Background, _events, _identical, _train_job, _wait_for

from ray_integration import RayExecutor

NODE = {"num_cpus": 2, "object_store_memory": OBJECT_STORE_BYTES}
# A safety net for a hang, not a budget: on a loaded machine (make test-stress)
# test_ray_elastic's killed-worker test took over 180 s (45 s for one reset).
pytestmark = [pytest.mark.usefixtures("no_leaks"), pytest.mark.timeout(480)]


@pytest.fixture(scope="module")
def cluster():
    from ray.cluster_utils import Cluster

    release_shared_ray()  # this module's cluster has a shape of its own

    with worker_pythonpath():
        c = Cluster(initialize_head=True, head_node_args=dict(NODE, include_dashboard=False))
    ray.init(address=c.address)
    try:
        yield c
    finally:
        ray.shutdown()
        c.shutdown()


def _steps_with(events_dir, size, count):
    return lambda: sum(f["size"] == str(size) for f in _events(events_dir, "step")) >= count


EPOCHS = 20  # enough that training outlasts a node starting (seconds)


def test_node_joins_then_leaves(cluster, tmp_path, monkeypatch):
    import elastic_job

    monkeypatch.setattr(elastic_job, "EPOCHS", EPOCHS)  # the reference's, read at import

    # The workers' deadline to start and join a round, as test_ray_elastic's.
    settings = RayExecutor.create_settings(timeout_s=90, verbose=1)
    executor = RayExecutor(settings, min_workers=2, max_workers=4, elastic_timeout=30)
    fast = tmp_path / "fast"  # once it exists, the steps stop sleeping
    executor.start(extra_env_vars={**_ENV, "ELASTIC_JOB_STEP_SLEEP": "0.1",
                                   "ELASTIC_JOB_EPOCHS": str(EPOCHS),
                                   "ELASTIC_JOB_FAST_FILE": str(fast)})
    try:
        job = _Background(executor, _train_job, args=[str(tmp_path)])
        _wait_for(_steps_with(tmp_path, 2, 3), "steps with 2 workers", job=job)
        with worker_pythonpath():
            node = cluster.add_node(**NODE)
        _wait_for(_steps_with(tmp_path, 4, 3), "steps with 4 workers", job=job)
        removed_at = time.time()
        cluster.remove_node(node)
        # Both survivors restarted with 2: the rest of training need not wait.
        _wait_for(lambda: len(_events(tmp_path, "start", after=removed_at)) >= 2,
                  "restarts with 2 workers", job=job)
        fast.touch()
        results = job.join(timeout=120)
    finally:
        executor.shutdown()

    grown = [f for f in _events(tmp_path, "start") if f["size"] == "4"]
    shrunk = _events(tmp_path, "start", after=removed_at)
    assert len(grown) == 4 and len(shrunk) == 2, _events(tmp_path, "start")
    assert {f["size"] for f in shrunk} == {"2"}
    (at_growth,) = {int(f["commits"]) for f in grown}
    (at_loss,) = {int(f["commits"]) for f in shrunk}
    assert executor.resets == 2
    weights = _identical(results, 2)
    expected = elastic_job.reference([(2, at_growth), (4, at_loss), (2, None)])
    assert weights == pytest.approx(expected, abs=_ATOL, rel=0)
