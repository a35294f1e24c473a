"""Horovod's HOROVOD_* environment variables: which ones hvd-torch honours, and
a clear refusal at init() for the ones it does not, so none is silently
ignored (issue #12).

The lists cover every knob in Horovod 0.28.1's horovod/common/common.h, the
variables its launcher sets for the ranks, and the build-time switches of its
install docs (HOROVOD_WITH_GLOO, HOROVOD_WITHOUT_MXNET, HOROVOD_NCCL_HOME, ...).
check() runs in hvd.init() before the engine starts; a refusal is a ValueError
naming every offending variable, its value, what it does in Horovod and what to
do instead.

A variable is refused only when its value asks for something hvd-torch does
not do: HOROVOD_CONTROLLER=gloo describes what hvd-torch does anyway and is
accepted; =mpi is refused.
"""

from hvd_torch import config, log

# Read by the Python layer, some by the engine too: hvd_torch/config.py lists them with
# their meanings.
_READ_BY_PYTHON = {
    name: meaning for name, meaning in config.VARIABLES.items()
    if name.startswith(config.HOROVOD_PREFIX)
}  # fmt: skip

# Those, and the ones the engine alone reads at init() (csrc/core/topology.cc).
HONOURED = {
    **_READ_BY_PYTHON,
    "HOROVOD_FUSION_THRESHOLD": "largest fused allreduce buffer, bytes",
    "HOROVOD_CACHE_CAPACITY": "response cache slots (0 disables the cache)",
    "HOROVOD_GLOO_TIMEOUT_SECONDS": "deadline of one Gloo collective, seconds",
    "HOROVOD_STALL_CHECK_DISABLE": "1: no stall warnings or stall shutdown",
    "HOROVOD_STALL_CHECK_TIME_SECONDS": "warn about ops some ranks never submit after this",
    "HOROVOD_STALL_SHUTDOWN_TIME_SECONDS": "fail every rank after this (0: never)",
    # Set by the launcher (hvdrun, horovodrun --gloo, the Ray driver) for each rank
    # (HOROVOD_SIZE, _LOCAL_RANK, ... and HOROVOD_ELASTIC: config.VARIABLES, above).
    "HOROVOD_HOSTNAME": "this host's name, as the other ranks reach it",
    "HOROVOD_GLOO_IFACE": "network interface for the control plane and Gloo across hosts",
    # docs/toolbox.md, "Timeline" and "Autotune".
    "HOROVOD_TIMELINE": "rank 0 writes a Chrome-trace timeline to this path (DYNAMIC: none yet)",
    "HOROVOD_TIMELINE_MARK_CYCLES": "1: a CYCLE_START instant per batch of dispatched responses",
    "HOROVOD_AUTOTUNE": "1: rank 0 tunes the fusion and inline thresholds online",
    "HOROVOD_AUTOTUNE_LOG": "CSV file of the autotuner's trials (rank 0)",
    "HOROVOD_AUTOTUNE_WARMUP_SAMPLES": "samples of steps ignored before the first trial",
    "HOROVOD_AUTOTUNE_STEPS_PER_SAMPLE": "training steps scored per trial",
    "HOROVOD_AUTOTUNE_BAYES_OPT_MAX_SAMPLES": "most trials (the search is a grid, not Bayesian)",
    "HOROVOD_AUTOTUNE_GAUSSIAN_PROCESS_NOISE": "accepted and unused (no Gaussian process)",
    "HOROVOD_HIERARCHICAL_ALLREDUCE": "0: allreduce across hosts without the shared-memory "
                                      "step inside each (default 1 where a host has 2+ ranks)",
    "HOROVOD_HIERARCHICAL_ALLGATHER": "0: allgather across hosts without the shared-memory "
                                      "step inside each (default 1 where a host has 2+ ranks)",
}

# Honoured variables whose value must be one of these (checked at init()).
HONOURED_VALUES = {
    "HOROVOD_LOG_LEVEL": set(log.LEVELS),
}

