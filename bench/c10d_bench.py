"""torch.distributed collectives over the "hvd" backend against torch's own gloo, in one run.

    python bench/c10d_bench.py -np 2                        (starts itself under hvdrun)
    python bench/c10d_bench.py -np 3 -b 1K -e 64M -f 4 --reps 5 --json c10d.json
    hvdrun -np 2 python bench/c10d_bench.py --worker        (the worker directly)

Both process groups live in the same rank processes: the default group on "hvd"
(hvd-torch's engine: shared memory on one host) and dist.new_group(backend="gloo")
over every rank. For each op and size the two are timed in alternating sets, so a
noisy neighbour slows both alike; each set runs `iters` calls of
dist.<op>(..., group=g) on pre-filled tensors and the result of the last is checked.
A set's time is the slowest rank's (a max-allreduce of the per-rank times over gloo);
the reported time is the median over --reps sets, with the spread of the ratio.

  algbw = bytes / time;  busbw = algbw x 2(n-1)/n (all_reduce), (n-1)/n
  (all_gather_into_tensor, reduce_scatter_tensor, all_to_all_single), 1 (broadcast)
  bytes: the tensor passed (all_reduce, broadcast), the gathered output
  (all_gather_into_tensor), the input (reduce_scatter_tensor, all_to_all_single).
  gloo/hvd = gloo's time / hvd's time: above 1 means hvd is faster.
"""

import argparse
import json
import os
import statistics
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
sys.path[1:1] = [p for p in (HERE, ROOT) if p not in sys.path]

from sizes import parse_size  # noqa: E402

OPS = ["all_reduce", "all_gather_into_tensor", "reduce_scatter_tensor", "all_to_all_single",
       "broadcast"]
BUS_FACTOR = {"all_reduce": lambda n: 2 * (n - 1) / n, "broadcast": lambda n: 1.0}


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("-np", type=int, default=2, help="ranks (when starting itself)")
    p.add_argument("-b", "--min-bytes", type=parse_size, default=parse_size("4"))
    p.add_argument("-e", "--max-bytes", type=parse_size, default=parse_size("64M"))
    p.add_argument("-f", "--factor", type=int, default=16)
    p.add_argument("--ops", default=",".join(OPS[:3]), help=f"comma-separated, from {OPS}")
    p.add_argument("--reps", type=int, default=5, help="timed sets per backend and size")
    p.add_argument("--iters", type=int, default=100, help="calls per set at most (fewer for "
                   "large sizes: about 64 MiB per set, at least 3)")
    p.add_argument("--json", default=None, help="write the results here (rank 0)")
    p.add_argument("--worker", action="store_true", help="run as a rank (under hvdrun)")
    return p.parse_args(argv)


def sizes(args):
    s = args.min_bytes
    while s <= args.max_bytes:
        yield s
        s *= args.factor


