"""Adasum's cost: hvd.allreduce(op=Adasum) against hvd's Average allreduce and
torch.distributed's all_reduce (gloo), in the same rank processes; and, for
many small tensors, one grouped Adasum against one Adasum call per tensor.

    python bench/adasum_bench.py -np 2 -b 4K -e 64M --json out.json

Without HOROVOD_RANK in the environment the script starts itself on -np ranks
through hvdrun and prints rank 0's table. torch.distributed has no Adasum: its
all_reduce (a Sum) is the floor an Adasum pays on top of (halves exchanged,
dot products, an allgather). Times are medians of --reps timed sets,
interleaved across the forms; ratios, not times, are what to compare.
"""

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
from report import fmt_bytes  # noqa: E402
from sizes import parse_size  # noqa: E402


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("-np", "--num-proc", type=int, default=2)
    p.add_argument("-b", "--min-bytes", type=parse_size, default=parse_size("4K"))
    p.add_argument("-e", "--max-bytes", type=parse_size, default=parse_size("64M"))
    p.add_argument("-f", "--factor", type=int, default=8)
    p.add_argument("-r", "--reps", type=int, default=5)
    p.add_argument("--many", default="100x1K", help="KxS: K tensors of S bytes ('' to skip)")
    p.add_argument("--json", default=str(HERE / "results" / "adasum.json"))
    return p.parse_args(argv)


def _timed(fn, iters):
    start = time.perf_counter()
    for _ in range(iters):
        fn()
    return (time.perf_counter() - start) / iters


def _medians(forms, iters, reps, barrier):
    """{name: median seconds per call}, the forms interleaved in each timed set."""
    samples = {name: [] for name in forms}
    for name, fn in forms.items():
        fn()  # warm-up: negotiation, caches
    for _ in range(reps):
        for name, fn in forms.items():
            barrier()
            samples[name].append(_timed(fn, iters))
    return {name: statistics.median(s) for name, s in samples.items()}


def worker(args):
    import torch
    import torch.distributed as dist

    import hvd_torch as hvd
    from collectives_bench import torch_process_group

    torch.set_num_threads(1)
    hvd.init()
    torch_process_group(torch, dist, hvd)
    barrier = lambda: hvd.barrier()  # noqa: E731
    rows = []
    size = args.min_bytes
    while size <= args.max_bytes:
        count = max(1, size // 4)
        x = torch.randn(count, generator=torch.Generator().manual_seed(hvd.rank()))
        iters = max(3, min(200, (64 << 20) // size // 4))
        forms = {
            "hvd adasum": lambda: hvd.allreduce(x, name="b.adasum", op=hvd.Adasum),
            "hvd average": lambda: hvd.allreduce(x, name="b.avg"),
            "torch sum": lambda: dist.all_reduce(x.clone()),
        }
        t = _medians(forms, iters, args.reps, barrier)
        rows.append({"bytes": size, **{k: v * 1e6 for k, v in t.items()}})
        size *= args.factor
    many = None
    if args.many:
        k, s = args.many.lower().split("x")
        tensors = [torch.randn(max(1, parse_size(s) // 4)) for _ in range(int(k))]
        forms = {
            "grouped adasum": lambda: hvd.grouped_allreduce(tensors, name="m.g", op=hvd.Adasum),
            "one adasum per tensor": lambda: [hvd.allreduce(t, name=f"m.{i}", op=hvd.Adasum)
                                              for i, t in enumerate(tensors)],
            "grouped average": lambda: hvd.grouped_allreduce(tensors, name="m.avg"),
        }
        t = _medians(forms, 3, args.reps, barrier)
        many = {"case": args.many, **{name: v * 1e6 for name, v in t.items()}}
    if hvd.rank() == 0:
        report(args, hvd.size(), rows, many)
    dist.destroy_process_group()
    hvd.shutdown()


def report(args, size, rows, many):
    print(f"# Adasum, {size} ranks, float32; medians of {args.reps} sets (us per call)")
    print(f"# {'bytes':>10} {'hvd adasum':>12} {'hvd average':>12} {'torch sum':>12} "
          f"{'adasum/avg':>11} {'torch/adasum':>13}")
    for r in rows:
        print(f"  {fmt_bytes(r['bytes']):>10} {r['hvd adasum']:12.1f} {r['hvd average']:12.1f} "
              f"{r['torch sum']:12.1f} {r['hvd adasum'] / r['hvd average']:11.2f} "
              f"{r['torch sum'] / r['hvd adasum']:13.2f}")
    if many:
        print(f"# {many['case']}: grouped Adasum {many['grouped adasum']:.0f} us, one per "
              f"tensor {many['one adasum per tensor']:.0f} us "
              f"({many['one adasum per tensor'] / many['grouped adasum']:.1f}x), grouped Average "
              f"{many['grouped average']:.0f} us")
    Path(args.json).parent.mkdir(parents=True, exist_ok=True)
    with open(args.json, "w") as f:
        json.dump({"ranks": size, "rows": rows, "many": many}, f, indent=1)
    print(f"# results: {args.json}")


def main(argv=None):
    args = parse_args(argv)
    if "HOROVOD_RANK" in os.environ:
        return worker(args)
    cmd = [sys.executable, "-m", "hvdrun", "-np", str(args.num_proc), sys.executable,
           str(Path(__file__).resolve()), *(argv if argv is not None else sys.argv[1:])]
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(
        [str(HERE.parent), os.environ.get("PYTHONPATH", "")]))
    return subprocess.run(cmd, env=env).returncode


if __name__ == "__main__":
    sys.exit(main())
