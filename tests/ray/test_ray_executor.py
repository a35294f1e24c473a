"""RayExecutor on a real local Ray: stateless run, stateful execute, reports,
the rank environment (and a plain DDP run on it), GPU assignment (with Ray's logical
GPUs) and restarts."""

import os

import plain_ddp
import pytest
import ray
import torch
from ray_harness import no_leaks, ray_module_fixture, warm_executor  # noqa: F401  (fixtures)

import hvd_torch as hvd
import ray_integration
from ray_integration import RayExecutor

RAY_SHAPE = dict(num_cpus=4, num_gpus=4)
ray_session = ray_module_fixture(**RAY_SHAPE)
# A safety net for a hang, not a budget: on a loaded machine (make test-stress)
# a test that starts three fresh actors took over 120 s.
pytestmark = [pytest.mark.usefixtures("ray_session", "no_leaks"), pytest.mark.timeout(300)]


def _settings():
    return RayExecutor.create_settings(timeout_s=60, placement_group_timeout_s=30, verbose=0)


def _topology_and_sums(scale, offset=0):
    """Every rank contributes (rank + 1) * scale * [0, 1, 2, 3] + offset."""
    hvd.init()
    x = (hvd.rank() + 1) * scale * torch.arange(4, dtype=torch.float64) + offset
    summed = hvd.allreduce(x, op=hvd.Sum, name="sum")
    gathered = hvd.allgather(torch.tensor([hvd.rank()]), name="ranks")
    return {
        "rank": hvd.rank(),
        "size": hvd.size(),
        "local": (hvd.local_rank(), hvd.local_size()),
        "cross": (hvd.cross_rank(), hvd.cross_size()),
        "sum": summed.tolist(),
        "gathered": gathered.tolist(),
    }


@pytest.mark.parametrize("warm_executor", [2, 3], indirect=True)
def test_run_gives_every_rank_and_the_right_sums(warm_executor):
    """On warm workers (ray_harness.warm_executor): what run() computes, not
    how workers start (the tests below start their own)."""
    executor = warm_executor
    result = executor.run(_topology_and_sums, args=(2.0,), kwargs={"offset": 1})
    # Rank order; one node, so local ranks are the ranks and cross_size is 1.
    n = executor.num_workers
    total = sum(r + 1 for r in range(n))
    assert result == [
        {
            "rank": r,
            "size": n,
            "local": (r, n),
            "cross": (0, 1),
            "sum": [2.0 * total * i + n for i in range(4)],
            "gathered": list(range(n)),
        }
        for r in range(n)
    ]
    # The seed's check, and a second run on the same workers (init is a no-op).
    assert len({r["rank"] for r in executor.run(_topology_and_sums, args=(1.0,))}) == n
    refs = executor.run_remote(_topology_and_sums, args=(1.0,))
    assert [r["rank"] for r in ray.get(refs, timeout=60)] == list(range(n))


def _environment():
    keys = (
        "HOROVOD_RANK",
        "HOROVOD_SIZE",
        "HOROVOD_LOCAL_RANK",
        "HOROVOD_HOSTNAME",
        "HOROVOD_GLOO_RENDEZVOUS_ADDR",
        "HOROVOD_GLOO_RENDEZVOUS_PORT",
        "HOROVOD_SECRET_KEY",
        "HOROVOD_START_TIMEOUT",
        "MASTER_ADDR",
        "MASTER_PORT",
        "MY_SETTING",
    )
    return {k: os.environ.get(k) for k in keys}


def _report_steps(steps):
    hvd.init()
    for step in range(steps):
        total = hvd.allreduce(torch.tensor([float(step)]), op=hvd.Sum, name=f"s{step}").item()
        ray_integration.report({"rank": hvd.rank(), "step": step, "total": total})
    return hvd.rank()


@pytest.mark.parametrize("warm_executor", [2], indirect=True)
def test_callbacks_get_rank_0_reports_in_order(warm_executor):
    executor = warm_executor
    seen, also = [], []
    assert executor.run(_report_steps, args=(4,), callbacks=[seen.append, also.append]) == [0, 1]
    # Reports nobody collected are dropped at the next call, not delivered late.
    executor.run(_report_steps, args=(2,))
    later = []
    executor.run(_report_steps, args=(1,), callbacks=[later.append])
    assert seen == [{"rank": 0, "step": s, "total": 2.0 * s} for s in range(4)]
    assert also == seen
    assert later == [{"rank": 0, "step": 0, "total": 0.0}]


