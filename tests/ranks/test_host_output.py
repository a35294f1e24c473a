"""Outputs the engine writes on the host (csrc/torch/host_output.*): large ones come from a
bounded pool of huge-page mappings, so a freed output's memory is reused by the next op of
its size, the tensors stay ordinary resizable tensors, and the memory kept after freeing is
capped by HVD_TORCH_OUTPUT_CACHE_MB; blocks below 1 MiB are powers of two, so an output
of 300 KiB reuses a freed one of 400 KiB. Small ones (up to 4 KiB) come from per-size
free lists: reused, 64-byte aligned, resizable both ways, correct in every dtype."""

import sys
from pathlib import Path

import pytest
import torch

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
    res["small"] = _small_outputs(hvd, n)
    mid = hvd.allreduce(torch.ones(100 * 1024), name="mid.400K", op=hvd.Sum)
    ptr = mid.data_ptr()
    del mid
    mid = hvd.allreduce(torch.ones(75 * 1024), name="mid.300K", op=hvd.Sum)
    res["mid"] = (mid.data_ptr() == ptr, mid.shape[0], bool(torch.all(mid == n)))
    del mid
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


def _small_outputs(hvd, n):
    """Small outputs: what _rank_main's checks of them found wrong (empty: nothing)."""
    wrong = []
    one = torch.ones(1)
    out = hvd.allreduce(one, name="small", op=hvd.Sum)
    ptr = out.data_ptr()
    del out
    again = hvd.allreduce(one, name="small", op=hvd.Sum)
    if again.data_ptr() != ptr:
        wrong.append("a freed 4-byte output was not reused")
    if again.item() != n:
        wrong.append(("value", again.item()))
    # Every size class boundary, several dtypes; all outputs alive at once.
    outs = {}
    for numel in (1, 15, 16, 17, 1023, 1024, 1025):
        for dtype in (torch.uint8, torch.float32, torch.float64):
            out = hvd.allreduce(torch.ones(numel, dtype=dtype), name=f"s.{numel}.{dtype}",
                                op=hvd.Sum)
            outs[(numel, dtype)] = out
            if out.data_ptr() % 64:
                wrong.append(("unaligned", numel, dtype))
    for (numel, dtype), out in outs.items():
        if not torch.equal(out, torch.full((numel,), n, dtype=dtype)):
            wrong.append(("values", numel, dtype))
    # Resized past the small sizes and back, keeping its values.
    again.resize_(100_000)
    again[1:] = 7
    again.resize_(2)
    if again.tolist() != [float(n), 7.0]:
        wrong.append(("resized", again.tolist()))
    return wrong


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
        assert res["small"] == [], res["small"]
        assert res["mid"] == (True, 75 * 1024, True), res["mid"]
        assert res["many_ok"]
        assert res["peak_mib"] >= 16 * 16 - 32, res  # the outputs were really there
        # The cache keeps 64 MiB of them (still resident: no fault on reuse), no more.
        assert 40 <= res["kept_mib"] <= 64 + 24, res


def _outputs_without_a_cache():
    import hvd_torch as hvd

    hvd.init()
    n = hvd.size()
    out = {}
    for numel in (10, 75 * 1024, 512 * 1024):  # small, pooled-size, huge-page-size
        x = hvd.allreduce(torch.full((numel,), 2.0), name=f"nocache.{numel}", op=hvd.Sum)
        out[numel] = bool(torch.all(x == 2.0 * n))
        del x
    return out


def test_outputs_are_right_with_the_cache_off():
    env = {"HVD_TORCH_OUTPUT_CACHE_MB": "0"}
    for res in run_ranks(_outputs_without_a_cache, 2, env=env, timeout=60):
        assert res == {10: True, 75 * 1024: True, 512 * 1024: True}, res
