"""Synthetic ResNet-18 training throughput: hvd-torch against DDP (gloo), in one run.

    hvdrun -np 2 python examples/synthetic_benchmark.py                 (or: make synthetic)
    hvdrun -np 2 python examples/synthetic_benchmark.py --mode hvd --fp16-allreduce

In the spirit of Horovod's pytorch_synthetic_benchmark.py. Every rank trains a
ResNet-18 (BasicBlock [2, 2, 2, 2], the CIFAR form for 32x32 inputs: 3x3 stem,
no max-pool; 10 classes, 11.2M parameters) on one random batch of its own with
SGD(lr=0.01), four ways, in the same processes:

  local  forward, backward and step without communication, on every rank at
         once: the 1-rank baseline, measured under the same CPU contention
  sync   local's step, then a 4-byte allreduce: the ranks wait for each other
         once per step, as any synchronous data-parallel training must, but
         send no gradients. No library can beat it: it is the bound
  hvd    hvd.DistributedOptimizer: each gradient's allreduce starts from a hook
         during backward; step() waits for them
  ddp    torch.nn.parallel.DistributedDataParallel on a gloo process group

All three start from the same weights and see the same batch. After a warm-up
per mode, the timed iterations are interleaved (local, hvd, ddp, local, ...) so
that the machine's noise lands on every mode alike. Reported as Horovod does,
mean +- 1.96 std over iterations:

  img/sec per rank, total img/sec (the sum over ranks), step time
  scaling efficiency = total img/sec / (N x local img/sec per rank)
  of the bound = total img/sec / sync's total img/sec: what communication
                 costs beyond the wait for the slowest rank
  ratio = hvd img/sec / ddp img/sec (above 1: hvd-torch is faster), over all
          iterations, and its median and range over the iterations (each
          iteration's hvd and ddp sets run back to back, so they share the
          machine's load of that moment)

At the end the ranks compare a checksum of each model's weights (the script
exits with 1 if they differ), and the hvd and ddp weights are compared with each
other. Results also go to bench/results/synthetic_<np>.json (--json).
"""

import argparse
import copy
import datetime
import hashlib
import inspect
import json
import os
import platform
import statistics
import sys
import time

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn

import hvd_torch as hvd
from progress import progress

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def parse_args(argv=None):
    p = argparse.ArgumentParser(
        description=__doc__.split("\n")[0],
        formatter_class=argparse.RawDescriptionHelpFormatter,
        epilog="ratio = hvd img/sec / ddp img/sec (> 1: hvd-torch faster)",
    )
    p.add_argument("--batch-size", type=int, default=32, help="per rank")
    p.add_argument("--num-warmup-batches", type=int, default=2, help="untimed, per mode")
    p.add_argument("--num-batches-per-iter", type=int, default=3)
    p.add_argument("--num-iters", type=int, default=10)
    p.add_argument("--fp16-allreduce", action="store_true", help="float16 gradients on the wire")
    p.add_argument("--mode", choices=("hvd", "ddp", "both"), default="both")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--device", choices=("cpu", "cuda"), default="cpu",
                   help="cuda: each rank on GPU local_rank %% visible GPUs; DDP uses NCCL when "
                        "every local rank has its own GPU, else gloo")
    p.add_argument("--json", default=None, help="default bench/results/synthetic_<np>.json")
    args = p.parse_args(argv)
    for flag in ("batch_size", "num_batches_per_iter", "num_iters"):
        if getattr(args, flag) < 1:
            p.error(f"--{flag.replace('_', '-')} must be at least 1")
    if args.num_warmup_batches < 0:
        p.error("--num-warmup-batches must be at least 0")
    return args


class BasicBlock(nn.Module):
    def __init__(self, in_planes, planes, stride=1):
        super().__init__()
        self.conv1 = nn.Conv2d(in_planes, planes, 3, stride=stride, padding=1, bias=False)
        self.bn1 = nn.BatchNorm2d(planes)
        self.conv2 = nn.Conv2d(planes, planes, 3, stride=1, padding=1, bias=False)
        self.bn2 = nn.BatchNorm2d(planes)
        self.shortcut = nn.Sequential()
        if stride != 1 or in_planes != planes:
            self.shortcut = nn.Sequential(
                nn.Conv2d(in_planes, planes, 1, stride=stride, bias=False), nn.BatchNorm2d(planes)
            )

    def forward(self, x):
        out = F.relu(self.bn1(self.conv1(x)))
        out = self.bn2(self.conv2(out))
        return F.relu(out + self.shortcut(x))


