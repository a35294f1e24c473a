r"""A Hugging Face Accelerate training script on the "hvd" torch.distributed backend, on CPU.

    accelerate launch --multi_gpu --num_processes 2 --main_process_port 0 \
        examples/accelerate_digits.py
    torchrun --nproc-per-node 2 examples/accelerate_digits.py
    hvdrun -np 2 python examples/accelerate_digits.py
    ... examples/accelerate_digits.py --backend gloo    (Accelerate's own CPU backend, to compare)

The one hvd-specific line makes the Accelerator: hvd_torch.integrations.accelerate
creates the default process group on "hvd" and lets Accelerate adopt it (Accelerate
itself maps every CPU job to gloo). Everything else is a plain Accelerate script: a
small MLP on scikit-learn's digits (shipped inside scikit-learn), the DataLoader
sharded by accelerator.prepare, gradients averaged by DDP, the loss gathered.
`accelerate launch --multi_gpu` is Accelerate's way to start N processes on one
machine through torch.distributed.run; on a machine without GPUs the processes run on
the CPU (Accelerate's own `--cpu` starts one process, or N through mpirun).

With --out DIR every rank saves its start and end weights, its losses and the group's
backend to DIR/rank<r>.pt; rank 0 prints the last gathered loss.
"""

import argparse
import os

import torch
import torch.distributed as dist
import torch.nn.functional as F
from accelerate import Accelerator
from ddp_on_hvd import exit_now
from digits_data import load_digits
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from hvd_torch.integrations.accelerate import accelerator as hvd_accelerator


def parse_args():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--backend", default="hvd", choices=["hvd", "gloo"])
    p.add_argument("--steps", type=int, default=8, help="optimizer steps")
    p.add_argument("--batch-size", type=int, default=16, help="per process")
    p.add_argument("--lr", type=float, default=0.1)
    p.add_argument("--out", help="folder for each rank's rank<r>.pt")
    return p.parse_args()


def group_backend() -> str:
    """The process group's backend; a plain `python` run has none (one process)."""
    return dist.get_backend() if dist.is_initialized() else "none"


def weights(model) -> torch.Tensor:
    return torch.cat([p.detach().reshape(-1).clone() for p in model.parameters()])


def main(args):
    acc = hvd_accelerator() if args.backend == "hvd" else Accelerator(cpu=True)
    torch.manual_seed(0)  # the same start on every rank (DDP broadcasts rank 0's anyway)
    model = nn.Sequential(nn.Linear(64, 32), nn.ReLU(), nn.Linear(32, 10))
    start = weights(model)
    digits = load_digits()
    data = TensorDataset(torch.tensor(digits.data, dtype=torch.float32) / 16.0,
                         torch.tensor(digits.target))
    loader = DataLoader(data, batch_size=args.batch_size, shuffle=False)
    opt = torch.optim.SGD(model.parameters(), lr=args.lr, momentum=0.9)
    model, opt, loader = acc.prepare(model, opt, loader)

    losses = []
    for step, (x, y) in zip(range(args.steps), loader):
        loss = F.cross_entropy(model(x), y)
        opt.zero_grad()
        acc.backward(loss)
        opt.step()
        losses.append(acc.gather(loss.detach()).mean().item())  # the mean over ranks
    acc.print(f"step {len(losses)}/{args.steps}  loss {losses[-1]:.4f}  "
              f"(backend {group_backend()}, {acc.num_processes} processes)")
    if args.out:
        os.makedirs(args.out, exist_ok=True)
        torch.save({"rank": acc.process_index, "size": acc.num_processes,
                    "backend": group_backend(), "accelerate_backend": acc.state.backend,
                    "start": start, "end": weights(acc.unwrap_model(model)), "losses": losses},
                   os.path.join(args.out, f"rank{acc.process_index}.pt"))
    acc.wait_for_everyone()
    acc.end_training()  # destroys the process group


if __name__ == "__main__":
    ARGS = parse_args()
    main(ARGS)
    if ARGS.backend == "gloo":
        exit_now(0)  # torch's gloo threads outlive DDP's group at exit (see ddp_on_hvd.py)
