"""Outputs the engine writes on the host (csrc/torch/host_output.*): large ones come from a
bounded pool of huge-page mappings, so a freed output's memory is reused by the next op of
its size, the tensors stay ordinary resizable tensors, and the memory kept after freeing is
capped by HVD_TORCH_OUTPUT_CACHE_MB."""

import sys
from pathlib import Path

import pytest
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from dist_harness import run_ranks  # noqa: E402

MIB = 1 << 20


def _rss_bytes():
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * 4096


def _rank_main():
    import hvd_torch as hvd

    torch.set_num_threads(1)
    hvd.init()
    r, n = hvd.rank(), hvd.size()
    res = {}
    x = torch.full((MIB,), float(r + 1))  # 4 MiB
    first = hvd.allreduce(x, name="pool", op=hvd.Sum)
    res["first"] = first[:4].clone()
    ptr = first.data_ptr()
    del first
    again = hvd.allreduce(x, name="pool", op=hvd.Sum)
    res["reused"] = again.data_ptr() == ptr
    res["again"] = again[:4].clone()
    gathered = hvd.allgather(torch.full((MIB // 2, 2), float(r)), name="pool.gather")
    res["gathered"] = (gathered.shape, gathered[:: MIB // 2, 0].tolist())
    # Still an ordinary tensor: it grows (keeping its values) and is small again.
    again.resize_(3 * MIB)
    res["resized"] = (again.shape, again[:4].clone())
    del again, gathered
    # 16 outputs of 16 MiB alive at once, every page written, then all freed:
    # what stays mapped is bounded by the cache (64 MiB here, set by the test).
    before = _rss_bytes()
    big = torch.ones(4 * MIB)
    outs = [hvd.allreduce(big, name=f"many.{i}", op=hvd.Sum) for i in range(16)]
    res["many_ok"] = all(torch.equal(o[-2:], torch.full((2,), float(n))) for o in outs)
    peak = _rss_bytes()
    del outs
    res["kept_mib"] = (_rss_bytes() - before) / MIB
    res["peak_mib"] = (peak - before) / MIB
    return res


@pytest.mark.parametrize("nranks", [1, 2])
def test_pooled_outputs_are_reused_resizable_and_bounded(nranks):
    env = {"HVD_TORCH_OUTPUT_CACHE_MB": "64"}
    total = float(sum(r + 1 for r in range(nranks)))
    for rank, res in enumerate(run_ranks(_rank_main, nranks, env=env, timeout=120)):
        assert torch.equal(res["first"], torch.full((4,), total))
        assert torch.equal(res["again"], torch.full((4,), total))
        assert res["reused"], "a freed 4 MiB output was not reused by the next op of its size"
        shape, firsts = res["gathered"]
        assert tuple(shape) == (nranks * MIB // 2, 2) and firsts == [float(q) for q in range(nranks)]
        shape, head = res["resized"]
        assert tuple(shape) == (3 * MIB,) and torch.equal(head, torch.full((4,), total))
        assert res["many_ok"]
        assert res["peak_mib"] >= 16 * 16 - 32, res  # the outputs were really there
        # The cache keeps 64 MiB of them (still resident: no fault on reuse), no more.
        assert 40 <= res["kept_mib"] <= 64 + 24, res
