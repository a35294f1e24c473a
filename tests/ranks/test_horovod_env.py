"""Horovod's HOROVOD_* environment variables: every one is honoured or, when
set to ask for something hvd-torch lacks, refused at init() on every rank with
a message naming it (hvd_torch/horovod_env.py, docs/compat.md). Real ranks on
2 and 3 processes; the classification is checked against Horovod 0.28.1's
list of knobs (horovod/common/common.h) and its launcher's variables."""

import pytest
import torch

from dist_harness import RankFailure, run_ranks

# horovod/common/common.h, "Horovod knobs", 0.28.1, plus the variables
# horovodrun sets for each rank and the GPU build switches users also export.
HOROVOD_KNOBS = [
    "HOROVOD_MPI_THREADS_DISABLE", "HOROVOD_TIMELINE", "HOROVOD_TIMELINE_MARK_CYCLES",
    "HOROVOD_AUTOTUNE", "HOROVOD_AUTOTUNE_LOG", "HOROVOD_AUTOTUNE_WARMUP_SAMPLES",
    "HOROVOD_AUTOTUNE_STEPS_PER_SAMPLE", "HOROVOD_AUTOTUNE_BAYES_OPT_MAX_SAMPLES",
    "HOROVOD_AUTOTUNE_GAUSSIAN_PROCESS_NOISE", "HOROVOD_FUSION_THRESHOLD", "HOROVOD_CYCLE_TIME",
    "HOROVOD_STALL_CHECK_DISABLE", "HOROVOD_STALL_CHECK_TIME_SECONDS",
    "HOROVOD_STALL_SHUTDOWN_TIME_SECONDS", "HOROVOD_HIERARCHICAL_ALLREDUCE",
    "HOROVOD_HIERARCHICAL_ALLGATHER", "HOROVOD_TORUS_ALLREDUCE", "HOROVOD_CACHE_CAPACITY",
    "HOROVOD_BATCH_D2D_MEMCOPIES", "HOROVOD_NUM_NCCL_STREAMS", "HOROVOD_CPU_OPERATIONS",
    "HOROVOD_CONTROLLER", "HOROVOD_CCL_CACHE", "HOROVOD_GLOO_IFACE",
    "HOROVOD_ADASUM_MPI_CHUNK_SIZE", "HOROVOD_THREAD_AFFINITY", "HOROVOD_DISABLE_GROUP_FUSION",
    "HOROVOD_DISABLE_NVTX_RANGES", "HOROVOD_ENABLE_ASYNC_COMPLETION",
    "HOROVOD_DYNAMIC_PROCESS_SETS", "HOROVOD_ENABLE_XLA_OPS", "HOROVOD_LOG_LEVEL",
    "HOROVOD_LOG_HIDE_TIME", "HOROVOD_GLOO_TIMEOUT_SECONDS", "HOROVOD_START_TIMEOUT",
    "HOROVOD_ELASTIC",
    "HOROVOD_RANK", "HOROVOD_SIZE", "HOROVOD_LOCAL_RANK", "HOROVOD_LOCAL_SIZE",
    "HOROVOD_CROSS_RANK", "HOROVOD_CROSS_SIZE", "HOROVOD_HOSTNAME",
    "HOROVOD_GLOO_RENDEZVOUS_ADDR", "HOROVOD_GLOO_RENDEZVOUS_PORT", "HOROVOD_SECRET_KEY",
    "HOROVOD_GPU_OPERATIONS", "HOROVOD_GPU_ALLREDUCE", "HOROVOD_GPU_ALLGATHER",
    "HOROVOD_GPU_BROADCAST", "HOROVOD_GPU_ALLTOALL", "HOROVOD_GPU_REDUCESCATTER",
]
# Horovod 0.28.1's install docs: the build switches images and job files keep.
HOROVOD_BUILD_SWITCHES = [
    "HOROVOD_WITH_GLOO", "HOROVOD_WITHOUT_GLOO", "HOROVOD_WITH_PYTORCH", "HOROVOD_WITHOUT_PYTORCH",
    "HOROVOD_WITH_MPI", "HOROVOD_WITHOUT_MPI", "HOROVOD_WITH_TENSORFLOW",
    "HOROVOD_WITHOUT_TENSORFLOW", "HOROVOD_WITH_MXNET", "HOROVOD_WITHOUT_MXNET", "HOROVOD_GPU",
    "HOROVOD_CUDA_HOME", "HOROVOD_CUDA_INCLUDE", "HOROVOD_CUDA_LIB", "HOROVOD_NCCL_HOME",
    "HOROVOD_NCCL_INCLUDE", "HOROVOD_NCCL_LIB", "HOROVOD_NCCL_LINK", "HOROVOD_BUILD_ARCH_FLAGS",
    "HOROVOD_BUILD_CUDA_CC_LIST", "HOROVOD_CMAKE",
]

REFUSE = {
    "HOROVOD_CCL_CACHE": "1",
    "HOROVOD_CYCLE_TIME": "5",
    "HOROVOD_CONTROLLER": "mpi",
    "HOROVOD_TORUS_ALLREDUCE": "1",
}
ACCEPT = {
    "HOROVOD_HIERARCHICAL_ALLREDUCE": "1",
    "HOROVOD_HIERARCHICAL_ALLGATHER": "0",
    "HOROVOD_CONTROLLER": "gloo",
    "HOROVOD_CPU_OPERATIONS": "gloo",
    "HOROVOD_DYNAMIC_PROCESS_SETS": "1",
    "HOROVOD_AUTOTUNE": "0",
    "HOROVOD_TIMELINE": "",
    "HOROVOD_CACHE_CAPACITY": "0",
    "HOROVOD_FUSION_THRESHOLD": "0",
    "MY_OWN_HOROVOD_SETTING": "x",
}