class ResNet18(nn.Module):
    """ResNet-18 for 32x32 images (He et al. 2016, the CIFAR variant)."""

    def __init__(self, num_classes=10, blocks=(2, 2, 2, 2)):
        super().__init__()
        self.conv1 = nn.Conv2d(3, 64, 3, stride=1, padding=1, bias=False)
        self.bn1 = nn.BatchNorm2d(64)
        layers, in_planes = [], 64
        for planes, stride, n in zip((64, 128, 256, 512), (1, 2, 2, 2), blocks):
            for s in [stride] + [1] * (n - 1):
                layers.append(BasicBlock(in_planes, planes, s))
                in_planes = planes
        self.layers = nn.Sequential(*layers)
        self.fc = nn.Linear(512, num_classes)

    def forward(self, x):
        x = self.layers(F.relu(self.bn1(self.conv1(x))))
        return self.fc(F.adaptive_avg_pool2d(x, 1).flatten(1))


def ddp_process_group(backend="gloo"):
    """torch.distributed's group (gloo, or nccl for GPUs) on 127.0.0.1; rank 0's store
    takes a free port and hvd.broadcast_object tells the others."""
    rank, size = hvd.rank(), hvd.size()
    # wait_for_workers=False: the others learn the port only after this returns.
    store = (
        dist.TCPStore("127.0.0.1", 0, size, is_master=True, wait_for_workers=False)
        if rank == 0
        else None
    )
    port = hvd.broadcast_object(store.port if store else None, root_rank=0, name="ddp_port")
    if store is None:
        store = dist.TCPStore("127.0.0.1", port, size, is_master=False)
    # Loopback, as hvd-torch's own Gloo uses: the hostname may resolve to anything.
    os.environ.setdefault("GLOO_SOCKET_IFNAME", "lo")
    dist.init_process_group(backend, store=store, rank=rank, world_size=size)


def make_runners(args, modes):
    """name -> (model, step function). Identical initial weights in every mode."""
    torch.manual_seed(args.seed)  # the same on every rank: one initial model
    base = ResNet18()
    # This rank's batch: different per rank, so unaveraged gradients would show
    # as diverged weights; the same batch for every mode.
    g = torch.Generator().manual_seed(args.seed + 1 + hvd.rank())
    data = torch.randn(args.batch_size, 3, 32, 32, generator=g).to(args.device)
    target = torch.randint(0, 10, (args.batch_size,), generator=g).to(args.device)
    base = base.to(args.device)

    def runner(model, optimizer, wait_for_peers=False):
        def step():
            optimizer.zero_grad()
            F.cross_entropy(model(data), target).backward()
            optimizer.step()
            if wait_for_peers:
                hvd.allreduce_(torch.zeros(1), name="synthetic.sync")

        return model, step

    runners = {}
    model = copy.deepcopy(base)
    runners["local"] = runner(model, torch.optim.SGD(model.parameters(), lr=0.01))
    model = copy.deepcopy(base)
    runners["sync"] = runner(model, torch.optim.SGD(model.parameters(), lr=0.01), True)
    if "hvd" in modes:
        model = copy.deepcopy(base)
        compression = hvd.Compression.fp16 if args.fp16_allreduce else hvd.Compression.none
        optimizer = hvd.DistributedOptimizer(
            torch.optim.SGD(model.parameters(), lr=0.01),
            named_parameters=model.named_parameters(),
            compression=compression,
            op=hvd.Average,
        )
        hvd.broadcast_parameters(model.state_dict(), root_rank=0)
        hvd.broadcast_optimizer_state(optimizer, root_rank=0)
        runners["hvd"] = runner(model, optimizer)
    if "ddp" in modes:
        # No buffer sync in forward: hvd's optimizer does not synchronize BatchNorm's
        # running statistics either, so both move the same bytes. torch >= 2.13
        # names it forward_sync_buffers (broadcast_buffers is deprecated there).
        device_ids = [args.device] if args.device.type == "cuda" else None
        ddp = nn.parallel.DistributedDataParallel
        no_sync = ("forward_sync_buffers" if "forward_sync_buffers"
                   in inspect.signature(ddp.__init__).parameters else "broadcast_buffers")
        model = ddp(copy.deepcopy(base), device_ids=device_ids, **{no_sync: False})
        if args.fp16_allreduce:
            from torch.distributed.algorithms.ddp_comm_hooks import default_hooks

            model.register_comm_hook(None, default_hooks.fp16_compress_hook)
        runners["ddp"] = runner(model, torch.optim.SGD(model.parameters(), lr=0.01))
    return runners


