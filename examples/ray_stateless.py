"""Horovod's stateless Ray flow on hvd-torch: start workers, run a function on all.

    python examples/ray_stateless.py                      (a local Ray, 2 workers)
    python examples/ray_stateless.py --num-workers 3
    python examples/ray_stateless.py --address auto       (an existing cluster)

The part between the markers is Horovod's documented RayExecutor example with
only the imports changed. run() sends simple_fn to every worker at once; each
worker's hvd.init() meets the others through the store the driver serves.
"""

import argparse
import os

import ray

import hvd_torch as hvd
from ray_integration import RayExecutor


def parse_args():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--num-workers", type=int, default=2)
    p.add_argument("--use-gpu", action="store_true")
    p.add_argument("--address", default=None, help="a running cluster, e.g. auto")
    return p.parse_args()


args = parse_args()
if args.address:
    ray.init(address=args.address)
else:
    # Logical CPUs: a laptop with 2 cores can still try 3 or 4 workers.
    ray.init(address="local", num_cpus=max(os.cpu_count() or 1, args.num_workers),
             include_dashboard=False)

# ---- Horovod's example, unchanged apart from the imports
num_workers = args.num_workers
settings = RayExecutor.create_settings(timeout_s=30)
executor = RayExecutor(settings, num_workers=num_workers, use_gpu=args.use_gpu)

# This will launch `num_workers` actors on the Ray Cluster.
executor.start()


# Using the stateless `run` method, a function can take in any args or kwargs
def simple_fn():
    hvd.init()
    print("hvd rank", hvd.rank())
    return hvd.rank()


# Execute the function on all workers at once
result = executor.run(simple_fn)
# Check that the rank of all workers is unique
assert len(set(result)) == num_workers

executor.shutdown()
# ---- end of Horovod's example

print(f"ranks {sorted(result)} from {num_workers} workers")
