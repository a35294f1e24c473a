"""The trainer tests' tiny problem and model (64 training and 32 validation
samples of 8 features, 3 classes; a two-layer MLP), and the training they
must equal, written by hand with hvd-torch.

No Ray here: the reference runs on the warm rank pool (run_ranks), where two
Ray worker actors cost seconds of CPU each to start.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.data import DataLoader, TensorDataset
from torch.utils.data.distributed import DistributedSampler

FEATURES, CLASSES = 8, 3


def make_data(n: int = 64, seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(n, FEATURES, generator=g)
    w = torch.randn(FEATURES, CLASSES, generator=torch.Generator().manual_seed(100))
    return x, (x @ w).argmax(1)


def make_model(seed: int) -> nn.Module:
    torch.manual_seed(seed)
    return nn.Sequential(nn.Linear(FEATURES, 16), nn.ReLU(), nn.Linear(16, CLASSES))


def hand_loop(config, epochs):
    """MLPOperator's training written by hand, as Horovod's examples do: per-rank
    seeds fixed by broadcasts, DistributedSampler re-seeded per epoch,
    DistributedOptimizer, StepLR per epoch; each epoch's loss is the rank's
    sample-weighted mean, averaged over ranks. Returns (weights, losses)."""
    import hvd_torch as hvd

    torch.set_num_threads(1)  # as a Ray worker of one CPU (OMP_NUM_THREADS=1)
    hvd.init()
    model = make_model(config["seed"] + hvd.rank())
    optimizer = torch.optim.SGD(model.parameters(), lr=config["lr"], momentum=config["momentum"])
    optimizer = hvd.DistributedOptimizer(optimizer, named_parameters=model.named_parameters())
    # On the wrapped optimizer, whose param groups the broadcast below replaces.
    scheduler = torch.optim.lr_scheduler.StepLR(optimizer, step_size=1, gamma=config["gamma"])
    hvd.broadcast_parameters(model.state_dict(), root_rank=0)
    hvd.broadcast_optimizer_state(optimizer, root_rank=0)
    dataset = TensorDataset(*make_data())
    sampler = DistributedSampler(dataset, num_replicas=hvd.size(), rank=hvd.rank(), seed=0)
    loader = DataLoader(dataset, batch_size=8, sampler=sampler)
    losses = []
    for epoch in range(epochs):
        sampler.set_epoch(epoch)
        total = samples = 0
        for x, y in loader:
            loss = F.cross_entropy(model(x), y)
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            total += loss.item() * len(y)
            samples += len(y)
        scheduler.step()
        losses.append(hvd.metric_average(total / samples, name=f"loss.{epoch}"))
    return {k: v.clone() for k, v in model.state_dict().items()}, losses


def hand_reference(config, epochs):
    """(weights, per-epoch losses) of hand_loop on 2 ranks; both ranks end equal."""
    from dist_harness import run_ranks

    results = run_ranks(hand_loop, 2, args=(config, epochs), timeout=120)
    weights = results[0][0]
    assert all(w[k].equal(weights[k]) for w, _ in results for k in weights)
    return results[0]