def timed(step, batches):
    """(wall, CPU) seconds for `batches` steps, started together on every rank.

    CPU is the process's, all threads (compute, hvd-torch's engine, Gloo's): on
    a shared machine the wall time moves with the neighbours' load, while the
    CPU time shows what the step itself costs.
    """
    if torch.cuda.is_initialized():
        torch.cuda.synchronize()  # GPU work is asynchronous: time what it did, not what was queued
    hvd.barrier()
    wall, cpu = time.perf_counter(), time.process_time()
    for _ in range(batches):
        step()
    if torch.cuda.is_initialized():
        torch.cuda.synchronize()
    return time.perf_counter() - wall, time.process_time() - cpu


def mean_ci(values):
    """Horovod's report: mean and 1.96 x the (population) standard deviation."""
    return statistics.fmean(values), 1.96 * statistics.pstdev(values)


def summarize(times, args, size):
    """times[rank][iter] = (wall, cpu) -> the report of one mode. Per rank: the total / size."""
    images, batches = args.batch_size * args.num_batches_per_iter, args.num_batches_per_iter
    per_rank = [[images / wall for wall, _ in rank_times] for rank_times in times]
    total, total_ci = mean_ci([sum(rates) for rates in zip(*per_rank)])
    step_ms, step_ms_ci = mean_ci(
        [1e3 * statistics.fmean(w for w, _ in ts) / batches for ts in zip(*times)]
    )
    cpu_ms = 1e3 * statistics.fmean(c for ts in times for _, c in ts) / batches
    return {
        "img_sec_per_rank": total / size,
        "img_sec_per_rank_ci": total_ci / size,
        "img_sec_total": total,
        "img_sec_total_ci": total_ci,
        "step_time_ms": step_ms,
        "step_time_ms_ci": step_ms_ci,
        "cpu_time_per_step_ms": cpu_ms,
        "img_sec_iters": per_rank,  # [rank][iter]
    }


def paired_ratios(a, b):
    """a's total img/sec / b's, iteration by iteration (each pair ran back to back)."""
    totals = [[sum(rates) for rates in zip(*r["img_sec_iters"])] for r in (a, b)]
    return [x / y for x, y in zip(*totals)]


def checksum(model):
    h = hashlib.sha256()
    for p in model.parameters():
        h.update(p.detach().cpu().contiguous().numpy().tobytes())
    return h.hexdigest()[:16]


