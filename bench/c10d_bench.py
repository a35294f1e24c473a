"""torch.distributed collectives over the "hvd" backend against torch's own gloo, in one run.

    python bench/c10d_bench.py -np 2                        (starts itself under hvdrun)
    python bench/c10d_bench.py -np 3 -b 1K -e 64M -f 4 --reps 5 --json c10d.json
    hvdrun -np 2 python bench/c10d_bench.py --worker        (the worker directly)

Both process groups live in the same rank processes: the default group on "hvd"
(hvd-torch's engine: shared memory on one host) and dist.new_group(backend="gloo")
over every rank. For each op and size the two are timed in alternating sets, so a
noisy neighbour slows both alike; each set runs `iters` calls of
dist.<op>(..., group=g) on pre-filled tensors, and its result is checked after the set
(all_reduce and broadcast: timed on zeros, checked on one more call).
A set's time is the slowest rank's (a max-allreduce of the per-rank times over gloo);
the reported time is the median over --reps sets, with the spread of the ratio.

  algbw = bytes / time;  busbw = algbw x 2(n-1)/n (all_reduce), (n-1)/n
  (all_gather_into_tensor, reduce_scatter_tensor, all_to_all_single), 1 (broadcast)
  bytes: the tensor passed (all_reduce, broadcast), the gathered output
  (all_gather_into_tensor), the input (reduce_scatter_tensor, all_to_all_single).
  gloo/hvd = gloo's time / hvd's time: above 1 means hvd is faster.

--ddp-steps K also times K DDP training steps, then K FSDP2 steps, per set over each
group, of --model: a 4-layer MLP (fully_shard per layer) or ResNet-18 for 32x32 images
(fully_shard per residual block); the same initial weights, and the two backends must
end with the same weights.

    python bench/c10d_bench.py -np 2 --ops all_reduce -b 1M -e 1M --reps 3 \
        --ddp-steps 3 --model resnet18
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
    p.add_argument("--threads", type=int, default=1, help="torch.set_num_threads per rank")
    p.add_argument("--ddp-steps", type=int, default=0,
                   help="also time this many DDP and FSDP2 training steps per set (0: none)")
    p.add_argument("--model", choices=("mlp", "resnet18"), default="mlp",
                   help="what --ddp-steps trains: a 4-layer MLP, or ResNet-18 for 32x32 images "
                        "(examples/synthetic_benchmark.py's, 11.2M parameters)")
    p.add_argument("--ddp-width", type=int, default=1024, help="the DDP MLP's layer width")
    p.add_argument("--batch", type=int, default=None,
                   help="training batch per rank (default: 32 for the MLP, 8 for ResNet-18)")
    p.add_argument("--json", default=None, help="write the results here (rank 0)")
    p.add_argument("--worker", action="store_true", help="run as a rank (under hvdrun)")
    return p.parse_args(argv)


def sizes(args):
    s = args.min_bytes
    while s <= args.max_bytes:
        yield s
        s *= args.factor


def _case(torch, op, nbytes, n, rank):
    """(call(group), check(group), bytes counted) for one op and size (float32)."""
    import torch.distributed as dist

    count = max(1, nbytes // 4)
    if op in ("all_reduce", "broadcast"):
        # Timed on zeros (a sum of zeros stays zeros, so no refill between calls);
        # checked on one more call with rank + 1 on every rank.
        t = torch.zeros(count)

        def call(g):
            if op == "all_reduce":
                dist.all_reduce(t, group=g)
            else:
                dist.broadcast(t, src=0, group=g)

        def check(g):
            t.fill_(rank + 1)
            call(g)
            ok = bool((t == (n * (n + 1) / 2 if op == "all_reduce" else 1.0)).all())
            t.zero_()
            return ok

        return call, check, count * 4
    if op == "all_gather_into_tensor":
        count = max(1, count // n)
        x = torch.full((count,), float(rank))
        out = torch.empty(count * n)
        want = torch.arange(n, dtype=torch.float32).repeat_interleave(count)
        return (lambda g: dist.all_gather_into_tensor(out, x, group=g),
                lambda g: torch.equal(out, want), count * n * 4)
    if op == "reduce_scatter_tensor":
        count = max(1, count // n)
        x = torch.full((count * n,), float(rank + 1))
        out = torch.empty(count)
        return (lambda g: dist.reduce_scatter_tensor(out, x, group=g),
                lambda g: bool((out == n * (n + 1) / 2).all()), count * n * 4)
    if op == "all_to_all_single":
        count = max(1, count // n)
        x = torch.full((count * n,), float(rank))
        out = torch.empty(count * n)
        want = torch.arange(n, dtype=torch.float32).repeat_interleave(count)
        return (lambda g: dist.all_to_all_single(out, x, group=g),
                lambda g: torch.equal(out, want), count * n * 4)
    raise SystemExit(f"unknown op {op!r}; choose from {OPS}")


def _model(torch, args):
    """(model, its FSDP2 units, one batch's input maker, its name) for --model."""
    torch.manual_seed(0)
    if args.model == "resnet18":
        examples = os.path.join(ROOT, "examples")
        if examples not in sys.path:  # _model runs once per backend and kind
            sys.path.insert(0, examples)
        from synthetic_benchmark import ResNet18

        net = ResNet18()
        units = list(net.layers)  # the eight residual blocks
        batch = args.batch or 8
        return net, units, lambda g: torch.randn(batch, 3, 32, 32, generator=g), \
            f"ResNet-18 (32x32), batch {batch}"
    w = args.ddp_width
    net = torch.nn.Sequential(*[torch.nn.Linear(w, w) for _ in range(4)])
    batch = args.batch or 32
    return net, list(net), lambda g: torch.randn(batch, w, generator=g), \
        f"MLP 4x{w}x{w}, batch {batch}"


def training_steps(kind, torch, dist, groups, args, rank, n):
    """DDP or FSDP2 training steps of --model (the MLP: --ddp-width, 4 square layers;
    1024: 16 MiB of gradients) over each group, sets alternated; the median step time
    per backend. The two must end with the same weights."""
    models = {}
    for name, g in groups.items():
        net, units, make_input, described = _model(torch, args)
        grad_bytes = 4 * sum(p.numel() for p in net.parameters())  # before any sharding
        if kind == "ddp":
            from torch.nn.parallel import DistributedDataParallel as DDP

            model = DDP(net, process_group=g)
        else:
            from torch.distributed.device_mesh import DeviceMesh
            from torch.distributed.fsdp import fully_shard

            mesh = DeviceMesh.from_group(g, "cpu")
            for unit in units:
                fully_shard(unit, mesh=mesh)
            model = fully_shard(net, mesh=mesh)
        models[name] = (model, torch.optim.SGD(net.parameters(), lr=1e-3))
    x = make_input(torch.Generator().manual_seed(rank))
    gloo = groups["gloo"]
    times = {name: [] for name in models}

    def step(name):
        model, opt = models[name]
        opt.zero_grad()
        model(x).pow(2).mean().backward()
        opt.step()

    for name in models:
        step(name)
    for _ in range(args.reps):
        for name in models:
            dist.barrier(group=gloo)
            start = time.perf_counter()
            for _ in range(args.ddp_steps):
                step(name)
            elapsed = torch.tensor([(time.perf_counter() - start) / args.ddp_steps])
            dist.all_reduce(elapsed, op=dist.ReduceOp.MAX, group=gloo)
            times[name].append(elapsed.item())

    def weights(name):
        state = models[name][0].state_dict()
        return torch.cat([(v.full_tensor() if hasattr(v, "full_tensor") else v).reshape(-1)
                          .double() for v in state.values()])

    if not torch.allclose(weights("hvd"), weights("gloo"), rtol=0, atol=1e-5):
        raise SystemExit(f"rank {rank}: {kind} over hvd and over gloo trained different weights")
    med = {k: statistics.median(v) for k, v in times.items()}
    ratios = [g / h for g, h in zip(times["gloo"], times["hvd"])]
    row = dict(op=f"{kind}_step_{args.model}" + (f"{args.ddp_width}" if args.model == "mlp"
                                                 else ""),
               bytes=grad_bytes, iters=args.ddp_steps,
               hvd_us=med["hvd"] * 1e6, gloo_us=med["gloo"] * 1e6, ratio=med["gloo"] / med["hvd"],
               ratio_min=min(ratios), ratio_max=max(ratios))
    if rank == 0:
        print(f"{kind.upper()} step, {described} (~{row['bytes'] >> 20} MiB of gradients): "
              f"hvd {row['hvd_us'] / 1e3:.2f} ms, gloo {row['gloo_us'] / 1e3:.2f} ms, "
              f"gloo/hvd {row['ratio']:.2f} ({row['ratio_min']:.2f}-{row['ratio_max']:.2f})",
              flush=True)
    return row


def worker(args):
    import torch
    import torch.distributed as dist

    import hvd_torch  # noqa: F401  (registers "hvd")

    # One compute thread per rank, as torchrun sets (OMP_NUM_THREADS=1): OpenMP's
    # spinning workers beside the ranks' own threads slowed every op 5-10x on 2 cores.
    torch.set_num_threads(args.threads)
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
                    if not check(g):
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
    if args.ddp_steps:
        for kind in ("ddp", "fsdp"):
            results.append(training_steps(kind, torch, dist, groups, args, rank, n))
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
