"""examples/digits_train.py with the model compiled by torch.jit.script first.

    hvdrun -np 2 python examples/digits_train_scripted.py --epochs 5

The optimizer is wrapped around the scripted module's parameters: they are the
eager module's Parameter objects, and autograd through the TorchScript graph
still ends in their gradient accumulators, so DistributedOptimizer's hooks
start each allreduce during backward exactly as in eager mode. Everything else
(sampler, warm-up, metric averaging, checkpoint and resume, the final weight
check) is digits_train.train(); the checkpoint has its own default path.
"""

import sys

import torch

from digits_train import parse_args, train


def main():
    args = parse_args(checkpoint="/tmp/digits_scripted_ckpt.pt", description=__doc__.split("\n")[0])
    return train(args, prepare_model=torch.jit.script)


if __name__ == "__main__":
    sys.exit(main())
