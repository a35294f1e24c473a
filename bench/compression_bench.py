"""CPU throughput of the cast compressors (hvd.Compression.fp16 / .bf16).

    python bench/compression_bench.py
    python bench/compression_bench.py --min-bytes 1M --max-bytes 256M --factor 4 \\
        --threads 1,0 --reps 5 --min-time 0.2 --json out.json

A compressed allreduce pays a conversion on the caller's thread before the
collective (float32 -> 16 bits) and one after (16 bits -> float32). This
measures both, for float16 and bfloat16, one process, no ranks:

  compress    Compression.X.compress(x)            (allocates the 16-bit tensor)
  decompress  Compression.X.decompress(h, float32) (allocates the float32 tensor)
  into        dst.copy_(src) into a preallocated tensor: the conversion kernel
              alone, without the allocator and first-touch page faults

and the baseline in the same run, size by size: x.clone() of the float32 tensor
(a plain memory copy: reads and writes 4 bytes per element where a conversion
writes 2 or reads 2).

  GB/s     = float32 bytes / time (1 GB = 1e9 bytes): how fast float32 data is
             converted, comparable with allreduce algbw on float32 tensors
  vs copy  = clone time / conversion time (above 1: faster than a memcpy-like clone)

Each timing is the median over --reps sets; a set runs the op at least 3 times
and at least --min-time seconds, and reports the mean. Every size is run with
each thread count of --threads (0 = torch's default, here
torch.get_num_threads() at start). Round trips are checked once per size and
dtype. Results go to bench/results/compression.json.
"""

import argparse
import datetime
import json
import os
import platform
import statistics
import sys
import time

import torch

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(HERE))

from hvd_torch.compression import Compression  # noqa: E402  (after the path fix-up)

from sizes import parse_size as parse_bytes  # noqa: E402  (scripts run from bench/)

MIN_ITERS = 3
COMPRESSORS = {"fp16": Compression.fp16, "bf16": Compression.bf16}
# Round-trip tolerance: half an ulp of the 16-bit format, relative, or half
# float16's smallest subnormal for values that underflow.
ROUND_TRIP_RTOL = {"fp16": 2.0**-11, "bf16": 2.0**-8}
ROUND_TRIP_ATOL = {"fp16": 2.0**-25, "bf16": 0.0}


def parse_size(text):
    """A size of at least 4 bytes (one float32)."""
    return parse_bytes(text, minimum=4)


def parse_args(argv=None):
    p = argparse.ArgumentParser(
        description="CPU throughput of hvd.Compression.fp16/bf16 vs a float32 clone.",
        formatter_class=argparse.RawDescriptionHelpFormatter,
        epilog="GB/s = float32 bytes / time; vs copy = clone time / op time",
    )
    p.add_argument("-b", "--min-bytes", type=parse_size, default=parse_size("1M"),
                   help="smallest float32 tensor (default 1M)")
    p.add_argument("-e", "--max-bytes", type=parse_size, default=parse_size("256M"),
                   help="largest float32 tensor (default 256M)")
    p.add_argument("-f", "--factor", type=int, default=4, help="size multiplier per step")
    p.add_argument("-t", "--threads", default="1,0",
                   help="comma-separated torch thread counts; 0 = default (default 1,0)")
    p.add_argument("-r", "--reps", type=int, default=5, help="timed sets per point; median")
    p.add_argument("--min-time", type=float, default=0.2, help="seconds per timed set (min)")
    p.add_argument("--json", default=os.path.join(HERE, "results", "compression.json"))
    args = p.parse_args(argv)
    if args.factor < 2:
        p.error("--factor must be at least 2")
    return args


def time_op(fn, reps, min_time):
    """Median over `reps` sets of the mean time of fn() in each set."""
    fn()  # warm-up: first-call dispatch, lazy initialisation
    sets = []
    for _ in range(reps):
        n, start = 0, time.perf_counter()
        while True:
            fn()
            n += 1
            elapsed = time.perf_counter() - start
            if n >= MIN_ITERS and elapsed >= min_time:
                break
        sets.append(elapsed / n)
    return statistics.median(sets)