def _case(torch, op, nbytes, n, rank):
    """(call(group), check(), bytes counted) for one op and size (float32)."""
    import torch.distributed as dist

    count = max(1, nbytes // 4)
    if op in ("all_reduce", "broadcast"):
        t = torch.full((count,), float(rank + 1))

        def call(g):
            t.fill_(rank + 1)
            if op == "all_reduce":
                dist.all_reduce(t, group=g)
            else:
                dist.broadcast(t, src=0, group=g)

        want = n * (n + 1) / 2 if op == "all_reduce" else 1.0
        return call, lambda: bool((t == want).all()), count * 4
    if op == "all_gather_into_tensor":
        count = max(1, count // n)
        x = torch.full((count,), float(rank))
        out = torch.empty(count * n)
        want = torch.arange(n, dtype=torch.float32).repeat_interleave(count)
        return (lambda g: dist.all_gather_into_tensor(out, x, group=g),
                lambda: torch.equal(out, want), count * n * 4)
    if op == "reduce_scatter_tensor":
        count = max(1, count // n)
        x = torch.full((count * n,), float(rank + 1))
        out = torch.empty(count)
        return (lambda g: dist.reduce_scatter_tensor(out, x, group=g),
                lambda: bool((out == n * (n + 1) / 2).all()), count * n * 4)
    if op == "all_to_all_single":
        count = max(1, count // n)
        x = torch.full((count * n,), float(rank))
        out = torch.empty(count * n)
        want = torch.arange(n, dtype=torch.float32).repeat_interleave(count)
        return (lambda g: dist.all_to_all_single(out, x, group=g),
                lambda: torch.equal(out, want), count * n * 4)
    raise SystemExit(f"unknown op {op!r}; choose from {OPS}")


def worker(args):
    import torch
    import torch.distributed as dist

    import hvd_torch  # noqa: F401  (registers "hvd")

    dist.init_process_group("hvd")
    rank, n = dist.get_rank(), dist.get_world_size()
    gloo = dist.new_group(backend="gloo")
    groups = {"hvd": dist.group.WORLD, "gloo": gloo}
    results = []
    if rank == 0:
        print(f"{n} ranks; float32; median of {args.reps} sets; busbw in GB/s; "
              "gloo/hvd > 1: hvd faster")
        print(f"{'op':<24}{'bytes':>10}{'hvd us':>12}{'gloo us':>12}{'hvd busbw':>11}"
              f"{'gloo busbw':>11}{'gloo/hvd':>10}{'spread':>16}")
    for op in args.ops.split(","):
        for nbytes in sizes(args):
            call, check, counted = _case(torch, op, nbytes, n, rank)
            iters = max(3, min(args.iters, (64 << 20) // max(counted, 1)))
            times = {"hvd": [], "gloo": []}
            for name, g in groups.items():  # warm-up
                for _ in range(2):
                    call(g)
            for _ in range(args.reps):
                for name, g in groups.items():
                    dist.barrier(group=gloo)
                    start = time.perf_counter()
                    for _ in range(iters):
                        call(g)
                    elapsed = torch.tensor([(time.perf_counter() - start) / iters])
                    if not check():
                        raise SystemExit(f"rank {rank}: {op} over {name} gave a wrong result")
                    dist.all_reduce(elapsed, op=dist.ReduceOp.MAX, group=gloo)
                    times[name].append(elapsed.item())
            factor = BUS_FACTOR.get(op, lambda k: (k - 1) / k)(n)
            med = {k: statistics.median(v) for k, v in times.items()}
            ratios = [g / h for g, h in zip(times["gloo"], times["hvd"])]
            row = dict(op=op, bytes=counted, iters=iters,
                       hvd_us=med["hvd"] * 1e6, gloo_us=med["gloo"] * 1e6,
                       hvd_busbw=counted / med["hvd"] * factor / 1e9,
                       gloo_busbw=counted / med["gloo"] * factor / 1e9,
                       ratio=med["gloo"] / med["hvd"], ratio_min=min(ratios),
                       ratio_max=max(ratios))
            results.append(row)
            if rank == 0:
                print(f"{op:<24}{counted:>10}{row['hvd_us']:>12.1f}{row['gloo_us']:>12.1f}"
                      f"{row['hvd_busbw']:>11.3f}{row['gloo_busbw']:>11.3f}{row['ratio']:>10.2f}"
                      f"{'  ' + format(row['ratio_min'], '.2f') + '-' + format(row['ratio_max'], '.2f'):>16}",
                      flush=True)
    if rank == 0 and args.json:
        with open(args.json, "w") as f:
            json.dump(dict(ranks=n, reps=args.reps, results=results), f, indent=1)
        print(f"wrote {args.json}")
    dist.destroy_process_group()


def main():
    args = parse_args()
    if args.worker or "HOROVOD_RANK" in os.environ:
        return worker(args)
    argv = [a for a in sys.argv[1:]]
    cmd = [sys.executable, "-m", "hvdrun", "-np", str(args.np), sys.executable,
           os.path.abspath(__file__), "--worker", *argv]
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([ROOT, os.environ.get("PYTHONPATH", "")]))
    return subprocess.call(cmd, env=env)


if __name__ == "__main__":
    sys.exit(main())
