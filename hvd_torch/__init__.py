"""hvd-torch: Horovod-compatible data-parallel training for PyTorch.

Switch from Horovod with one line: `import hvd_torch as hvd`.
"""

from hvd_torch.basics import (  # noqa: F401
    Adasum, Average, Max, Min, Product, Sum, ccl_built, cross_rank, cross_size, cuda_built,
    ddl_built, gloo_built, gloo_enabled, init, is_homogeneous, is_initialized, local_rank,
    local_size, mpi_built, mpi_enabled, mpi_threads_supported, nccl_built, rank, rocm_built,
    shutdown, size,
)
from hvd_torch.compression import Compression  # noqa: F401
from hvd_torch.exceptions import HorovodInternalError, HostsUpdatedInterrupt  # noqa: F401
from hvd_torch.ops import (  # noqa: F401
    ProcessSet, allgather, allgather_async, allreduce, allreduce_, allreduce_async,
    allreduce_async_, barrier, broadcast, broadcast_, broadcast_async, broadcast_async_,
    global_process_set, poll, synchronize,
)

__version__ = "0.1.0"
