"""ElasticSampler: shards a dataset over the current workers and remembers which
samples of the epoch were already trained on, so that after a reset the new set of
workers shares out only the rest.

Horovod's class and semantics, with one deliberate difference: set_epoch() with the
epoch the sampler is already in does nothing.  Horovod's clears the processed
samples, so the natural loop

    for state.epoch in range(state.epoch, epochs):
        state.sampler.set_epoch(state.epoch)
        ...

would, after a mid-epoch reset, train the whole epoch again.

Progress is kept twice.  processed_indices (ours) holds the samples themselves:
a reset re-shards exactly the ones not yet trained on, whichever worker trained
the others.  processed_num (Horovod 0.28.1's public counter) is the number of
samples of this epoch all workers together have processed, counted as Horovod
counts them: each record_batch(batch_idx, batch_size) adds batch_size times the
number of workers (so the padding of a last short batch counts too).  Both are in
state_dict(), come back with state.restore(), and start from zero at a new epoch.
"""

from __future__ import annotations

import math

import torch

from hvd_torch.basics import rank, size

__all__ = ["ElasticSampler", "shard"]


def shard(remaining, epoch: int, seed: int, shuffle: bool, rank_: int, num_replicas: int):
    """The indices one replica iterates this epoch: the remaining indices, shuffled
    by (seed + epoch) when asked, padded by repetition to a multiple of num_replicas
    (as DistributedSampler does, so every replica runs the same number of steps),
    then every num_replicas-th from rank_."""
    order = list(remaining)
    if shuffle and order:
        g = torch.Generator()
        g.manual_seed(seed + epoch)
        order = [order[i] for i in torch.randperm(len(order), generator=g).tolist()]
    total = math.ceil(len(order) / num_replicas) * num_replicas
    while order and len(order) < total:
        order += order[: total - len(order)]
    return order[rank_:total:num_replicas]


class ElasticSampler(torch.utils.data.Sampler):
    """Sampler for elastic training: pass it to the DataLoader and to TorchState.

        sampler = hvd.elastic.ElasticSampler(dataset)
        loader = DataLoader(dataset, batch_size=B, sampler=sampler)
        state = hvd.elastic.TorchState(model, optimizer, sampler=sampler, epoch=0)
        ...
        for i, batch in enumerate(loader):
            ...
            state.sampler.record_batch(i, B)

    The shard is fixed from one reset() to the next: record_batch() only marks
    samples as processed.  TorchState unions the marks of every worker at each
    commit, and re-shards (reset()) after every membership change.  Needs hvd.init()
    first: the shard depends on rank() and size().
    """

    def __init__(self, dataset, shuffle: bool = True, seed: int = 0):
        self.dataset = dataset
        self.shuffle = shuffle
        self.seed = seed
        self.epoch = 0
        self.processed_indices: set[int] = set()
        self.processed_num = 0
        self.num_replicas = 1
        self.rank = 0
        self.remaining_indices: list[int] = []
        self.indices: list[int] = []
        self.num_samples = 0
        self.total_size = 0
        self.reset()

    def set_epoch(self, epoch: int) -> None:
        """Starts epoch `epoch` with nothing processed; no-op if already in it."""
        if epoch == self.epoch:
            return
        self.epoch = epoch
        self.processed_indices = set()
        self.processed_num = 0
        self.reset()

    def record_batch(self, batch_idx: int, batch_size: int) -> None:
        """Marks this replica's batch batch_idx (of batch_size samples) as processed,
        and counts batch_size samples for every replica in processed_num (Horovod's
        count: the replicas step together)."""
        self.record_indices(self.get_indices(batch_idx, batch_size))
        self.processed_num += batch_size * self.num_replicas

    def record_indices(self, indices) -> None:
        self.processed_indices.update(int(i) for i in indices)

    def get_indices(self, batch_idx: int, batch_size: int) -> list[int]:
        start = batch_idx * batch_size
        return self.indices[start : start + batch_size]

    def state_dict(self) -> dict:
        return {
            "epoch": self.epoch,
            "processed_indices": set(self.processed_indices),
            "processed_num": self.processed_num,
        }

    def load_state_dict(self, state_dict: dict) -> None:
        """Takes our state_dict(), or Horovod's ({"epoch", "processed_num"}, e.g.
        from a checkpoint): without processed_indices, the first processed_num
        samples of the epoch's order count as processed, which is what the
        replicas stepping together through a fresh epoch process first."""
        self.epoch = state_dict["epoch"]
        if "processed_indices" in state_dict:
            self.processed_indices = set(state_dict["processed_indices"])
            # A state_dict from before processed_num existed: the distinct count.
            self.processed_num = state_dict.get("processed_num", len(self.processed_indices))
        else:
            self.processed_num = state_dict["processed_num"]
            order = shard(range(len(self.dataset)), self.epoch, self.seed, self.shuffle, 0, 1)
            self.processed_indices = set(order[: self.processed_num])
        self.reset()

    def reset(self) -> None:
        """Re-shards what is left of the epoch over the current rank() and size()."""
        self.num_replicas = size()
        self.rank = rank()
        self.remaining_indices = [
            i for i in range(len(self.dataset)) if i not in self.processed_indices
        ]
        self.indices = shard(
            self.remaining_indices,
            self.epoch,
            self.seed,
            self.shuffle,
            self.rank,
            self.num_replicas,
        )
        self.num_samples = len(self.indices)
        self.total_size = self.num_samples * self.num_replicas

    def __iter__(self):
        return iter(list(self.indices))

    def __len__(self) -> int:
        return self.num_samples
