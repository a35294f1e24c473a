"""DistributedOptimizer(op=hvd.Adasum): Adasum of each rank's update, not of
its gradient (Horovod's delta optimizer).

Each rank steps the wrapped optimizer on its own gradients, from the same
weights; the change each step made to a parameter (the delta) is combined over
ranks with Adasum (hvd_torch/adasum.py), and every rank sets the parameter to
its start plus that combined delta. So the optimizer's own arithmetic (Adam's
moments, momentum, weight decay) applies to local gradients, and Adasum decides
how much of each rank's step to keep. The optimizer state stays local, as in
Horovod; the weights stay identical on every rank.

Horovod steps each parameter from its gradient hook to overlap backward; here
step() steps them all and then reduces every parameter's delta in one call
(each its own Adasum, all through one set of collectives). For optimizers that
update each parameter on its own (SGD, Adam, ...) the numbers are the same.

step() is the only reduction point, so gradients of several backward passes
(backward_passes_per_step) are summed by PyTorch before it, as Horovod's
delay does; groups and sparse_as_dense change nothing here (Horovod's Adasum
optimizer ignores them too).
"""

import torch

from hvd_torch import adasum
from hvd_torch.compression import Compression
from hvd_torch.optimizer_wrapping import adopt, require_init_for

_NO_SKIP = ("Skipping synchronization is not supported when using Adasum optimizer: "
            "the update, not the gradient, is reduced, in step()")


class _AdasumOptimizer:
    """In front of the wrapped optimizer's class in the MRO, as
    optimizer._DistributedOptimizer is, so super().step() is the original."""

    def _hvd_adasum_init(self, parameter_names, compression, backward_passes_per_step,
                         process_set):
        self._parameter_names = parameter_names
        self._compression = compression
        self.backward_passes_per_step = backward_passes_per_step
        self.process_set = process_set

    def synchronize(self):
        """Nothing to wait for: the deltas are reduced inside step()."""

    def skip_synchronize(self):
        """Refused, as in Horovod: there is no gradient reduction to skip."""
        raise AssertionError(_NO_SKIP)

    def step(self, closure=None):
        require_init_for("step")  # membership, and the deltas' reduction, need init()
        loss = closure() if closure is not None else None
        if not self.process_set.included():
            super().step()  # outside the set: trains on its own, as in Horovod
            return loss
        params = [p for group in self.param_groups for p in group["params"] if p.requires_grad]
        if not params:
            super().step()
            return loss
        with torch.no_grad():
            start = [p.detach().clone() for p in params]
            super().step()
            # Each p holds its delta until set below; one Adasum call for all of
            # them (each its own tree, one set of collectives).
            compressed = [self._compression.compress(p.sub_(begin))
                          for p, begin in zip(params, start)]
            name = f"allreduce.{self._parameter_names.get(params[0], 'adasum')}.adasum_step"
            combined = adasum.reduce_many([c for c, _ in compressed], name, 1.0, 1.0,
                                          self.process_set)
            for p, begin, delta, (_, ctx) in zip(params, start, combined, compressed):
                p.copy_(begin.add_(self._compression.decompress(delta, ctx)))
        return loss


def wrap(optimizer, parameter_names, compression=Compression.none, backward_passes_per_step=1,
         process_set=None):
    """An Adasum-wrapped optimizer sharing `optimizer`'s param_groups, defaults
    and state (see optimizer.DistributedOptimizer, which checks the arguments)."""
    wrapped = adopt(_AdasumOptimizer, optimizer, __name__)
    wrapped._hvd_adasum_init(parameter_names, compression, backward_passes_per_step, process_set)
    return wrapped