def check_round_trip(x, name, comp):
    h, ctx = comp.compress(x)
    assert h.dtype == comp.dtype, f"{name}: compress gave {h.dtype}"
    back = comp.decompress(h, ctx)
    assert back.dtype == x.dtype and back.shape == x.shape, f"{name}: decompress gave {back.dtype}"
    excess = ((back - x).abs() - ROUND_TRIP_RTOL[name] * x.abs() - ROUND_TRIP_ATOL[name]).max()
    assert excess.item() <= 0, f"{name}: round trip error above tolerance by {excess.item()}"


def bench_size(nbytes, args):
    numel = nbytes // 4
    x = torch.randn(numel, dtype=torch.float32)
    rows = []
    copy_time = time_op(lambda: x.clone(), args.reps, args.min_time)
    rows.append(("copy", "clone", copy_time))
    for name, comp in COMPRESSORS.items():
        check_round_trip(x, name, comp)
        h, ctx = comp.compress(x)
        low = torch.empty(numel, dtype=comp.dtype)
        high = torch.empty(numel, dtype=torch.float32)
        rows.append((name, "compress", time_op(lambda: comp.compress(x), args.reps,
                                               args.min_time)))
        rows.append((name, "decompress", time_op(lambda: comp.decompress(h, ctx), args.reps,
                                                 args.min_time)))
        rows.append((name, "compress into", time_op(lambda: low.copy_(x), args.reps,
                                                    args.min_time)))
        rows.append((name, "decompress into", time_op(lambda: high.copy_(h), args.reps,
                                                      args.min_time)))
    return [
        {
            "bytes": nbytes,
            "format": fmt,
            "op": op,
            "time_s": t,
            "gbps": nbytes / t / 1e9,
            "vs_copy": copy_time / t,
        }
        for fmt, op, t in rows
    ]


def sizes(args):
    n = args.min_bytes
    while n <= args.max_bytes:
        yield n
        n *= args.factor


def fmt_bytes(n):
    for unit, scale in (("G", 1 << 30), ("M", 1 << 20), ("K", 1 << 10)):
        if n >= scale and n % scale == 0:
            return f"{n // scale}{unit}"
    return str(n)


def main(argv=None):
    args = parse_args(argv)
    default_threads = torch.get_num_threads()
    thread_counts = [int(t) or default_threads for t in args.threads.split(",")]
    results = []
    header = (f"{'threads':>7} {'size':>6} {'format':>6} {'op':>16} {'time (ms)':>10} "
              f"{'GB/s':>7} {'vs copy':>8}")
    print(f"# torch {torch.__version__}, {os.cpu_count()} CPUs, default threads "
          f"{default_threads}; GB/s = float32 bytes / time")
    print(header)
    for threads in thread_counts:
        torch.set_num_threads(threads)
        for nbytes in sizes(args):
            for row in bench_size(nbytes, args):
                row["threads"] = threads
                results.append(row)
                print(f"{threads:>7} {fmt_bytes(nbytes):>6} {row['format']:>6} {row['op']:>16} "
                      f"{row['time_s'] * 1e3:>10.3f} {row['gbps']:>7.2f} {row['vs_copy']:>8.2f}",
                      flush=True)
    torch.set_num_threads(default_threads)
    report = {
        "benchmark": "compression",
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "torch": torch.__version__,
        "python": platform.python_version(),
        "machine": platform.machine(),
        "cpu_count": os.cpu_count(),
        "default_threads": default_threads,
        "args": {k: v for k, v in vars(args).items() if k != "json"},
        "units": {"gbps": "float32 bytes / time / 1e9", "vs_copy": "clone time / op time"},
        "results": results,
    }
    os.makedirs(os.path.dirname(args.json) or ".", exist_ok=True)
    with open(args.json, "w") as f:
        json.dump(report, f, indent=1)
    print(f"# results: {args.json}")


if __name__ == "__main__":
    main()
