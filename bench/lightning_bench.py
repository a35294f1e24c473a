"""PyTorch Lightning's DDP on the "hvd" backend against DDP on gloo: training steps per second.

    python bench/lightning_bench.py -np 2                    (5 alternating repeats per backend)
    python bench/lightning_bench.py -np 3 --reps 3 --steps 100 --launcher hvdrun
    python bench/lightning_bench.py -np 2 --width 1024 --layers 3   (a gradient-heavy MLP)

examples/lightning_digits.py's model and Trainer (HvdStrategy, i.e. DDPStrategy, with
process_group_backend "hvd" or "gloo") fit the digits for --warmup + --steps steps,
without validation. A Lightning job owns its default process group, so every
repeat is a fresh job of N ranks, started by Lightning's own launcher (one process that
starts the others) or by hvdrun; the backends alternate (hvd, gloo, gloo, hvd, ...), so
a noisy neighbour slows both alike. A run's time is the slowest rank's, from the
start of the first timed step to the end of the last (a callback's clock, read on
every rank, max-reduced after fit); steps/s = steps / that time. Each run's final
weights are checked: every hvd run must match every gloo run within float rounding.

  gloo/hvd = gloo's step time / hvd's (= hvd steps/s / gloo steps/s): above 1, hvd is
  faster; the median over repeats of each backend, then the range of the repeats'
  paired ratios.

--width W --layers L replaces the example's 64-32-10 perceptron with 64-W-...-W-10
(L hidden layers of W): the gradient allreduce then weighs more in a step.
"""

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
EXAMPLES = os.path.join(ROOT, "examples")
BACKENDS = ("hvd", "gloo")
RTOL, ATOL = 1e-4, 1e-5  # weights after a few hundred steps, summed in different orders


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("-np", type=int, default=2, help="ranks")
    p.add_argument("--launcher", choices=("lightning", "hvdrun"), default="lightning",
                   help="who starts the ranks: Lightning's launcher (devices=N) or hvdrun -np N")
    p.add_argument("--reps", type=int, default=5, help="runs per backend, alternated")
    p.add_argument("--steps", type=int, default=1000, help="timed training steps per run")
    p.add_argument("--warmup", type=int, default=50, help="untimed steps before them")
    p.add_argument("--batch-size", type=int, default=32, help="per rank")
    p.add_argument("--width", type=int, default=0,
                   help="hidden width of an MLP instead of the example's model (0: the example's)")
    p.add_argument("--layers", type=int, default=2, help="hidden layers of the --width MLP")
    p.add_argument("--timeout", type=float, default=600, help="seconds per run")
    p.add_argument("--json", default=None,
                   help="results file (default bench/results/lightning_<np>.json)")
    p.add_argument("--worker", default=None, metavar="RESULT",
                   help="run as one job's rank; rank 0 writes RESULT.json and RESULT.pt")
    p.add_argument("--backend", choices=BACKENDS, default="hvd", help="the worker's backend")
    return p.parse_args(argv)


# ------------------------------------------------------------------ one run (ranks)


def worker(args):
    sys.path.insert(0, EXAMPLES)
    import lightning_digits as example
    import pytorch_lightning as pl
    import torch
    import torch.distributed as dist
    from torch import nn

    class Timer(pl.Callback):
        """perf_counter at the start of step --warmup and at the end of the last step."""

        def on_train_batch_start(self, trainer, module, batch, batch_idx):
            if trainer.global_step == args.warmup:
                self.start = time.perf_counter()

        def on_train_batch_end(self, trainer, module, outputs, batch, batch_idx):
            self.end = time.perf_counter()

    class WideModule(example.DigitsModule):
        def __init__(self, lr):
            super().__init__(lr)
            sizes = [64] + [args.width] * args.layers
            layers = [m for a, b in zip(sizes, sizes[1:]) for m in (nn.Linear(a, b), nn.ReLU())]
            self.net = nn.Sequential(*layers, nn.Linear(sizes[-1], 10))

    run = example.parse_args(["--backend", args.backend, "--devices", str(args.np),
                              "--num-nodes", "1", "--batch-size", str(args.batch_size),
                              "--lr", "0.01"])  # fmt: skip
    timer = Timer()
    pl.seed_everything(0, verbose=False)
    model = WideModule(run.lr) if args.width else example.DigitsModule(run.lr)
    trainer = example.make_trainer(run, [timer], max_epochs=-1,
                                   max_steps=args.warmup + args.steps, limit_val_batches=0,
                                   num_sanity_val_steps=0)
    trainer.fit(model, example.digits_loaders(run.batch_size)[0])
    elapsed = torch.tensor([timer.end - timer.start], dtype=torch.float64)
    dist.all_reduce(elapsed, op=dist.ReduceOp.MAX)
    if trainer.is_global_zero:
        weights = example.weights(model)
        torch.save(weights, args.worker + ".pt")
        with open(args.worker + ".json", "w") as f:
            json.dump(dict(backend=dist.get_backend(), ranks=trainer.world_size,
                           environment=type(trainer.strategy.cluster_environment).__name__,
                           parameters=weights.numel(), seconds=elapsed.item(),
                           steps_per_s=args.steps / elapsed.item()), f)
    # On hvd too: Lightning makes a Gloo group of its own (examples/lightning_digits.py).
    example.exit_now(0)  # gloo's threads may abort the interpreter's exit


