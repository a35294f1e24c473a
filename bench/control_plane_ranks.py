"""Cached small allreduces on N real ranks: the control plane's cost per op as N
grows on one host (issue #32 item 3's second half; docs/control_plane_scale.md).

    hvdrun -np 8 python bench/control_plane_ranks.py [--iters 300] [--reps 5]

Every rank allreduces the same names every iteration, so after the first one each
op is a cache hit: 4 B goes inline through rank 0, 64 KiB through the data plane
after a cached negotiation. Checks every result; rank 0 prints one JSON line with
µs per op (min / median / max over --reps timed sets). With more ranks than cores
the figures say how the cost grows with N, not what a dedicated machine would take.
"""

import argparse
import json
import statistics
import time

import torch

import hvd_torch as hvd
from hvd_torch import _C


def measure(tensor, name, iters, reps, size):
    times = []
    for rep in range(reps + 1):  # the first set warms up (and fills the cache)
        start = time.perf_counter()
        for _ in range(iters):
            tensor.fill_(1.0)
            hvd.allreduce_(tensor, name=name, op=hvd.Sum)
        elapsed = time.perf_counter() - start
        if not bool((tensor == size).all()):
            raise RuntimeError(f"rank {hvd.rank()}: {name} gave {tensor[:4].tolist()}, not {size}")
        if rep:
            times.append(elapsed * 1e6 / iters)
    return {"min": min(times), "median": statistics.median(times), "max": max(times)}


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--iters", type=int, default=300)
    parser.add_argument("--reps", type=int, default=5)
    args = parser.parse_args()
    hvd.init()
    out = {"ranks": hvd.size(), "control_plane": _C.control_plane()}
    for nbytes in (4, 64 << 10):
        tensor = torch.zeros(nbytes // 4)
        out[f"{nbytes}B_us_per_op"] = measure(tensor, f"scale.{nbytes}", args.iters, args.reps,
                                              hvd.size())
    if hvd.rank() == 0:
        print(json.dumps(out), flush=True)
    hvd.shutdown()


if __name__ == "__main__":
    main()
