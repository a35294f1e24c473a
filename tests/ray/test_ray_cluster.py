"""RayExecutor on a two-node Ray cluster (ray.cluster_utils.Cluster: two raylets
on this machine, each with its own node id): local and cross ranks follow the
nodes, and a DistributedOptimizer run across both nodes ends with identical
weights."""

import hashlib
import os

import pytest
import ray
import torch
from ray_harness import (  # noqa: F401
    OBJECT_STORE_BYTES, no_leaks, release_shared_ray, worker_pythonpath)

import hvd_torch as hvd
from ray_integration import RayExecutor

CPUS_PER_NODE = 2
pytestmark = [pytest.mark.usefixtures("no_leaks"), pytest.mark.timeout(180)]


@pytest.fixture(scope="module", autouse=True)
def cluster():
    from ray.cluster_utils import Cluster

    release_shared_ray()  # this module's cluster has a shape of its own

    node = {"num_cpus": CPUS_PER_NODE, "object_store_memory": OBJECT_STORE_BYTES}
    with worker_pythonpath():
        c = Cluster(initialize_head=True, head_node_args=dict(node, include_dashboard=False))
        c.add_node(**node)
        c.wait_for_nodes()
    ray.init(address=c.address)
    try:
        yield c
    finally:
        ray.shutdown()
        c.shutdown()


def _settings():
    return RayExecutor.create_settings(timeout_s=60, placement_group_timeout_s=60, verbose=0)


def _where_and_sum():
    hvd.init()
    summed = hvd.allreduce(torch.tensor([hvd.rank() + 1.0]), op=hvd.Sum, name="sum")
    return {
        "node": ray.get_runtime_context().get_node_id(),
        "rank": hvd.rank(),
        "local": (hvd.local_rank(), hvd.local_size()),
        "cross": (hvd.cross_rank(), hvd.cross_size()),
        "hostname": os.environ["HOROVOD_HOSTNAME"],
        "sum": summed.item(),
    }


def _train(steps):
    """A regression model trained on each rank's own data; returns the loss
    curve (averaged over ranks) and a hash of the final weights."""
    hvd.init()
    torch.set_num_threads(1)
    torch.manual_seed(hvd.rank())  # differs per rank: the broadcast must fix it
    model = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.Tanh(), torch.nn.Linear(8, 1))
    opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    opt = hvd.DistributedOptimizer(opt, named_parameters=model.named_parameters())
    hvd.broadcast_parameters(model.state_dict(), root_rank=0)
    gen = torch.Generator().manual_seed(10 + hvd.rank())
    x = torch.randn(128, 4, generator=gen)
    y = x @ torch.tensor([[1.0], [-2.0], [0.5], [3.0]])
    losses = []
    for step in range(steps):
        opt.zero_grad()
        loss = torch.nn.functional.mse_loss(model(x), y)
        loss.backward()
        opt.step()
        losses.append(hvd.allreduce(loss.detach(), name=f"loss.{step}").item())
    h = hashlib.sha256()
    for t in model.state_dict().values():
        h.update(t.detach().numpy().tobytes())
    return losses, h.hexdigest()


def test_two_hosts_two_workers_each(cluster):
    node_ids = {n["NodeID"] for n in ray.nodes() if n["Alive"]}
    assert len(node_ids) == 2
    executor = RayExecutor(_settings(), num_hosts=2, num_workers_per_host=2)
    executor.start()
    try:
        where = executor.run(_where_and_sum)
        trained = executor.run(_train, args=(20,))
    finally:
        executor.shutdown()

    # STRICT_SPREAD: two workers on each node, consecutive ranks per node.
    assert {w["node"] for w in where} == node_ids
    assert where[0]["node"] == where[1]["node"] != where[2]["node"] == where[3]["node"]
    assert [w["rank"] for w in where] == [0, 1, 2, 3]
    assert [w["local"] for w in where] == [(0, 2), (1, 2), (0, 2), (1, 2)]
    assert [w["cross"] for w in where] == [(0, 2), (0, 2), (1, 2), (1, 2)]
    assert [w["sum"] for w in where] == [10.0] * 4
    assert {w["hostname"] for w in where} == {ray.util.get_node_ip_address()}

    curves = [losses for losses, _ in trained]
    assert all(c == curves[0] for c in curves)  # averaged loss: the same on every rank
    assert curves[0][-1] < 0.5 * curves[0][0]
    assert len({digest for _, digest in trained}) == 1  # identical weights


def test_packed_workers_spill_to_the_second_node(cluster):
    # Three one-CPU workers on two two-CPU nodes: two share a node, one is alone.
    executor = RayExecutor(_settings(), num_workers=3)
    executor.start()
    try:
        where = executor.run(_where_and_sum)
    finally:
        executor.shutdown()
    assert where[0]["node"] == where[1]["node"] != where[2]["node"]
    assert [w["local"] for w in where] == [(0, 2), (1, 2), (0, 1)]
    # The lone rank still counts two nodes: the engine must not use loopback.
    assert [w["cross"] for w in where] == [(0, 2), (0, 2), (1, 2)]
    assert [w["sum"] for w in where] == [6.0] * 3
