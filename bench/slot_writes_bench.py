"""The shared-memory plane's ways of writing its segment side by side, window by
window: HVD_TORCH_SHM_STREAM=0 (plain stores), auto, and 1 (streaming stores)
(csrc/core/slot_writes.h; docs/architecture.md, "Where the cores sit").

    hvdrun -np 2 python bench/slot_writes_bench.py [--ops allreduce_,broadcast_]
        [--sizes 1M,4M,16M] [--windows 8] [--json out.json]

Each window runs every way once, back to back, for about --window-s seconds each
(the engine restarted between ways, with the variable set), so that the phases
of a virtual machine's placement, which last seconds, land on all three alike.
Over distinct buffers (about 64 MiB a size), as `make bench` does; every result
is checked. Rank 0 prints µs per op for each window and way, and the median
over windows of each way's time against plain stores' in the same window.
"""

import argparse
import json
import os
import statistics
import sys
import time

import torch

import hvd_torch as hvd

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path[1:1] = [p for p in (HERE,) if p not in sys.path]
from sizes import parse_size  # noqa: E402

WAYS = ("0", "auto", "1")


def op_runner(op, bufs, size):
    """One call of `op` on buffer j, and the value every element must then hold."""
    if op == "allreduce_":
        # Every rank holds 1.0: after a Sum each holds size; refilled before each call.
        def run(j):
            bufs[j].fill_(1.0)
            hvd.allreduce_(bufs[j], name="slot_writes.ar", op=hvd.Sum)
        return run, float(size)
    if op == "broadcast_":
        def run(j):
            bufs[j].fill_(float(hvd.rank()))
            hvd.broadcast_(bufs[j], root_rank=size - 1, name="slot_writes.bc")
        return run, float(size - 1)
    raise SystemExit(f"slot_writes_bench: unknown op {op!r} (allreduce_, broadcast_)")


def window(op, nbytes, seconds):
    """µs per op of `op` on nbytes for about `seconds`, with the current environment."""
    hvd.init()
    size = hvd.size()
    count = nbytes // 4
    bufs = [torch.empty(count) for _ in range(max(2, (64 << 20) // nbytes))]
    run, expect = op_runner(op, bufs, size)
    for j in range(2):
        run(j)
    # A fixed number of ops on every rank: estimated by rank 0, shared.
    start = time.perf_counter()
    run(0)
    guess = torch.tensor([max(3, int(seconds / max(time.perf_counter() - start, 1e-6)))])
    iters = int(hvd.broadcast(guess, root_rank=0, name="slot_writes.iters").item())
    hvd.barrier()
    start = time.perf_counter()
    for i in range(iters):
        run(i % len(bufs))
    took = time.perf_counter() - start
    for j in range(min(iters, len(bufs))):
        if not bool((bufs[j] == expect).all()):
            raise RuntimeError(f"rank {hvd.rank()}: {op} {nbytes} B gave {bufs[j][:3].tolist()}")
    slowest = hvd.allreduce(torch.tensor([took / iters]), name="slot_writes.t", op=hvd.Max)
    hvd.shutdown()
    return float(slowest.item()) * 1e6


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--ops", default="allreduce_,broadcast_")
    p.add_argument("--sizes", default="1M,4M,16M")
    p.add_argument("--windows", type=int, default=8)
    p.add_argument("--window-s", type=float, default=0.25)
    p.add_argument("--json", default="")
    args = p.parse_args()
    torch.set_num_threads(1)
    rank = int(os.environ.get("HOROVOD_RANK", "0"))
    log = print if rank == 0 else (lambda *a, **k: None)
    log(f"# {' '.join(WAYS)}: HVD_TORCH_SHM_STREAM per way; us per op per window")
    results = []
    for op in args.ops.split(","):
        for text in args.sizes.split(","):
            nbytes = parse_size(text)
            times = {w: [] for w in WAYS}
            for _ in range(args.windows):
                for way in WAYS:
                    os.environ["HVD_TORCH_SHM_STREAM"] = way
                    times[way].append(window(op, nbytes, args.window_s))
            vs_plain = {w: statistics.median(a / b for a, b in zip(times["0"], times[w]))
                        for w in WAYS[1:]}
            results.append({"op": op, "bytes": nbytes, "us": times,
                            "plain_time_over": vs_plain})
            log(f"{op} {text}")
            for way in WAYS:
                log(f"  {way:>4}: " + " ".join(f"{t:7.0f}" for t in times[way]))
            log("  plain time / way's time, median over windows: "
                + ", ".join(f"{w}: {r:.2f}" for w, r in vs_plain.items()))
    os.environ.pop("HVD_TORCH_SHM_STREAM", None)
    if rank == 0 and args.json:
        with open(args.json, "w") as f:
            json.dump({"benchmark": "slot_writes", "windows": args.windows, "results": results},
                      f, indent=1)


if __name__ == "__main__":
    main()
