"""Allreduce bandwidth, hvd-torch against torch.distributed (gloo), in the spirit of nccl-tests.

    python bench/allreduce_bench.py -np 2                       (or: make bench)
    python bench/allreduce_bench.py -np 2 --min-bytes 4 --max-bytes 64M --factor 4 \\
        --iters 200 --warmup 5 --reps 5 --dtype float32 --json out.json

Without --worker the script starts itself on N ranks through hvd_torch.runner
and shows rank 0's output; `hvdrun -np N python bench/allreduce_bench.py` runs
the worker directly. Both libraries live in the same rank processes and are
measured in the same run, size by size, their timed sets interleaved so that
a noisy neighbour slows both alike:

  hvd-torch          hvd.allreduce_(t, name=..., op=hvd.Sum)  (a fixed name per
                     size, as in training, so the response cache is in play)
  torch.distributed  dist.all_reduce(t) on a gloo process group

Each timed set reduces `iters` distinct pre-filled buffers once each, so every
result is exact and checked after the set (an in-place sum over the same buffer
would grow by a factor N per call). A set's time is the slowest rank's; the
reported time is the median over --reps sets. Iterations shrink with size
(at most --iters, about 256 MiB reduced per set, at least 3).

  algbw = bytes / time;  busbw = algbw * 2(n-1)/n  (what each rank's link carries)
  ratio = torch time / hvd time: above 1 means hvd-torch is faster.
"""

import argparse
import datetime
import json
import os
import platform
import statistics
import subprocess
import sys
import time

from sizes import parse_size

HERE = os.path.dirname(os.path.abspath(__file__))
SET_BUDGET_BYTES = 256 << 20  # bytes reduced per timed set, which bounds the buffers
MIN_ITERS = 3
DTYPES = ("float32", "float64", "float16", "bfloat16", "int32", "int64", "uint8", "int8")


def parse_args(argv=None):
    p = argparse.ArgumentParser(
        description="Allreduce bandwidth: hvd-torch vs torch.distributed gloo, same run.",
        formatter_class=argparse.RawDescriptionHelpFormatter,
        epilog="ratio = torch time / hvd-torch time (> 1: hvd-torch faster)",
    )
    p.add_argument(
        "-np",
        "--num-proc",
        type=int,
        default=None,
        help="ranks to start (default 2; under hvdrun: the job's size)",
    )
    p.add_argument("-b", "--min-bytes", type=parse_size, default=parse_size("4"))
    p.add_argument("-e", "--max-bytes", type=parse_size, default=parse_size("64M"))
    p.add_argument("-f", "--factor", type=int, default=4, help="size multiplier per step")
    p.add_argument(
        "-n",
        "--iters",
        type=int,
        default=200,
        help="iterations per timed set for small sizes (fewer for large)",
    )
    p.add_argument("-w", "--warmup", type=int, default=5, help="untimed iterations per size")
    p.add_argument("-r", "--reps", type=int, default=5, help="timed sets per size; median")
    p.add_argument("-d", "--dtype", choices=DTYPES, default="float32")
    p.add_argument(
        "--json", default=None, help="results file (default bench/results/allreduce_<np>.json)"
    )
    p.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.factor < 2:
        p.error("--factor must be at least 2")
    if args.min_bytes > args.max_bytes:
        p.error("--min-bytes is larger than --max-bytes")
    if min(args.iters, args.reps) < 1 or args.warmup < 0:
        p.error("--iters and --reps must be positive, --warmup not negative")
    return args


# ---------------------------------------------------------------- launcher side


def launch(args, argv):
    """Runs this script with --worker on N ranks; rank 0's stdout is shown unprefixed."""
    num_proc = args.num_proc or 2
    json_path = args.json or os.path.join(HERE, "results", f"allreduce_{num_proc}.json")
    cmd = [
        sys.executable,
        "-m",
        "hvd_torch.runner",
        "-np",
        str(num_proc),
        sys.executable,
        os.path.abspath(__file__),
        *argv,
        "--worker",
        "--json",
        os.path.abspath(json_path),
    ]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, text=True, bufsize=1)
    with proc.stdout:
        for line in proc.stdout:
            sys.stdout.write(line.removeprefix("[0]<stdout>:"))
            sys.stdout.flush()
    return proc.wait()