# ------------------------------------------------------------------ the driver


def one_run(args, backend, result):
    """Starts one job of args.np ranks and waits for it (its whole session); rank 0's
    result, with its weights."""
    import torch

    script = [sys.executable, os.path.abspath(__file__), "--worker", result, "--backend", backend,
              *sys.argv[1:]]  # fmt: skip
    cmd = script if args.launcher == "lightning" else [
        sys.executable, "-m", "hvdrun", "-np", str(args.np), *script]
    env = dict(os.environ, OMP_NUM_THREADS="1",
               PYTHONPATH=os.pathsep.join([ROOT, os.environ.get("PYTHONPATH", "")]))
    proc = subprocess.Popen(cmd, env=env, cwd=ROOT, stdin=subprocess.DEVNULL,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            start_new_session=True)
    try:
        out, _ = proc.communicate(timeout=args.timeout)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, 9)
        out, _ = proc.communicate()
        raise SystemExit(f"{backend} run: no end within {args.timeout:g}s\n{out}") from None
    if proc.returncode != 0 or not os.path.exists(result + ".json"):
        raise SystemExit(f"{backend} run failed (exit {proc.returncode}):\n{out}")
    with open(result + ".json") as f:
        found = json.load(f)
    return found, torch.load(result + ".pt")


def main():
    args = parse_args()
    if args.worker:
        return worker(args)
    import pytorch_lightning as pl
    import torch

    import hvd_torch

    order = [BACKENDS if rep % 2 == 0 else BACKENDS[::-1] for rep in range(args.reps)]
    runs = {b: [] for b in BACKENDS}
    reference = None  # the first run's weights: every run must end near them
    model = (f"MLP 64-{'-'.join([str(args.width)] * args.layers)}-10" if args.width
             else "examples/lightning_digits.py's 64-32-10")
    print(f"# Lightning {pl.__version__} DDP, {model}, batch {args.batch_size} per rank, "
          f"{args.np} ranks ({args.launcher}'s launcher); {args.steps} timed steps after "
          f"{args.warmup}, {args.reps} alternating runs per backend", flush=True)
    print(f"# {'run':>4} {'backend':>8} {'steps/s':>9} {'seconds':>8}", flush=True)
    with tempfile.TemporaryDirectory(prefix="lightning_bench_") as tmp:
        for rep, backends in enumerate(order):
            for backend in backends:
                found, w = one_run(args, backend, os.path.join(tmp, f"{backend}{rep}"))
                if found["backend"] != backend or found["ranks"] != args.np:
                    raise SystemExit(f"asked for {backend} on {args.np} ranks, ran {found}")
                runs[backend].append(found)
                reference = w if reference is None else reference
                if not torch.allclose(w, reference, rtol=RTOL, atol=ATOL):
                    raise SystemExit(f"run {rep + 1} on {backend} trained other weights than "
                                     f"the first run on {order[0][0]}")
                print(f"  {rep + 1:>4} {backend:>8} {found['steps_per_s']:>9.1f} "
                      f"{found['seconds']:>8.3f}", flush=True)
    rate = {b: statistics.median(r["steps_per_s"] for r in runs[b]) for b in BACKENDS}
    paired = [h["steps_per_s"] / g["steps_per_s"] for h, g in zip(runs["hvd"], runs["gloo"])]
    ratio = rate["hvd"] / rate["gloo"]
    print(f"# median steps/s: hvd {rate['hvd']:.1f}, gloo {rate['gloo']:.1f}; gloo/hvd "
          f"(step time) {ratio:.2f} (runs {min(paired):.2f}-{max(paired):.2f}); "
          f"{runs['hvd'][0]['parameters']} parameters", flush=True)
    path = os.path.abspath(args.json or os.path.join(HERE, "results", f"lightning_{args.np}.json"))
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "w") as f:
        json.dump(dict(np=args.np, launcher=args.launcher, model=model, steps=args.steps,
                       warmup=args.warmup, batch_size=args.batch_size, reps=args.reps,
                       lightning=pl.__version__, torch=torch.__version__,
                       hvd_torch=hvd_torch.__version__, host=platform.node(),
                       date=time.strftime("%Y-%m-%d %H:%M:%S"), runs=runs,
                       steps_per_s=rate, ratio_gloo_hvd=ratio, ratio_min=min(paired),
                       ratio_max=max(paired)), f, indent=1)  # fmt: skip
    print(f"# results: {path}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
