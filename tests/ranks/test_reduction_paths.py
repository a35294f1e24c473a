"""Every path that promises rank-order results gives the same bits, on 3 ranks.

"Prescale each contribution, reduce them in rank order, postscale once" is how
rank 0 reduces data sent inline, how the fast lane reduces shared-memory rows,
how the shared-memory plane reduces its slots, and how the hierarchical plane
reduces within a host. The same inputs must give the same bytes on each, for
allreduce, grouped allreduce and reducescatter, every dtype, every op and
scaling. Flat Gloo reduces in ring order and promises no such thing
(docs/architecture.md, "One reduction"); it is not compared here. 2 ranks would
prove little: a sum of two is the same in either order.
"""

import hashlib
import os

import pytest

from dist_harness import run_ranks
from spin_env import PATIENT

DTYPES = ["uint8", "int8", "int16", "int32", "int64", "float16", "bfloat16", "float32",
          "float64", "bool"]
OPS = ["Sum", "Average", "Min", "Max", "Product"]
SCALINGS = [(1.0, 1.0), (0.5, 3.0), (3.0, 0.25)]
ELEMENTS = 1001  # uneven over 3 ranks; several shared-memory pieces at 1 KiB slots

SLOTS = {"HVD_TORCH_SHM_SLOT_BYTES": "1024"}
# id: (faked host per rank or None, env, the backend_name() the job must get)
PATHS = {
    "inline": (None, {"HVD_TORCH_INLINE_THRESHOLD": str(1 << 20), "HVD_TORCH_FAST_LANE": "0"},
               "shm"),
    # The lane on, and patient enough for 3 ranks on 2 cores (spin_env.py).
    "lane": (None, PATIENT, "shm"),
    "shm": (None, dict(SLOTS, HVD_TORCH_INLINE_THRESHOLD="0", HVD_TORCH_FAST_LANE="0"), "shm"),
    # Hosts a, a, b: within host a ranks 0 and 1 in order, then the leaders' sum
    # of two, which is the rank-order sum too.
    "hierarchical": (["a", "a", "b"],
                     dict(SLOTS, HVD_TORCH_INLINE_THRESHOLD="0", HVD_TORCH_FAST_LANE="0"),
                     "shm+gloo"),
}


def _inputs(dtype_name, rank):
    """Fixed per rank: fractional floats (the bits show the order), small integers
    (no product overflows), both signs where the dtype has them."""
    import torch

    g = torch.Generator().manual_seed(1000 + rank)
    dtype = getattr(torch, dtype_name)
    if dtype == torch.bool:
        return torch.randint(0, 2, (ELEMENTS,), generator=g).bool()
    if dtype.is_floating_point:
        return (torch.randn(ELEMENTS, generator=g, dtype=torch.float64) * 3.7).to(dtype)
    low = 0 if dtype == torch.uint8 else -3
    return torch.randint(low, 4, (ELEMENTS,), generator=g).to(dtype)


def _digest(tensors):
    h = hashlib.sha256()
    for t in tensors:
        h.update(t.contiguous().view(-1).view(__import__("torch").uint8).numpy().tobytes())
    return h.hexdigest()[:16]


def _reduce_everything(hosts, repeats):
    import hvd_torch as hvd
    from hvd_torch import _C

    if hosts:
        os.environ["HOROVOD_HOSTNAME"] = hosts[int(os.environ["HOROVOD_RANK"])]
    hvd.init()
    rank = hvd.rank()
    lane_before = _C.lane_ops()
    out = {}
    for dtype in DTYPES:
        x = _inputs(dtype, rank)
        for op_name in OPS:
            op = getattr(hvd, op_name)
            for pre, post in SCALINGS:
                if dtype == "bool" and (op_name == "Average" or (pre, post) != (1.0, 1.0)):
                    continue  # refused by design: bool reduces as or/and, unscaled
                key = f"{dtype}/{op_name}/{pre}/{post}"
                scale = dict(op=op, prescale_factor=pre, postscale_factor=post)
                # reducescatter takes Sum and Average, as in Horovod
                scatter = op_name in ("Sum", "Average") and dtype != "bool"
                for _ in range(repeats):  # the lane takes a name's second call
                    ar = hvd.allreduce(x, name=f"ar.{key}", **scale)
                    grouped = hvd.grouped_allreduce([x[:400], x[400:]], name=f"gar.{key}",
                                                    **scale)
                    if scatter:
                        rs = hvd.reducescatter(x, name=f"rs.{key}", **scale)
                out[f"allreduce/{key}"] = _digest([ar])
                out[f"grouped/{key}"] = _digest(grouped)
                if scatter:
                    out[f"reducescatter/{key}"] = _digest([rs])
    return {"results": out, "lane": _C.lane_ops() - lane_before, "plane": _C.backend_name()}


def test_every_rank_order_path_gives_the_same_bits():
    runs = {}
    for path, (hosts, env, plane) in PATHS.items():
        res = run_ranks(_reduce_everything, 3, args=(hosts, 2 if path == "lane" else 1),
                        env=env, timeout=300)
        assert [r["plane"] for r in res] == [plane] * 3, (path, res[0]["plane"])
        if path == "lane":  # else the lane was never compared
            assert all(r["lane"] > 0 for r in res), [r["lane"] for r in res]
        # An allreduce's result is the same on every rank.
        for kind in ("allreduce", "grouped"):
            keys = [k for k in res[0]["results"] if k.startswith(kind)]
            assert all(r["results"][k] == res[0]["results"][k] for r in res for k in keys), path
        runs[path] = [r["results"] for r in res]
    reference = runs["inline"]
    assert len(reference[0]) == 2 * (9 * 5 * 3 + 4) + 9 * 2 * 3, len(reference[0])
    for path, results in runs.items():
        for rank in range(3):
            differ = sorted(k for k in reference[rank] if results[rank][k] != reference[rank][k])
            assert not differ, f"{path} differs from inline on rank {rank}: {differ[:10]}"


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_the_inputs_make_order_visible(dtype):
    # The comparison above means something only if another order changes bits.
    import torch

    xs = [_inputs(dtype, r).to(torch.float32 if dtype == "float32" else torch.bfloat16)
          for r in range(3)]
    in_order = (xs[0] + xs[1]) + xs[2]
    other = (xs[0] + xs[2]) + xs[1]
    assert not torch.equal(in_order.view(-1), other.view(-1))