class MyModel:
    """The seed's stateful executable: a small model trained with DistributedOptimizer."""

    def __init__(self, lr):
        hvd.init()
        torch.set_num_threads(1)
        torch.manual_seed(hvd.rank())  # different on purpose: the broadcast must fix it
        self.model = torch.nn.Sequential(
            torch.nn.Linear(8, 16), torch.nn.Tanh(), torch.nn.Linear(16, 1)
        )
        self.initial = {k: v.clone() for k, v in self.model.state_dict().items()}
        opt = torch.optim.SGD(self.model.parameters(), lr=lr, momentum=0.9)
        self.optimizer = hvd.DistributedOptimizer(
            opt, named_parameters=self.model.named_parameters()
        )
        hvd.broadcast_parameters(self.model.state_dict(), root_rank=0)
        gen = torch.Generator().manual_seed(100 + hvd.rank())  # each rank its own data
        self.x = torch.randn(64, 8, generator=gen)
        self.y = self.x.sum(1, keepdim=True)

    def train(self):
        self.optimizer.zero_grad()
        loss = torch.nn.functional.mse_loss(self.model(self.x), self.y)
        loss.backward()
        self.optimizer.step()
        return hvd.allreduce(loss.detach(), name="loss").item()

    def get_weights(self):
        return {k: v.detach().clone() for k, v in self.model.state_dict().items()}


def test_stateful_training_leaves_identical_weights():
    num_workers = 3
    executor = RayExecutor(_settings(), num_workers=num_workers)
    executor.start(executable_cls=MyModel, executable_kwargs={"lr": 0.01})
    try:
        losses = [executor.execute(lambda w: w.train()) for _ in range(5)]
        result = executor.execute(lambda w: w.get_weights())
        rank0 = executor.execute_single(lambda w: w.get_weights())
        initial = executor.execute(lambda w: w.initial)
    finally:
        executor.shutdown()
    assert all(isinstance(res, dict) for res in result)
    assert len(result) == num_workers
    for weights in result[1:]:
        for name, tensor in weights.items():
            assert torch.equal(tensor, result[0][name]), name
    for name in rank0:
        assert torch.equal(rank0[name], result[0][name])
    # The seeds differ per rank, so identical weights came from the broadcast,
    # and training moved them.
    assert not torch.equal(initial[0]["0.weight"], initial[1]["0.weight"])
    assert not torch.equal(result[0]["0.weight"], initial[0]["0.weight"])
    # Every rank returned the same averaged loss each step, and it fell.
    assert all(len(set(step)) == 1 for step in losses)
    assert losses[-1][0] < losses[0][0]


def _seed_fn_with_gpu_view():
    """The seed's simple_fn, plus what a worker sees of its GPUs."""
    hvd.init()
    return {
        "rank": hvd.rank(),
        "ray_ids": [str(g) for g in ray.get_runtime_context().get_accelerator_ids()["GPU"]],
        "visible": os.environ.get("CUDA_VISIBLE_DEVICES"),
        "local_rank": hvd.local_rank(),
    }


def test_use_gpu_keeps_rays_gpu_ids_and_local_rank_indexes_them():
    """The seed's RayExecutor(settings, num_workers=4, use_gpu=True), on Ray's
    logical GPUs: ids are assigned and exported, no device is touched."""
    num_workers = 4
    executor = RayExecutor(_settings(), num_workers=num_workers, use_gpu=True)
    executor.start()
    try:
        assert ray.available_resources().get("GPU", 0) == 0  # each worker holds one
        views = executor.run(_seed_fn_with_gpu_view)
    finally:
        executor.shutdown()
    assert len({v["rank"] for v in views}) == num_workers
    own = [v["ray_ids"] for v in views]
    assert all(len(ids) == 1 for ids in own)
    assert sorted(ids[0] for ids in own) == ["0", "1", "2", "3"]  # one each, distinct
    for view in views:
        visible = view["visible"].split(",")
        # Every GPU of the node, Ray's own ids in local-rank order, so that
        # torch.cuda.set_device(hvd.local_rank()) picks the worker's own.
        assert visible == [ids[0] for ids in own]
        assert visible[view["local_rank"]] == view["ray_ids"][0]