@pytest.mark.unit
def test_every_horovod_knob_is_classified():
    from hvd_torch import horovod_env

    groups = [horovod_env.HONOURED, horovod_env.ACCEPTED_VALUES, horovod_env.REFUSED]
    for name in HOROVOD_KNOBS + HOROVOD_BUILD_SWITCHES:
        found = [g for g in groups if name in g]
        assert len(found) == 1, f"{name} is in {len(found)} groups of hvd_torch/horovod_env.py"
    # Every refused-when-set knob is refused on its own, with its name and value.
    for name in HOROVOD_KNOBS:
        if name in horovod_env.REFUSED:
            with pytest.raises(ValueError, match=f"{name}='7'"):
                horovod_env.check({name: "7"})
        elif name in horovod_env.HONOURED and name not in horovod_env.HONOURED_VALUES:
            horovod_env.check({name: "7"})
    horovod_env.check({})


@pytest.mark.unit
def test_build_switches_are_accepted_when_they_describe_this_build_and_refused_otherwise():
    """HOROVOD_WITH_GLOO=1, HOROVOD_WITH_PYTORCH=1, HOROVOD_WITHOUT_MXNET=1 (a Horovod
    image's usual environment) describe hvd-torch's build: accepted. Asking for MPI,
    TensorFlow, MXNet, ROCm, or a build without Gloo or PyTorch is refused by name."""
    from hvd_torch import horovod_env

    horovod_env.check({"HOROVOD_WITH_GLOO": "1", "HOROVOD_WITH_PYTORCH": "1",
                       "HOROVOD_WITHOUT_MXNET": "1", "HOROVOD_WITHOUT_TENSORFLOW": "1",
                       "HOROVOD_WITHOUT_MPI": "1", "HOROVOD_WITH_MXNET": "0",
                       "HOROVOD_WITH_TENSORFLOW": "0", "HOROVOD_WITH_MPI": "0",
                       "HOROVOD_WITHOUT_GLOO": "0", "HOROVOD_GPU": "CUDA",
                       "HOROVOD_NCCL_HOME": "/opt/nccl", "HOROVOD_CMAKE": "/usr/bin/cmake"})
    refused = {"HOROVOD_WITH_MPI": "1", "HOROVOD_WITH_TENSORFLOW": "1", "HOROVOD_WITH_MXNET": "1",
               "HOROVOD_WITHOUT_GLOO": "1", "HOROVOD_WITHOUT_PYTORCH": "1", "HOROVOD_GPU": "ROCM"}
    with pytest.raises(ValueError) as e:
        horovod_env.check(refused)
    for name, value in refused.items():
        assert f"{name}={value!r}" in str(e.value), (name, str(e.value))


@pytest.mark.unit
def test_log_level_is_honoured_and_its_value_checked():
    from hvd_torch import horovod_env

    for level in ("trace", "DEBUG", "info", "warning", "Error", "fatal", ""):
        horovod_env.check({"HOROVOD_LOG_LEVEL": level, "HOROVOD_LOG_HIDE_TIME": "1"})
    with pytest.raises(ValueError, match="HOROVOD_LOG_LEVEL='7': not one of debug, error, "
                                         "fatal, info, trace, warning"):
        horovod_env.check({"HOROVOD_LOG_LEVEL": "7"})


def _init_and_sum():
    import hvd_torch as hvd

    hvd.init()
    out = hvd.allreduce(torch.ones(2) * (hvd.rank() + 1), name="env", op=hvd.Sum)
    hvd.shutdown()
    return out


@pytest.mark.parametrize("nranks", [2, 3])
def test_unsupported_settings_are_refused_at_init_on_every_rank(nranks):
    outcomes = run_ranks(_init_and_sum, nranks, env=REFUSE, timeout=60, expect_fail=True)
    for rank, outcome in enumerate(outcomes):
        assert isinstance(outcome, RankFailure), (rank, outcome)
        assert outcome.exc_type == "ValueError", str(outcome)
        for name, value in REFUSE.items():
            assert f"{name}={value!r}" in outcome.message, (name, outcome.message)


@pytest.mark.parametrize("nranks", [2, 3])
def test_settings_that_describe_hvd_torch_are_accepted(nranks):
    results = run_ranks(_init_and_sum, nranks, env=ACCEPT, timeout=60)
    total = float(sum(r + 1 for r in range(nranks)))
    for out in results:
        assert torch.equal(out, torch.full((2,), total))


def test_gpu_operations_value_is_checked_before_the_rendezvous():
    """HOROVOD_GPU_OPERATIONS is honoured (hvd_torch/gpu.py): NCCL or GLOO; any
    other value fails init() at once, before any rank waits for the others."""
    (outcome,) = run_ranks(_init_and_sum, 1, env={"HOROVOD_GPU_OPERATIONS": "MPI"}, timeout=60,
                           expect_fail=True)
    assert isinstance(outcome, RankFailure) and outcome.exc_type == "ValueError", str(outcome)
    assert "HOROVOD_GPU_OPERATIONS='MPI'" in outcome.message, outcome.message
    (out,) = run_ranks(_init_and_sum, 1, env={"HOROVOD_GPU_OPERATIONS": "gloo"}, timeout=60)
    assert torch.equal(out, torch.ones(2))
