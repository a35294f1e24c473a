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
import itertools
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
    p.add_argument("--many", default="100x1K",
                   help="KxS: K tensors of S bytes; KxS+KxS...: several sizes, interleaved "
                        "like a model's layers ('' to skip)")
    p.add_argument("--device", default="cpu", choices=["cpu", "cuda"],
                   help="where the tensors live (cuda: each rank on GPU local_rank % count)")
    p.add_argument("--json", default=str(HERE / "results" / "adasum.json"))
    return p.parse_args(argv)


def _timed(fn, iters, sync):
    start = time.perf_counter()
    for _ in range(iters):
        fn()
    sync()  # a GPU's queued work belongs to the time
    return (time.perf_counter() - start) / iters


def _medians(forms, iters, reps, barrier, sync):
    """{name: median seconds per call}, the forms interleaved in each timed set."""
    samples = {name: [] for name in forms}
    for name, fn in forms.items():
        fn()  # warm-up: negotiation, caches
    for _ in range(reps):
        for name, fn in forms.items():
            barrier()
            samples[name].append(_timed(fn, iters, sync))
    return {name: statistics.median(s) for name, s in samples.items()}


def _many_counts(spec):
    """Element counts of --many's tensors: "106x4K+53x1M" takes one of each
    size in turn (4K, 1M, 4K, 1M, ...) until each size's count is used up."""
    groups = []
    for part in spec.lower().split("+"):
        k, s = part.split("x")
        groups.append([max(1, parse_size(s) // 4)] * int(k))
    return [c for row in itertools.zip_longest(*groups) for c in row if c is not None]


def worker(args):
    import torch
    import torch.distributed as dist

    import hvd_torch as hvd
    from collectives_bench import torch_process_group

    torch.set_num_threads(1)
    hvd.init()
    if args.device == "cuda":
        torch.cuda.set_device(hvd.local_rank() % torch.cuda.device_count())
    torch_process_group(torch, dist, hvd)
    barrier = lambda: hvd.barrier()  # noqa: E731
    sync = torch.cuda.synchronize if args.device == "cuda" else lambda: None
    rows = []
    size = args.min_bytes
    while size <= args.max_bytes:
        count = max(1, size // 4)
        x = torch.randn(count, generator=torch.Generator().manual_seed(hvd.rank())).to(args.device)
        iters = max(3, min(200, (64 << 20) // size // 4))
        forms = {
            "hvd adasum": lambda: hvd.allreduce(x, name="b.adasum", op=hvd.Adasum),
            "hvd average": lambda: hvd.allreduce(x, name="b.avg"),
            "torch sum": lambda: dist.all_reduce(x.clone()),
        }
        t = _medians(forms, iters, args.reps, barrier, sync)
        rows.append({"bytes": size, **{k: v * 1e6 for k, v in t.items()}})
        size *= args.factor
    many = None
    if args.many:
        tensors = [torch.randn(count).to(args.device) for count in _many_counts(args.many)]
        forms = {
            "grouped adasum": lambda: hvd.grouped_allreduce(tensors, name="m.g", op=hvd.Adasum),
            "one adasum per tensor": lambda: [hvd.allreduce(t, name=f"m.{i}", op=hvd.Adasum)
                                              for i, t in enumerate(tensors)],
            "grouped average": lambda: hvd.grouped_allreduce(tensors, name="m.avg"),
        }
        t = _medians(forms, 3, args.reps, barrier, sync)
        many = {"case": args.many, **{name: v * 1e6 for name, v in t.items()}}
    if hvd.rank() == 0:
        report(args, hvd.size(), rows, many)
    dist.destroy_process_group()
    hvd.shutdown()


def report(args, size, rows, many):
    print(f"# Adasum, {size} ranks, float32 on {args.device}; medians of {args.reps} sets "
          "(us per call)")
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
        json.dump({"ranks": size, "device": args.device, "rows": rows, "many": many}, f,
                  indent=1)
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