# Values that describe what hvd-torch always does: accepted (value -> reason);
# any other value is refused.
ACCEPTED_VALUES = {
    "HOROVOD_CONTROLLER": ({"gloo"}, "the only controller is Gloo"),
    "HOROVOD_CPU_OPERATIONS": ({"gloo"}, "CPU collectives run on Gloo"),
    "HOROVOD_DYNAMIC_PROCESS_SETS": (None, "process sets can always be added and removed"),
    "HOROVOD_MPI_THREADS_DISABLE": (None, "there is no MPI"),
    "HOROVOD_TORUS_ALLREDUCE": ({"0", ""}, "allreduce is never a torus"),
    "HOROVOD_DISABLE_GROUP_FUSION": ({"0", ""}, "grouped ops fuse with others"),
    "HOROVOD_ENABLE_ASYNC_COMPLETION": ({"0", ""}, "CPU ops complete on the engine thread"),
    "HOROVOD_DISABLE_NVTX_RANGES": (None, "there are no NVTX ranges"),
    "HOROVOD_ENABLE_XLA_OPS": ({"0", ""}, "there are no XLA ops (TensorFlow only)"),
    # Horovod's per-op GPU switches: one plane moves every op (HOROVOD_GPU_OPERATIONS).
    "HOROVOD_GPU_ALLREDUCE": ({"nccl", ""}, "CUDA allreduces use NCCL when it is built"),
    "HOROVOD_GPU_ALLGATHER": ({"nccl", ""}, "CUDA allgathers use NCCL when it is built"),
    "HOROVOD_GPU_BROADCAST": ({"nccl", ""}, "CUDA broadcasts use NCCL when it is built"),
    "HOROVOD_GPU_ALLTOALL": ({"nccl", ""}, "CUDA alltoalls use NCCL when it is built"),
    "HOROVOD_GPU_REDUCESCATTER": ({"nccl", ""}, "CUDA reducescatters use NCCL when it is built"),
    "HOROVOD_NUM_NCCL_STREAMS": ({"1", ""}, "one NCCL stream per GPU"),
    "HOROVOD_BATCH_D2D_MEMCOPIES": ({"0", ""}, "fusion-buffer copies are one cudaMemcpyAsync each"),
    # The build switches of Horovod's install docs, often left set in an image's
    # environment: a value that describes hvd-torch's build is accepted (Gloo and
    # PyTorch are always in it; MPI, TensorFlow and MXNet never), one that asks for
    # another build is refused. hvd-torch's own build (setup.py) reads none of them.
    "HOROVOD_WITH_GLOO": (None, "hvd-torch is always built with Gloo"),
    "HOROVOD_WITHOUT_GLOO": ({"0", ""}, "hvd-torch is always built with Gloo"),
    "HOROVOD_WITH_PYTORCH": (None, "hvd-torch is always built for PyTorch"),
    "HOROVOD_WITHOUT_PYTORCH": ({"0", ""}, "hvd-torch is always built for PyTorch"),
    "HOROVOD_WITH_MPI": ({"0", ""}, "hvd-torch has no MPI"),
    "HOROVOD_WITHOUT_MPI": (None, "hvd-torch has no MPI"),
    "HOROVOD_WITH_TENSORFLOW": ({"0", ""}, "hvd-torch has no TensorFlow support"),
    "HOROVOD_WITHOUT_TENSORFLOW": (None, "hvd-torch has no TensorFlow support"),
    "HOROVOD_WITH_MXNET": ({"0", ""}, "hvd-torch has no MXNet support"),
    "HOROVOD_WITHOUT_MXNET": (None, "hvd-torch has no MXNet support"),
    "HOROVOD_GPU": ({"cuda", ""}, "the GPU build is CUDA (with a CUDA torch and nvcc); no ROCm"),
    # Where Horovod's build looks for its tools: hvd-torch's build takes CUDA from
    # CUDA_HOME/nvcc and NCCL from torch's nvidia-nccl wheel (docs/gpu.md).
    "HOROVOD_CUDA_HOME": (None, "build-time only; hvd-torch's build uses CUDA_HOME/nvcc"),
    "HOROVOD_CUDA_INCLUDE": (None, "build-time only; hvd-torch's build uses CUDA_HOME/nvcc"),
    "HOROVOD_CUDA_LIB": (None, "build-time only; hvd-torch's build uses CUDA_HOME/nvcc"),
    "HOROVOD_NCCL_HOME": (None, "build-time only; hvd-torch links torch's own NCCL"),
    "HOROVOD_NCCL_INCLUDE": (None, "build-time only; hvd-torch links torch's own NCCL"),
    "HOROVOD_NCCL_LIB": (None, "build-time only; hvd-torch links torch's own NCCL"),
    "HOROVOD_NCCL_LINK": (None, "build-time only; hvd-torch links torch's own NCCL"),
    "HOROVOD_BUILD_ARCH_FLAGS": (None, "build-time only; hvd-torch's build uses torch's flags"),
    "HOROVOD_BUILD_CUDA_CC_LIST": (None, "build-time only; hvd-torch uses TORCH_CUDA_ARCH_LIST"),
    "HOROVOD_CMAKE": (None, "build-time only; hvd-torch's build does not use CMake"),
}

# Asks for something hvd-torch does not have: refused whenever set (and not
# empty), with what to do instead.
REFUSED = {
    "HOROVOD_CYCLE_TIME": ("background cycle in ms; hvd-torch has no cycle: an op is negotiated "
                           "the moment it is submitted, and ops submitted while a collective "
                           "runs are fused"),
    "HOROVOD_CCL_CACHE": "oneCCL setting; hvd-torch has no oneCCL",
    "HOROVOD_ADASUM_MPI_CHUNK_SIZE": "Adasum over MPI; hvd-torch has neither",
    "HOROVOD_THREAD_AFFINITY": "pins Horovod's background thread to cores; not implemented",
    "HOROVOD_MPI": "selects MPI; hvd-torch has no MPI",
}


def _problems(environ):
    out = []
    for name, value in sorted(environ.items()):
        if not name.startswith("HOROVOD_"):
            continue
        if name in HONOURED:
            allowed = HONOURED_VALUES.get(name)
            if allowed is not None and value.strip().lower() not in allowed | {""}:
                out.append(f"{name}={value!r}: not one of {', '.join(sorted(allowed))}")
            continue
        if name in ACCEPTED_VALUES:
            allowed, meaning = ACCEPTED_VALUES[name]
            if allowed is None or value.strip().lower() in allowed:
                continue
            out.append(f"{name}={value!r}: hvd-torch accepts only "
                       f"{sorted(v for v in allowed if v) or ['0']} here ({meaning})")
        elif name in REFUSED:
            if value == "":
                continue
            out.append(f"{name}={value!r}: in Horovod this {REFUSED[name]}")
    return out


def check(environ=None):
    """Raises ValueError naming every HOROVOD_* variable this build would ignore.

    Unknown HOROVOD_* names (not Horovod's either) are left alone: they may
    belong to the user's own scripts.
    """
    problems = _problems(config.horovod_variables(environ))
    if problems:
        raise ValueError(
            "hvd_torch.init(): these Horovod environment variables ask for behaviour hvd-torch "
            "does not have, so they would be silently ignored; unset them (docs/compat.md, "
            "'Environment variables'):\n  " + "\n  ".join(problems))
