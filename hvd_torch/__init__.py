"""hvd-torch: Horovod-compatible data-parallel training for PyTorch.

Switch from Horovod with one line: `import hvd_torch as hvd`.
"""

# Before anything loads _C: an extension built for another torch is an ImportError
# that names the versions, not an `undefined symbol` (build_record.py). The
# doctor, which explains a stale build, runs instead when it is the program.
from hvd_torch import build_record as _build_record

_stale, _stale_message = _build_record.stale()
if _stale:
    if _build_record.doctor_is_main():
        import sys as _sys

        from hvd_torch import doctor as _doctor

        _sys.exit(_doctor.main(stale_build=_stale))
    raise ImportError(_stale_message)
del _stale, _stale_message

from hvd_torch import log  # noqa: E402,F401  (the hvd_torch logger, HOROVOD_LOG_LEVEL)

from hvd_torch.basics import (  # noqa: E402,F401
    Adasum, Average, Max, Min, Product, Sum, ccl_built, cross_rank, cross_size, cuda_built,
    ddl_built, gloo_built, gloo_enabled, init, is_homogeneous, is_initialized, local_rank,
    local_size, mpi_built, mpi_enabled, mpi_threads_supported, nccl_built, rank, rocm_built,
    shutdown, size,
)
from hvd_torch.compression import Compression  # noqa: F401
from hvd_torch.exceptions import HorovodInternalError, HostsUpdatedInterrupt  # noqa: F401
from hvd_torch.functions import (  # noqa: F401
    allgather_object, broadcast_object, broadcast_optimizer_state, broadcast_parameters,
)
from hvd_torch.helpers import (  # noqa: F401
    LRWarmup, distributed_sampler, metric_average, scale_lr, warmup_scheduler,
)
from hvd_torch.grouped import (  # noqa: F401
    grouped_allgather, grouped_allgather_async, grouped_allreduce, grouped_allreduce_,
    grouped_allreduce_async, grouped_allreduce_async_, grouped_reducescatter,
    grouped_reducescatter_async,
)
from hvd_torch.ops import (  # noqa: F401
    allgather, allgather_async, allreduce, allreduce_, allreduce_async,
    allreduce_async_, alltoall, alltoall_async, barrier, broadcast, broadcast_, broadcast_async,
    broadcast_async_, join, poll, reducescatter, reducescatter_async, sparse_allreduce_async,
    synchronize,
)
from hvd_torch.optimizer import DistributedOptimizer  # noqa: F401
from hvd_torch.process_sets import (  # noqa: F401
    ProcessSet, add_process_set, global_process_set, remove_process_set,
)
from hvd_torch.sync_batch_norm import SyncBatchNorm  # noqa: F401
from hvd_torch.timeline import start_timeline, stop_timeline  # noqa: F401
from hvd_torch import elastic  # noqa: F401
# Registers the "hvd" torch.distributed backend.
from hvd_torch import distributed  # noqa: F401,E402

__version__ = "0.1.0"
