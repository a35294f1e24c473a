"""Horovod's module path `horovod.torch.mpi_ops`, for scripts that import from
it (`from horovod.torch.mpi_ops import allreduce_async_` becomes
`from hvd_torch.mpi_ops import allreduce_async_`). The same objects as the
package's top level; nothing here is implemented twice."""

from hvd_torch.basics import (  # noqa: F401
    Adasum, Average, Max, Min, Product, Sum, ccl_built, cross_rank, cross_size, cuda_built,
    ddl_built, gloo_built, gloo_enabled, init, is_homogeneous, is_initialized, local_rank,
    local_size, mpi_built, mpi_enabled, mpi_threads_supported, nccl_built, rank, rocm_built,
    shutdown, size,
)
from hvd_torch.exceptions import HorovodInternalError  # noqa: F401
from hvd_torch.grouped import (  # noqa: F401
    grouped_allgather, grouped_allgather_async, grouped_allreduce, grouped_allreduce_,
    grouped_allreduce_async, grouped_allreduce_async_, grouped_reducescatter,
    grouped_reducescatter_async,
)
from hvd_torch.ops import (  # noqa: F401
    allgather, allgather_async, allreduce, allreduce_, allreduce_async, allreduce_async_,
    alltoall, alltoall_async, barrier, broadcast, broadcast_, broadcast_async, broadcast_async_,
    join, poll, reducescatter, reducescatter_async, sparse_allreduce_async, synchronize,
)
from hvd_torch.process_sets import (  # noqa: F401
    ProcessSet, add_process_set, global_process_set, remove_process_set,
)
