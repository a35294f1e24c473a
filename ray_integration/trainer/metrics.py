"""Batch metrics into epoch metrics (on a worker), and workers' epoch metrics
into the trainer's (on the driver), as Ray SGD computed them.

A batch result is a dict of numbers with a "num_samples" entry: the batch's
size, the weight of its metrics. On a worker, an epoch's metric is the
sample-weighted mean over its batches ("last_<key>" keeps the last batch's
value), plus "num_samples" and "batch_count". On the driver, each numeric
metric is the plain mean over workers, "num_samples"/"batch_count" are sums
and "epoch" is rank 0's; with equal shards (the distributed sampler pads
them) the mean over workers is the sample-weighted mean over the epoch.

Plain Python: no torch, no Ray.
"""

from __future__ import annotations

import numbers
from collections.abc import Sequence

__all__ = ["NUM_SAMPLES", "AverageMeter", "AverageMeterCollection", "reduce_worker_stats"]

NUM_SAMPLES = "num_samples"
# Counts: summed over workers rather than averaged.
_SUMMED = (NUM_SAMPLES, "batch_count")
# Equal on every worker, and an int: rank 0's.
_RANK_0 = ("epoch",)


class AverageMeter:
    """A running sample-weighted mean."""

    def __init__(self):
        self.val = 0.0
        self.sum = 0.0
        self.count = 0
        self.avg = 0.0

    def update(self, val, n: int = 1) -> None:
        self.val = val
        self.sum += val * n
        self.count += n
        self.avg = self.sum / self.count if self.count else 0.0


class AverageMeterCollection:
    """One AverageMeter per metric name, fed one batch result at a time."""

    def __init__(self):
        self._batch_count = 0
        self._num_samples = 0
        self._meters: dict[str, AverageMeter] = {}

    def update(self, metrics: dict, n: int = 1) -> None:
        """metrics: this batch's values (numbers); n: its number of samples."""
        self._batch_count += 1
        self._num_samples += n
        for key, value in metrics.items():
            if isinstance(value, numbers.Number) and not isinstance(value, bool):
                self._meters.setdefault(key, AverageMeter()).update(value, n=n)

    def summary(self) -> dict:
        stats = {"batch_count": self._batch_count, NUM_SAMPLES: self._num_samples}
        for key, meter in self._meters.items():
            stats[key] = meter.avg
            stats[f"last_{key}"] = meter.val
        return stats


def reduce_worker_stats(worker_stats: Sequence[dict]) -> dict:
    """The trainer's metrics from each worker's: counts summed, other numbers
    averaged over the workers that have them, anything else taken from rank 0."""
    if not worker_stats:
        return {}
    keys: list = []
    for stats in worker_stats:
        keys += [k for k in stats if k not in keys]
    out = {}
    for key in keys:
        values = [s[key] for s in worker_stats if key in s]
        numeric = all(isinstance(v, numbers.Number) and not isinstance(v, bool) for v in values)
        if not numeric or key in _RANK_0:
            out[key] = worker_stats[0].get(key, values[0])
        elif key in _SUMMED:
            out[key] = sum(values)
        else:
            out[key] = sum(values) / len(values)
    return out