# ---------------------------------------------------------------- worker side


def sizes(args, itemsize):
    """Message sizes in elements: min, min*f, ... up to max, whole elements, no repeats."""
    counts, nbytes = [], args.min_bytes
    while nbytes <= args.max_bytes:
        count = max(1, nbytes // itemsize)
        if count not in counts:
            counts.append(count)
        nbytes *= args.factor
    return counts


def iterations(args, nbytes):
    return max(MIN_ITERS, min(args.iters, SET_BUDGET_BYTES // nbytes))


class Case:
    """One message size: the buffers, this rank's input pattern, the expected sum.

    Rank r's element i is (r + 1) + i % 7, so the sum n(n+1)/2 + n(i % 7) is exact
    in every dtype for small n and a misplaced chunk shows up as a wrong value.
    """

    def __init__(self, torch, count, dtype, iters, rank, size):
        pattern = torch.arange(count, dtype=torch.int64) % 7
        self.input = (pattern + rank + 1).to(dtype)
        self.expected = (size * pattern + size * (size + 1) // 2).to(dtype)
        self.buffers = [self.input.clone() for _ in range(iters)]

    def refill(self):
        for b in self.buffers:
            b.copy_(self.input)

    def check(self, lib, n, torch):
        """The first n buffers must hold the expected sum."""
        for j, b in enumerate(self.buffers[:n]):
            if not torch.equal(b, self.expected):
                bad = (b != self.expected).nonzero()[0].item()
                raise AssertionError(
                    f"{lib} allreduce of {b.numel()} x {b.dtype} is wrong (buffer {j}): "
                    f"element {bad} is {b[bad].item()}, expected {self.expected[bad].item()}"
                )


def timed_set(case, reduce_one, barrier, iters):
    """Seconds for `iters` reductions on this rank, starting together after a barrier."""
    case.refill()
    barrier()
    start = time.perf_counter()
    for b in case.buffers[:iters]:
        reduce_one(b)
    return time.perf_counter() - start


def torch_process_group(torch, dist, hvd):
    """A gloo group on 127.0.0.1; rank 0's store takes a free port, sent by hvd.broadcast."""
    rank, size = hvd.rank(), hvd.size()
    # wait_for_workers=False: the others learn the port only after this returns.
    store = (
        dist.TCPStore("127.0.0.1", 0, size, is_master=True, wait_for_workers=False)
        if rank == 0
        else None
    )
    port = torch.tensor([store.port if store else 0], dtype=torch.int64)
    port = int(hvd.broadcast(port, root_rank=0, name="bench.store_port").item())
    if store is None:
        store = dist.TCPStore("127.0.0.1", port, size, is_master=False)
    # Loopback, as hvd-torch's own Gloo uses: the hostname may resolve to anything.
    os.environ.setdefault("GLOO_SOCKET_IFNAME", "lo")
    dist.init_process_group("gloo", store=store, rank=rank, world_size=size)


def summarize(times, nbytes, size):
    """times: seconds per iteration for each set (already the slowest rank's)."""
    t = statistics.median(times)
    algbw = nbytes / t / 1e9
    return {
        "time_us": t * 1e6,
        "algbw_GBps": algbw,
        "busbw_GBps": algbw * 2 * (size - 1) / size,
        "set_times_us": [x * 1e6 for x in times],
    }


def header(title):
    return (
        f"#\n# {title}\n#\n"
        f"# {'':>24}   {'hvd-torch allreduce_':^27}   {'torch.distributed gloo':^27}\n"
        f"# {'size':>12} {'count':>11}   {'time(us)':>9} {'algbw':>8} {'busbw':>8}"
        f"   {'time(us)':>9} {'algbw':>8} {'busbw':>8}   {'ratio':>6}  iters\n"
        f"# {'(B)':>12} {'(elements)':>11}   {'':>9} {'(GB/s)':>8} {'(GB/s)':>8}"
        f"   {'':>9} {'(GB/s)':>8} {'(GB/s)':>8}"
    )


def row(r):
    h, t = r["hvd"], r["torch"]
    return (
        f"  {r['bytes']:>12} {r['count']:>11}   {h['time_us']:>9.1f} {h['algbw_GBps']:>8.3f} "
        f"{h['busbw_GBps']:>8.3f}   {t['time_us']:>9.1f} {t['algbw_GBps']:>8.3f} "
        f"{t['busbw_GBps']:>8.3f}   {r['ratio']:>6.2f}  {r['iters']:>5}"
    )


def worker(args):
    import torch
    import torch.distributed as dist

    import hvd_torch as hvd

    hvd.init()
    # One thread per rank: the ranks share the machine's cores.
    torch.set_num_threads(1)
    rank, size = hvd.rank(), hvd.size()
    if args.num_proc is not None and args.num_proc != size:
        raise SystemExit(f"-np {args.num_proc} but the job has {size} ranks")
    torch_process_group(torch, dist, hvd)
    dtype = getattr(torch, args.dtype)
    itemsize = torch.empty((), dtype=dtype).element_size()
    log = print if rank == 0 else (lambda *a, **k: None)

    log(
        f"# hvd-torch {hvd.__version__}, torch {torch.__version__}, {size} ranks, "
        f"dtype {args.dtype}, op sum, warmup {args.warmup}, median of {args.reps} sets"
    )
    log(header(f"allreduce, in place, {size} ranks on {platform.node()}"))
    results = []
    for count in sizes(args, itemsize):
        nbytes = count * itemsize
        iters = iterations(args, nbytes)
        case = Case(torch, count, dtype, max(iters, args.warmup), rank, size)
        name = f"bench.{nbytes}B"
        libs = {
            "hvd": (lambda b, name=name: hvd.allreduce_(b, name=name, op=hvd.Sum), hvd.barrier),
            "torch": (lambda b: dist.all_reduce(b, op=dist.ReduceOp.SUM), dist.barrier),
        }
        times = {lib: [] for lib in libs}
        for lib, (reduce_one, barrier) in libs.items():
            if args.warmup:
                timed_set(case, reduce_one, barrier, args.warmup)
                case.check(lib, args.warmup, torch)
        for _ in range(args.reps):
            # Interleaved, so a burst of noise lands on both libraries.
            for lib, (reduce_one, barrier) in libs.items():
                seconds = timed_set(case, reduce_one, barrier, iters)
                case.check(lib, iters, torch)
                times[lib].append(seconds / iters)
        # The slowest rank's time per set: reductions finish together, but barriers don't.
        local = torch.tensor([times["hvd"], times["torch"]], dtype=torch.float64)
        slowest = hvd.allreduce(local, name="bench.times", op=hvd.Max)
        r = {"bytes": nbytes, "count": count, "iters": iters}
        for i, lib in enumerate(libs):
            r[lib] = summarize(slowest[i].tolist(), nbytes, size)
        r["ratio"] = r["torch"]["time_us"] / r["hvd"]["time_us"]
        results.append(r)
        log(row(r))

    ratios = [r["ratio"] for r in results]
    geomean = statistics.geometric_mean(ratios)
    log(
        f"# ratio = torch time / hvd-torch time (> 1: hvd-torch faster); "
        f"geometric mean {geomean:.2f}, range {min(ratios):.2f}..{max(ratios):.2f}"
    )
    if rank == 0:
        report = {
            "benchmark": "allreduce",
            "np": size,
            "dtype": args.dtype,
            "op": "sum",
            "host": platform.node(),
            "cpus": os.cpu_count(),
            "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
            "hvd_torch": hvd.__version__,
            "torch": torch.__version__,
            "settings": {
                "warmup": args.warmup,
                "reps": args.reps,
                "max_iters": args.iters,
                "set_budget_bytes": SET_BUDGET_BYTES,
                "torch_threads": 1,
            },
            "ratio_geomean": geomean,
            "results": results,
        }
        os.makedirs(os.path.dirname(args.json) or ".", exist_ok=True)
        with open(args.json, "w") as f:
            json.dump(report, f, indent=1)
        log(f"# results: {args.json}")
    dist.destroy_process_group()
    return 0


def main():
    argv = sys.argv[1:]
    args = parse_args(argv)
    # Started by hvdrun without --worker: this process is already a rank.
    if args.worker or "HOROVOD_RANK" in os.environ:
        if args.json is None:
            size = os.environ.get("HOROVOD_SIZE", "1")
            args.json = os.path.join(HERE, "results", f"allreduce_{size}.json")
        return worker(args)
    return launch(args, argv)


if __name__ == "__main__":
    sys.exit(main())