@pytest.mark.parametrize("num_workers,gpus_per_worker", [(3, 0.5), (2, 2)])
def test_use_gpu_with_shared_or_several_gpus_puts_its_own_at_local_rank(num_workers,
                                                                        gpus_per_worker):
    """With more or fewer GPUs than workers, index local_rank % count of each
    worker's CUDA_VISIBLE_DEVICES (the GPU hvd_torch uses) is the one Ray gave it."""
    executor = RayExecutor(_settings(), num_workers=num_workers, use_gpu=True,
                           gpus_per_worker=gpus_per_worker)
    executor.start()
    try:
        views = executor.run(_seed_fn_with_gpu_view)
    finally:
        executor.shutdown()
    every_gpu = sorted({g for v in views for g in v["ray_ids"]})
    for view in views:
        own = view["ray_ids"]
        assert len(own) == max(1, gpus_per_worker)
        visible = view["visible"].split(",")
        assert sorted(visible) == every_gpu  # each of the node's GPUs, once
        at = view["local_rank"] % len(visible)
        assert (visible + visible)[at:at + len(own)] == own


def test_rank_environment_then_shutdown_and_start_again():
    executor = RayExecutor(_settings(), num_workers=2)
    executor.start(extra_env_vars={"MY_SETTING": 42})
    try:
        # First, before anything of this module (which imports hvd_torch) reaches the
        # workers: a DDP run that knows nothing of hvd, on torch's variables alone.
        ddp = executor.run(plain_ddp.train)
        envs = executor.run(_environment)
        with pytest.raises(RuntimeError, match="already started"):
            executor.start()
    finally:
        executor.shutdown()
        executor.shutdown()  # a second shutdown is a no-op
    node_ip = ray.util.get_node_ip_address()
    assert [e["HOROVOD_RANK"] for e in envs] == ["0", "1"]
    assert [e["HOROVOD_LOCAL_RANK"] for e in envs] == ["0", "1"]
    for env in envs:
        assert env["HOROVOD_SIZE"] == "2"
        assert env["HOROVOD_HOSTNAME"] == node_ip  # Gloo binds the address Ray knows
        assert env["HOROVOD_GLOO_RENDEZVOUS_ADDR"] == node_ip  # the driver's store
        assert env["HOROVOD_START_TIMEOUT"] == "60"  # settings.timeout_s
        assert env["MY_SETTING"] == "42"
        assert len(env["HOROVOD_SECRET_KEY"]) == 64  # 32 random bytes, hex
    assert envs[0]["HOROVOD_SECRET_KEY"] == envs[1]["HOROVOD_SECRET_KEY"]
    # torch.distributed's rendezvous: rank 0's node, on a port rank 0's actor found free.
    assert envs[0]["MASTER_ADDR"] == envs[1]["MASTER_ADDR"] == node_ip
    master_port = envs[0]["MASTER_PORT"]
    assert master_port == envs[1]["MASTER_PORT"] != envs[0]["HOROVOD_GLOO_RENDEZVOUS_PORT"]
    assert [r["rank"] for r in ddp] == [0, 1] and [r["sum"] for r in ddp] == [3.0, 3.0], ddp
    assert len({d for r in ddp for d in r["digests"]}) == 1 and not ddp[0]["hvd_imported"], ddp

    with pytest.raises(RuntimeError, match="not started"):
        executor.run(_environment)
    executor.start()
    try:
        sums = executor.run(_topology_and_sums, args=(1.0,))
        again = executor.run(_environment)
    finally:
        executor.shutdown()
    assert [r["sum"] for r in sums] == [[0.0, 3.0, 6.0, 9.0]] * 2
    # A new job: a new store and secret, and no extra variables this time.
    assert again[0]["HOROVOD_SECRET_KEY"] != envs[0]["HOROVOD_SECRET_KEY"]
    assert again[0]["MY_SETTING"] is None
