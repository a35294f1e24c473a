"""Step time with and without the timeline, in the same processes, interleaved.

    hvdrun -np 2 python scripts/timeline_overhead.py [--rounds 15] [--steps 40]

Trains examples/digits_train.py's model (DigitsNet, 8 parameter tensors) with
hvd.DistributedOptimizer on one batch of digits per rank: a small model, so
communication is a large share of the step and any cost of recording shows.
Each round measures --steps steps with the timeline on (hvd.start_timeline) and
--steps with it off, in alternating order, so the machine's noise lands on both
alike. Rank 0 prints each round's ratio (on / off) and the median over rounds.
"""

import argparse
import os
import statistics
import sys
import tempfile
import time

import torch
import torch.nn.functional as F

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "examples"))

import hvd_torch as hvd  # noqa: E402
from digits_allreduce import DigitsNet, load_data  # noqa: E402


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--rounds", type=int, default=15)
    p.add_argument("--steps", type=int, default=40, help="per window")
    p.add_argument("--batch-size", type=int, default=32)
    args = p.parse_args()

    hvd.init()
    torch.set_num_threads(1)
    torch.manual_seed(0)
    model = DigitsNet()
    opt = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.01),
                                   named_parameters=model.named_parameters())
    (x, y), _ = load_data(0)
    x, y = x[:args.batch_size], y[:args.batch_size]
    path = os.path.join(tempfile.gettempdir(), f"hvd_timeline_overhead_{os.getpid()}.json")

    def window(traced):
        if traced:
            hvd.start_timeline(path)
        start = time.perf_counter()
        for _ in range(args.steps):
            opt.zero_grad()
            F.cross_entropy(model(x), y).backward()
            opt.step()
        elapsed = (time.perf_counter() - start) / args.steps
        if traced:
            hvd.stop_timeline()
        return elapsed

    window(False)  # warm-up: caches, response cache slots
    ratios = []
    for r in range(args.rounds):
        order = (True, False) if r % 2 == 0 else (False, True)
        times = {traced: window(traced) for traced in order}
        ratios.append(times[True] / times[False])
        if hvd.rank() == 0:
            print(f"round {r}: on {times[True] * 1e3:.3f} ms/step, off "
                  f"{times[False] * 1e3:.3f} ms/step, ratio {ratios[-1]:.4f}", flush=True)
    if hvd.rank() == 0:
        events = os.path.getsize(path)
        print(f"median ratio on/off over {args.rounds} rounds of {args.steps} steps: "
              f"{statistics.median(ratios):.4f} (last timeline file {events} bytes)")
        os.remove(path)
    hvd.shutdown()


if __name__ == "__main__":
    main()
