"""A plain DDP training run that knows nothing of hvd_torch: init_process_group("gloo")
with env:// (RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT from whoever started the
process), three steps of a small model, then the weights' digest and an all_reduce
of rank + 1 from every rank.  What a torchrun user's script does; the launcher tests
run it under hvdrun's modes, the Ray tests in RayExecutor workers.

    python tests/harness/plain_ddp.py [--hvd-init] [--backend NAME]

--hvd-init calls hvd.init() first, as an elastic worker must: that is where it
learns the round's rank and MASTER_ADDR/MASTER_PORT.  --backend (default gloo)
names the process group's backend: "hvd" without --hvd-init is the backend found
through torch's entry point, never imported here.  The module imports only torch.
"""

from __future__ import annotations

import hashlib
import json
import os
import sys

_ENV = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "GROUP_RANK", "GROUP_WORLD_SIZE",
        "MASTER_ADDR", "MASTER_PORT")  # fmt: skip


def train(steps: int = 3, backend: str = "gloo") -> dict:
    """One DDP run in this process; what it saw and ended with (JSON-able)."""
    import torch
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel as DDP

    env = {k: os.environ.get(k) for k in _ENV}
    hvd_imported_before = "hvd_torch" in sys.modules
    dist.init_process_group(backend)  # env://
    try:
        rank, size = dist.get_rank(), dist.get_world_size()
        torch.manual_seed(0)
        model = DDP(torch.nn.Linear(10, 2))
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        g = torch.Generator().manual_seed(rank)
        for _ in range(steps):
            opt.zero_grad()
            model(torch.randn(4, 10, generator=g)).pow(2).mean().backward()
            opt.step()
        w = torch.cat([p.detach().reshape(-1) for p in model.parameters()])
        digests = [None] * size
        dist.all_gather_object(digests, hashlib.sha256(w.numpy().tobytes()).hexdigest()[:16])
        total = torch.tensor([rank + 1.0])
        dist.all_reduce(total)
        used = str(dist.get_backend())
    finally:
        dist.destroy_process_group()
    return {"rank": rank, "size": size, "digests": digests, "sum": total.item(), "env": env,
            "backend": used, "weights": w.tolist(), "hvd_imported_before": hvd_imported_before,
            "hvd_imported": "hvd_torch" in sys.modules}  # fmt: skip


if __name__ == "__main__":
    if "--hvd-init" in sys.argv:
        import hvd_torch as hvd

        hvd.init()
    backend = sys.argv[sys.argv.index("--backend") + 1] if "--backend" in sys.argv else "gloo"
    print("plain_ddp " + json.dumps(train(backend=backend)), flush=True)
    if "hvd_torch" in sys.modules:
        sys.modules["hvd_torch"].shutdown()
    # DDP keeps the Gloo group, and its worker threads, alive past
    # destroy_process_group() (the threads outlive `del model` and gc.collect()), and
    # a Gloo worker that takes the GIL while the interpreter finalizes aborts the
    # process ("terminate called without an active exception", pytorch issue
    # 190489; once in our CI, on a rank that had printed its report).  The tests
    # check what the script saw and computed, not torch's exit: leave at once.
    sys.stderr.flush()
    os._exit(0)
