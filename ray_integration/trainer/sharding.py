"""A DataLoader re-made with a DistributedSampler: each rank its shard.

The trainer re-makes the user's loaders at every epoch with the current
hvd.rank()/hvd.size() (an elastic job's size changes between rounds) and
calls set_epoch(epoch), so every epoch is a new shuffle, the same on every
rank. A loader that shuffled (RandomSampler) gets a shuffling sampler; one
that read in order keeps the order (validation). Like torch's
DistributedSampler, shards are padded to equal length by repeating a few
samples (at most size - 1), so every rank runs the same number of steps.
"""

from __future__ import annotations

from torch.utils.data import DataLoader, IterableDataset, RandomSampler
from torch.utils.data.distributed import DistributedSampler

__all__ = ["shard_loader"]

# The DataLoader arguments a re-made loader keeps.
_KEPT = (
    "batch_size", "num_workers", "collate_fn", "pin_memory", "drop_last", "timeout",
    "worker_init_fn", "multiprocessing_context", "generator", "prefetch_factor",
    "persistent_workers",
)  # fmt: skip


def shard_loader(loader, rank: int, size: int, epoch: int, seed: int = 0):
    """loader with a DistributedSampler for rank of size, at epoch; loaders
    that cannot be re-sampled (an IterableDataset, a custom batch_sampler, or
    anything that is not a DataLoader) are returned as they are: their
    sharding is the user's."""
    if not isinstance(loader, DataLoader) or isinstance(loader.dataset, IterableDataset):
        return loader
    if loader.batch_size is None:  # a batch_sampler of the user's
        return loader
    sampler = DistributedSampler(
        loader.dataset,
        num_replicas=size,
        rank=rank,
        shuffle=isinstance(loader.sampler, RandomSampler),
        seed=seed,
    )
    sampler.set_epoch(epoch)
    kwargs = {k: getattr(loader, k) for k in _KEPT if hasattr(loader, k)}
    if not kwargs.get("num_workers"):
        # DataLoader refuses these without worker processes.
        kwargs.pop("prefetch_factor", None)
        kwargs.pop("persistent_workers", None)
    return DataLoader(loader.dataset, sampler=sampler, **kwargs)
