"""Elastic training: keep the training state in memory, and go on when workers fail,
leave or join (Horovod's hvd.elastic).  docs/elastic.md describes the protocol.

    @hvd.elastic.run
    def train(state):
        for state.epoch in range(state.epoch, epochs):
            ...
            state.commit()

    train(hvd.elastic.TorchState(model, optimizer, epoch=0))

Run under `hvdrun --min-np/--max-np/--host-discovery-script`; elsewhere the same code
runs as a plain job (a failure then ends it).
"""

from hvd_torch.exceptions import HorovodInternalError, HostsUpdatedInterrupt

from .run_loop import run
from .sampler import ElasticSampler
from .state import ObjectState, State, TorchState

__all__ = [
    "ElasticSampler",
    "HorovodInternalError",
    "HostsUpdatedInterrupt",
    "ObjectState",
    "State",
    "TorchState",
    "run",
]
