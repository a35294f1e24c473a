"""GPU benchmarks, hvd-torch against torch.distributed in the same run (needs a CUDA GPU).

    python bench/gpu_bench.py                 # every part, results in bench/results/gpu.json
    python bench/gpu_bench.py --part nccl     # or staged, cast, resnet

Parts (the targets are issue #10's; ratios, not absolute times, are the point):
  nccl    1 rank, CUDA float32 allreduce 4 B..256 MiB through NCCL: hvd.allreduce_
          vs dist.all_reduce on a 1-rank NCCL group. Time per op in a stream of
          ops (synchronised once at the end) and alone (synchronised every op).
          Goal: hvd within 10 % at >= 1 MiB, under 30 us per small op.
  staged  2 ranks sharing the GPU, CUDA float32 allreduce 1 MiB..256 MiB through
          hvd's host-staged Gloo plane vs torch.distributed gloo on the same CUDA
          tensors; busbw = algbw * 2(n-1)/n. Goal: hvd >= 1.2x torch's busbw.
  cast    the fp16 compression cast (float32 -> float16 into a preallocated
          tensor) against a float32 device copy of the same tensor, GB/s counting
          bytes read and written. Goal: cast >= 80 % of the copy.
  resnet  ResNet-50 (torchvision; 224x224, batch 64, SGD) on 1 GPU, with
          hvd.DistributedOptimizer vs the bare optimizer, img/s. Goal: <= 3 % slower.

ratio = torch time / hvd time (above 1: hvd-torch is faster); for cast,
cast GB/s / copy GB/s; for resnet, hvd img/s / bare img/s.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import socket
import statistics
import subprocess
import sys
import time

import torch

HERE = os.path.dirname(os.path.abspath(__file__))
MiB = 1 << 20


def _free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _sizes(lo, hi):
    out, n = [], lo
    while n <= hi:
        out.append(n)
        n *= 4
    return out


def _time_ops(fn, iters, sync_each):
    torch.cuda.synchronize()
    start = time.perf_counter()
    for _ in range(iters):
        fn()
        if sync_each:
            torch.cuda.synchronize()
    torch.cuda.synchronize()
    return (time.perf_counter() - start) / iters


def _pairs(hvd_fn, torch_fn, iters, reps, sync_each):
    """Median time per op of each, their timed sets interleaved."""
    h, t = [], []
    for _ in range(reps):
        h.append(_time_ops(hvd_fn, iters, sync_each))
        t.append(_time_ops(torch_fn, iters, sync_each))
    return statistics.median(h), statistics.median(t)


def part_nccl(args):
    import torch.distributed as dist

    import hvd_torch as hvd
    from hvd_torch import gpu

    os.environ.setdefault("HOROVOD_GPU_OPERATIONS", "NCCL")
    hvd.init()
    assert gpu.plane() == "nccl", gpu.plane()
    dist.init_process_group("nccl", init_method=f"tcp://127.0.0.1:{_free_port()}", rank=0,
                            world_size=1, device_id=torch.device("cuda", 0))
    rows = []
    for nbytes in _sizes(4, 256 * MiB):
        x = torch.ones(max(1, nbytes // 4), device="cuda")
        iters = max(20, min(args.iters, (1 << 30) // max(nbytes, 1)))
        for sync_each in (False, True):
            hvd_fn = lambda: hvd.allreduce_(x, name=f"b.{nbytes}", op=hvd.Sum)  # noqa: E731
            torch_fn = lambda: dist.all_reduce(x)  # noqa: E731
            for _ in range(3):
                hvd_fn(), torch_fn()
            h, t = _pairs(hvd_fn, torch_fn, iters, args.reps, sync_each)
            rows.append(dict(bytes=nbytes, mode="each" if sync_each else "stream",
                             hvd_us=h * 1e6, torch_us=t * 1e6, ratio=t / h))
        assert torch.all(x == 1).item()  # 1 rank: Sum leaves ones
    dist.destroy_process_group()
    hvd.shutdown()
    print(f"{'bytes':>10} {'mode':>6} {'hvd us':>10} {'torch us':>10} {'ratio':>7}")
    for r in rows:
        print(f"{r['bytes']:>10} {r['mode']:>6} {r['hvd_us']:>10.1f} {r['torch_us']:>10.1f} "
              f"{r['ratio']:>7.2f}")
    return rows


def _staged_worker(args):
    import torch.distributed as dist

    import hvd_torch as hvd
    from hvd_torch import gpu

    hvd.init()
    torch.cuda.set_device(0)
    assert gpu.plane() == "gloo", gpu.plane()
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{os.environ['BENCH_PORT']}",
                            rank=hvd.rank(), world_size=hvd.size())
    n = hvd.size()
    rows = []
    for nbytes in _sizes(MiB, 256 * MiB):
        x = torch.ones(nbytes // 4, device="cuda")
        iters = max(3, min(args.iters, (1 << 30) // nbytes))
        hvd_fn = lambda: hvd.allreduce_(x, name=f"s.{nbytes}", op=hvd.Average)  # noqa: E731

        def torch_fn():
            dist.all_reduce(x)
            x.div_(n)

        hvd_fn(), torch_fn()
        h, t = _pairs(hvd_fn, torch_fn, iters, args.reps, sync_each=False)
        bus = lambda s: nbytes / s * 2 * (n - 1) / n / 1e9  # noqa: E731
        rows.append(dict(bytes=nbytes, hvd_us=h * 1e6, torch_us=t * 1e6, hvd_busbw=bus(h),
                         torch_busbw=bus(t), ratio=t / h))
        assert torch.all(x == 1).item()
    dist.destroy_process_group()
    hvd.shutdown()
    if hvd_rank_is_zero():
        print(json.dumps(rows))


def hvd_rank_is_zero():
    return os.environ.get("HOROVOD_RANK", "0") == "0"


def part_staged(args):
    env = dict(os.environ, BENCH_PORT=str(_free_port()), HOROVOD_GPU_OPERATIONS="GLOO")
    cmd = [sys.executable, "-m", "hvdrun", "-np", "2", sys.executable,
           os.path.abspath(__file__), "--staged-worker", "--iters", str(args.iters),
           "--reps", str(args.reps)]
    run = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=1200, check=False)
    lines = [ln.split(":", 1)[1] for ln in run.stdout.splitlines()
             if ln.startswith("[0]<stdout>:") and ln.split(":", 1)[1].startswith("[")]
    if run.returncode != 0 or not lines:
        raise SystemExit(f"staged part failed ({run.returncode}):\n{run.stdout}\n{run.stderr}")
    rows = json.loads(lines[-1])
    print(f"{'bytes':>10} {'hvd us':>10} {'torch us':>10} {'hvd busbw':>10} {'torch busbw':>11} "
          f"{'ratio':>7}")
    for r in rows:
        print(f"{r['bytes']:>10} {r['hvd_us']:>10.0f} {r['torch_us']:>10.0f} "
              f"{r['hvd_busbw']:>10.2f} {r['torch_busbw']:>11.2f} {r['ratio']:>7.2f}")
    return rows


def part_cast(args):
    src = torch.randn(64 * MiB, device="cuda")  # 256 MiB of float32
    half = torch.empty_like(src, dtype=torch.float16)
    copy = torch.empty_like(src)
    cast_s = statistics.median(_time_ops(lambda: half.copy_(src), 50, False)
                               for _ in range(args.reps))
    copy_s = statistics.median(_time_ops(lambda: copy.copy_(src), 50, False)
                               for _ in range(args.reps))
    cast_gbs = src.numel() * (4 + 2) / cast_s / 1e9
    copy_gbs = src.numel() * (4 + 4) / copy_s / 1e9
    row = dict(cast_gbs=cast_gbs, copy_gbs=copy_gbs, ratio=cast_gbs / copy_gbs)
    print(f"fp16 cast {cast_gbs:.0f} GB/s, float32 copy {copy_gbs:.0f} GB/s, "
          f"ratio {row['ratio']:.2f}")
    return [row]


def part_resnet(args):
    import torchvision

    import hvd_torch as hvd

    os.environ.setdefault("HOROVOD_GPU_OPERATIONS", "NCCL")
    hvd.init()
    torch.manual_seed(0)
    # Two models: DistributedOptimizer hooks its parameters' gradients.
    bare_model = torchvision.models.resnet50().cuda()
    hvd_model = torchvision.models.resnet50().cuda()
    data = torch.randn(64, 3, 224, 224, device="cuda")
    target = torch.randint(0, 1000, (64,), device="cuda")
    bare = torch.optim.SGD(bare_model.parameters(), lr=0.01)
    wrapped = hvd.DistributedOptimizer(torch.optim.SGD(hvd_model.parameters(), lr=0.01),
                                       named_parameters=hvd_model.named_parameters())

    def step(model, opt):
        opt.zero_grad()
        torch.nn.functional.cross_entropy(model(data), target).backward()
        opt.step()

    def img_per_sec(model, opt, iters=20):
        for _ in range(5):
            step(model, opt)
        return 64 / _time_ops(lambda: step(model, opt), iters, False)

    bare_ips, hvd_ips = [], []
    for _ in range(args.reps):
        bare_ips.append(img_per_sec(bare_model, bare))
        hvd_ips.append(img_per_sec(hvd_model, wrapped))
    hvd.shutdown()
    row = dict(bare_img_s=statistics.median(bare_ips), hvd_img_s=statistics.median(hvd_ips))
    row["ratio"] = row["hvd_img_s"] / row["bare_img_s"]
    print(f"ResNet-50 batch 64: bare {row['bare_img_s']:.0f} img/s, DistributedOptimizer "
          f"{row['hvd_img_s']:.0f} img/s, ratio {row['ratio']:.3f}")
    return [row]


PARTS = {"nccl": part_nccl, "staged": part_staged, "cast": part_cast, "resnet": part_resnet}


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--part", choices=["all", *PARTS], default="all")
    p.add_argument("--iters", type=int, default=200)
    p.add_argument("--reps", type=int, default=5)
    p.add_argument("--json", default=os.path.join(HERE, "results", "gpu.json"))
    p.add_argument("--staged-worker", action="store_true", help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.staged_worker:
        return _staged_worker(args)
    if not torch.cuda.is_available():
        raise SystemExit("gpu_bench: no CUDA GPU here")
    results = {"date": datetime.datetime.now().isoformat(timespec="seconds"),
               "device": torch.cuda.get_device_name(0), "torch": torch.__version__}
    os.makedirs(os.path.dirname(args.json), exist_ok=True)
    failed = []
    for name in (PARTS if args.part == "all" else [args.part]):
        print(f"== {name}", flush=True)
        # A GPU session is short: one part that fails must not lose the others.
        try:
            results[name] = PARTS[name](args)
        except (Exception, SystemExit) as e:  # noqa: BLE001
            failed.append(name)
            results[name] = {"error": f"{type(e).__name__}: {e}"}
            print(f"{name} failed: {type(e).__name__}: {e}", flush=True)
        with open(args.json, "w") as f:  # after every part: a run cut short keeps what ran
            json.dump(results, f, indent=1)
    print(f"wrote {args.json}")
    if failed:
        raise SystemExit(f"gpu_bench: {', '.join(failed)} failed")


if __name__ == "__main__":
    main()
