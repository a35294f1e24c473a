"""RayExecutor(use_gpu=True) on a real GPU (issue #10, item 4): each worker gets
its GPU from Ray, hvd.local_rank() indexes the visible devices as in Horovod's
examples, and collectives run on CUDA tensors (NCCL for one worker; two
workers sharing the GPU with gpus_per_worker=0.5 take the host-staged plane).

Skipped without a GPU or without Ray. tests/ray/test_ray_executor.py tests the same
placement with Ray's logical GPUs on every machine.
"""

import pytest
import torch

if not torch.cuda.is_available():
    pytest.skip("needs a CUDA GPU", allow_module_level=True)
ray = pytest.importorskip("ray")

from ray_harness import no_leaks, ray_module_fixture  # noqa: E402, F401  (fixtures)

import hvd_torch as hvd  # noqa: E402
from ray_integration import RayExecutor  # noqa: E402

RAY_SHAPE = dict(num_cpus=4, num_gpus=1)
ray_session = ray_module_fixture(**RAY_SHAPE)
pytestmark = [pytest.mark.usefixtures("ray_session", "no_leaks"), pytest.mark.timeout(240)]


def _settings():
    return RayExecutor.create_settings(timeout_s=60, placement_group_timeout_s=60, verbose=0)


def _train_on_my_gpu():
    """What a Horovod script does on a Ray worker: pick the GPU, reduce, train a step."""
    import os

    from hvd_torch import gpu

    hvd.init()
    torch.cuda.set_device(hvd.local_rank() % torch.cuda.device_count())
    x = torch.full((4,), float(hvd.rank() + 1), device="cuda")
    summed = hvd.allreduce(x, op=hvd.Sum, name="sum")
    torch.manual_seed(hvd.rank())  # apart until the broadcast
    model = torch.nn.Linear(3, 1).cuda()
    hvd.broadcast_parameters(model.state_dict(), root_rank=0)
    opt = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1),
                                   named_parameters=model.named_parameters())
    model(torch.full((2, 3), float(hvd.rank() + 1), device="cuda")).sum().backward()
    opt.step()
    return {
        "ray_ids": [str(g) for g in ray.get_runtime_context().get_accelerator_ids()["GPU"]],
        "visible": os.environ.get("CUDA_VISIBLE_DEVICES"),
        "local_rank": hvd.local_rank(),
        "plane": gpu.plane(),
        "sum": (summed.device.type, summed.cpu().tolist()),
        "weight": model.weight.detach().cpu(),
    }


@pytest.mark.parametrize("num_workers,gpus_per_worker,plane", [(1, None, "nccl"),
                                                                (2, 0.5, "gloo")])
def test_each_worker_trains_on_the_gpu_ray_gave_it(num_workers, gpus_per_worker, plane):
    executor = RayExecutor(_settings(), num_workers=num_workers, use_gpu=True,
                           gpus_per_worker=gpus_per_worker)
    executor.start()
    try:
        views = executor.run(_train_on_my_gpu)
    finally:
        executor.shutdown()
    total = float(sum(range(1, num_workers + 1)))
    for view in views:
        assert view["ray_ids"] == ["0"], view  # the one GPU, whole or shared
        assert view["visible"] == "0", view
        assert view["plane"] == plane, view
        assert view["sum"] == ("cuda", [total] * 4), view
        # One averaged step from rank 0's weights: the same on every worker.
        assert torch.equal(view["weight"], views[0]["weight"]), view
    assert sorted(v["local_rank"] for v in views) == list(range(num_workers))
