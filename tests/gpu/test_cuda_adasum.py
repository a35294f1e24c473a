"""op=hvd.Adasum with CUDA tensors: allreduce, grouped, and DistributedOptimizer.

On one GPU, 1 rank has nothing to combine and 2 or 3 ranks share the GPU
through the host-staged plane; Adasum's alltoall, allreduce and allgather run on
the device tensors either way. Without a GPU the same rank code runs on the CPU
path (tests/harness/gpu_device.py). Values
are checked against test_adasum's reference tree, worked out on the CPU.
"""

import pytest
import torch

from dist_harness import run_ranks
from gpu_device import DEVICE, needs_device
from test_adasum import _reference, _simulated_weights, _train_main, _vector

pytestmark = needs_device
TIMEOUT = 300
RANKS = [1, 2, 3]


def _rank(device):
    import hvd_torch as hvd

    hvd.init()
    if device == "cuda":
        torch.cuda.set_device(hvd.local_rank() % torch.cuda.device_count())
    r = hvd.rank()
    out = {"v": hvd.allreduce(_vector(r).to(device), name="v", op=hvd.Adasum),
           "half": hvd.allreduce(_vector(r, 33).half().to(device), name="h", op=hvd.Adasum),
           "grouped": hvd.grouped_allreduce([_vector(r, 9).float().to(device),
                                             _vector(r, 5, seed=1).to(device)],
                                            name="g", op=hvd.Adasum)}
    x = _vector(r, 7).to(device).requires_grad_()
    (hvd.allreduce(x, name="grad", op=hvd.Adasum) @ _vector(r, 7, seed=2).to(device)).backward()
    out["grad"] = x.grad
    hvd.shutdown()
    devices = {k: (v[0] if isinstance(v, list) else v).device.type for k, v in out.items()}
    host = {k: [t.cpu() for t in v] if isinstance(v, list) else v.cpu() for k, v in out.items()}
    return host, devices


@pytest.mark.parametrize("nranks", RANKS)
def test_adasum_on_the_gpu_matches_the_reference(nranks):
    for res, devices in run_ranks(_rank, nranks, args=(DEVICE,), timeout=TIMEOUT):
        assert set(devices.values()) == {DEVICE}, devices

        def want(length, seed=0, dtype=torch.float64):
            return _reference([_vector(q, length, seed=seed).to(dtype) for q in range(nranks)])

        torch.testing.assert_close(res["v"], want(1001))
        assert res["half"].dtype == torch.float16
        torch.testing.assert_close(res["half"].double(), want(33, dtype=torch.float16),
                                   rtol=2e-3, atol=2e-3)
        torch.testing.assert_close(res["grouped"][0].double(), want(9, dtype=torch.float32),
                                   rtol=1e-5, atol=1e-6)
        torch.testing.assert_close(res["grouped"][1], want(5, seed=1))
        torch.testing.assert_close(res["grad"], want(7, seed=2))


@pytest.mark.parametrize("nranks", RANKS)
def test_adasum_optimizer_trains_a_cuda_model(nranks):
    results = run_ranks(_train_main, nranks, args=(DEVICE,), timeout=TIMEOUT)
    expected = _simulated_weights(nranks)
    for res in results:
        assert res["devices"] == {DEVICE}, res["devices"]
        for got, want in zip(res["weights"], expected):
            # The GPU's float32 arithmetic differs from the CPU's in the last bits.
            torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-5)
        for got, first in zip(res["weights"], results[0]["weights"]):
            assert torch.equal(got, first)