def main():
    args = parse_args()
    hvd.init()
    # One compute thread per rank: this machine has 2 cores and runs 2 ranks, so
    # more threads would oversubscribe the cores (and the communication threads
    # of hvd-torch and Gloo need a share too). The local baseline uses the same.
    torch.set_num_threads(1)
    rank, size = hvd.rank(), hvd.size()
    log = print if rank == 0 else (lambda *a, **k: None)
    modes = ["hvd", "ddp"] if args.mode == "both" else [args.mode]
    backend = "gloo"
    if args.device == "cuda":
        torch.cuda.set_device(hvd.local_rank() % torch.cuda.device_count())
        if torch.cuda.device_count() >= hvd.local_size():
            backend = "nccl"  # NCCL refuses two ranks on one GPU
    args.device = torch.device(args.device, torch.cuda.current_device()) \
        if args.device == "cuda" else torch.device("cpu")
    if "ddp" in modes:
        ddp_process_group(backend)
    runners = make_runners(args, modes)
    n_params = sum(p.numel() for p in runners["local"][0].parameters())

    log(
        f"Model: ResNet-18 (32x32, 10 classes, {n_params / 1e6:.2f}M parameters), "
        f"batch size {args.batch_size} per rank, SGD lr 0.01"
    )
    log(
        f"Ranks: {size} on {os.cpu_count()} cores, {torch.get_num_threads()} thread per rank; "
        f"hvd-torch {hvd.__version__}, torch {torch.__version__}; "
        f"gradients in {'float16' if args.fp16_allreduce else 'float32'}"
    )
    log(
        "Modes: local (no communication: the 1-rank baseline), sync (local, then one "
        "4-byte allreduce: the bound for synchronous data parallelism), "
        + ", ".join(
            {"hvd": "hvd (DistributedOptimizer)", "ddp": "ddp (DistributedDataParallel, gloo)"}[m]
            for m in modes
        )
    )
    log(f"Running warmup: {args.num_warmup_batches} batch(es) per mode...")
    for name, (_, step) in runners.items():
        timed(step, args.num_warmup_batches)
    log(
        f"Running benchmark: {args.num_iters} iteration(s) of {args.num_batches_per_iter} "
        f"batch(es) per mode, interleaved..."
    )
    times = {name: [] for name in runners}
    images = args.batch_size * args.num_batches_per_iter
    # Rank 0's bar over the iterations (tqdm, if installed); the lines go above it.
    bar = progress(range(args.num_iters), disable=rank != 0, desc="benchmark", unit="iter")
    for it in bar:
        for name, (_, step) in runners.items():
            times[name].append(timed(step, args.num_batches_per_iter))
        if rank == 0:
            bar.write(
                f"Iter #{it}: "
                + "  ".join(f"{n} {images / t[-1][0]:.1f}" for n, t in times.items())
                + " img/sec per rank (rank 0)"
            )
    bar.close()

    # Every rank's timings and checksums to every rank (rank 0 reports).
    gathered = hvd.allgather_object(
        {"times": times, "sums": {n: checksum(m) for n, (m, _) in runners.items()}}
    )
    results = {n: summarize([g["times"][n] for g in gathered], args, size) for n in runners}
    local = results["local"]["img_sec_per_rank"]
    bound = results["sync"]["img_sec_total"]
    for name in ["sync"] + modes:
        results[name]["scaling_efficiency"] = results[name]["img_sec_total"] / (size * local)
    for name in modes:
        results[name]["of_sync_bound"] = results[name]["img_sec_total"] / bound
    ddp_title = f"DDP ({dist.get_backend()})" if "ddp" in modes else ""
    titles = {"local": "local (no communication)", "sync": "sync (no gradients sent: the bound)",
              "hvd": "hvd-torch", "ddp": ddp_title}
    for name, r in results.items():
        log(f"{titles[name]}:")
        log(f"  Img/sec per rank: {r['img_sec_per_rank']:.1f} +-{r['img_sec_per_rank_ci']:.1f}")
        log(
            f"  Total img/sec on {size} rank(s): "
            f"{r['img_sec_total']:.1f} +-{r['img_sec_total_ci']:.1f}"
        )
        log(
            f"  Step time: {r['step_time_ms']:.1f} +-{r['step_time_ms_ci']:.1f} ms "
            f"(CPU time per step: {r['cpu_time_per_step_ms']:.1f} ms)"
        )
        if name != "local":
            log(f"  Scaling efficiency: {100 * r['scaling_efficiency']:.1f}%")
        if name in modes:
            log(f"  Of the sync bound: {100 * r['of_sync_bound']:.1f}%")
    ratio, per_iter = None, None
    if len(modes) == 2:
        ratio = results["hvd"]["img_sec_total"] / results["ddp"]["img_sec_total"]
        per_iter = paired_ratios(results["hvd"], results["ddp"])
        log(
            f"Ratio hvd/ddp (total img/sec): {ratio:.3f} (> 1: hvd-torch faster); per "
            f"iteration: median {statistics.median(per_iter):.3f}, "
            f"range {min(per_iter):.3f}-{max(per_iter):.3f}"
        )

    status = 0
    checks = {}
    for name in modes:
        sums = [g["sums"][name] for g in gathered]
        checks[name] = len(set(sums)) == 1
        if not checks[name]:
            log(f"ERROR: {name} weights differ across ranks: {sums}", file=sys.stderr)
            status = 1
    if checks:
        log(f"Weights identical on all ranks: {', '.join(f'{n} {ok}' for n, ok in checks.items())}")
    max_diff = None
    if len(modes) == 2:
        hvd_model, ddp_model = runners["hvd"][0], runners["ddp"][0].module
        max_diff = max(
            (a - b).abs().max().item()
            for a, b in zip(hvd_model.parameters(), ddp_model.parameters())
        )
        log(f"Max |hvd - ddp| weight difference after the same steps: {max_diff:.2e}")

    if rank == 0:
        path = args.json or os.path.join(ROOT, "bench", "results", f"synthetic_{size}.json")
        report = {
            "benchmark": "synthetic_resnet18",
            "np": size,
            "host": platform.node(),
            "cpus": os.cpu_count(),
            "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
            "hvd_torch": hvd.__version__,
            "torch": torch.__version__,
            "settings": {
                "batch_size": args.batch_size,
                "num_warmup_batches": args.num_warmup_batches,
                "num_batches_per_iter": args.num_batches_per_iter,
                "num_iters": args.num_iters,
                "fp16_allreduce": args.fp16_allreduce,
                "torch_threads": torch.get_num_threads(),
                "parameters": n_params,
            },
            "results": results,
            "ratio_hvd_ddp": ratio,
            "ratio_hvd_ddp_per_iter": per_iter,
            "weights_identical": checks,
            "max_abs_diff_hvd_ddp": max_diff,
        }
        os.makedirs(os.path.dirname(path) or ".", exist_ok=True)
        with open(path, "w") as f:
            json.dump(report, f, indent=1)
        log(f"Results: {path}")
    if "ddp" in modes:
        dist.destroy_process_group()
    return status


if __name__ == "__main__":
    sys.exit(main())
