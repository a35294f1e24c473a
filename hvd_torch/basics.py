"""Lifecycle and topology: init, shutdown, rank, size, and build facts."""

import atexit
import os

import torch  # noqa: F401  (loads libtorch before our extension)

from hvd_torch import _C, config, gpu, horovod_env, log, store_rendezvous
from hvd_torch import error_translation  # also registers the C++ layer's classes
from hvd_torch import process_sets as process_sets_module

# Horovod's reduce op constants (horovod/common/message.h numbering).
Average = 0
Sum = 1
Adasum = 2
Min = 3
Max = 4
Product = 5


def _check_one_gloo():
    """Our Gloo calls must resolve to Debian's libgloo, not torch's bundled copy."""
    path = _C.gloo_library_path()
    if "libgloo" not in os.path.basename(path):
        raise ImportError(
            f"hvd_torch's Gloo symbols resolved to {path!r} instead of Debian's libgloo.so: "
            "another library (torch loaded with RTLD_GLOBAL?) exports its own Gloo. Unset "
            "TORCH_USE_RTLD_GLOBAL; see docs/architecture.md, 'Which Gloo'.")


_check_one_gloo()


def init(comm=None, process_sets=None):
    """Meets the other ranks (from the launcher's environment) and starts the engine.

    A second call while initialised does nothing, as in Horovod.
    process_sets: ProcessSet objects to register (ids 1, 2, ... in list
    order); "dynamic" is accepted for Horovod scripts and changes nothing,
    since add_process_set() always works here.
    """
    if comm is not None:
        raise ValueError("hvd_torch.init(comm=...): MPI communicators are not supported "
                         "(hvd-torch uses Gloo; launch with hvdrun)")
    if process_sets is not None and process_sets != "dynamic":
        if isinstance(process_sets, str) or not all(
                isinstance(ps, process_sets_module.ProcessSet) for ps in process_sets):
            raise ValueError("hvd_torch.init(process_sets=...) takes a list of ProcessSet "
                             "objects or 'dynamic'")
    if _C.is_initialized():
        return
    launch = config.Launch.from_environment()  # per init(): a re-init may run under new variables
    if launch.torchrun:
        # torchrun (or any launcher that sets only torch.distributed's variables):
        # meet the other ranks through torch's TCPStore, which sets hvdrun's
        # variables for this process (hvd_torch/store_rendezvous.py).
        rank, size = launch.torchrun_rank_size()
        store_rendezvous.rendezvous_env(store_rendezvous.torchrun_store(rank, size), rank, size)
    horovod_env.check()  # no HOROVOD_* variable is silently ignored
    log.configure()  # HOROVOD_LOG_LEVEL may have changed since import
    gpu.requested_operations()  # a bad HOROVOD_GPU_OPERATIONS fails before the rendezvous
    if launch.elastic_worker_id is not None:  # (no rendezvous above sets or unsets it)
        # An elastic worker's rank, size and rendezvous scope come from the driver,
        # round by round (hvd_torch/elastic/worker_rendezvous.py).
        from hvd_torch.elastic import worker_rendezvous

        worker_rendezvous.join_round()
    _C.init()
    if launch.torchrun:
        store_rendezvous.remove_secret_files()  # every rank has read it by now
    with error_translation.translated_errors():  # a peer lost during its allgathers
        gpu.configure()
    process_sets_module._after_init(process_sets)
    _log_initialised()


def _log_initialised():
    log.logger.info("rank %d of %d initialised (local rank %d of %d, host %d of %d)",
                    _C.rank(), _C.size(), _C.local_rank(), _C.local_size(), _C.cross_rank(),
                    _C.cross_size())


def shutdown():
    """Stops the engine. Pending operations fail; init() may be called again."""
    if _C.is_initialized():
        log.logger.debug("rank %d: shutting down", _C.rank())
    _C.shutdown()
    process_sets_module._after_shutdown()


atexit.register(shutdown)

is_initialized = _C.is_initialized


def require_init(what, hint="call hvd.init() first"):
    """Horovod raises ValueError when a call needs init() before it ran: so do we,
    naming the call (what) and what to do (hint)."""
    if not _C.is_initialized():
        raise ValueError(f"{what} was called before hvd_torch.init(): {hint}")


def _topology(name):
    """rank(), size(), ...: a ValueError before init(), as in Horovod."""
    query = getattr(_C, name)

    def fn():
        require_init(f"hvd_torch.{name}")
        return query()

    fn.__name__ = fn.__qualname__ = name
    fn.__doc__ = query.__doc__
    return fn


rank = _topology("rank")
size = _topology("size")
local_rank = _topology("local_rank")
local_size = _topology("local_size")
cross_rank = _topology("cross_rank")
cross_size = _topology("cross_size")
gloo_built = _C.gloo_built
nccl_built = _C.nccl_built
cuda_built = _C.cuda_built


def gloo_enabled():
    """True when the running engine's controller is hvd-torch's own (Horovod's
    Gloo controller): data moves through Gloo, or shared memory between the
    ranks of one host."""
    return _C.backend_name() in ("gloo", "shm") or (is_initialized() and size() == 1)


def mpi_built():
    return False


def mpi_enabled():
    return False


def mpi_threads_supported():
    return False


def rocm_built():
    return False


def ddl_built():
    return False


def ccl_built():
    return False


def is_homogeneous():
    """All hosts run the same number of ranks (always true on one host)."""
    return size() == local_size() * cross_size()
