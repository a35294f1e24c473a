"""horovod.ray's names behave as in Horovod, on a real local Ray with 2 and 3
workers: execute() without an executable gives fn None; the elastic executor
has start(executable_cls=...), execute(), and Horovod's NotImplementedError
for run_remote()/execute_single(); cooldown_range, override_discovery=False
and create_settings(nics=...) fail with a clear message;
DistributedTrainableCreator takes Ray's historical positional signature and
restores a trial from its Tune checkpoint."""

import json
import os

import pytest
import torch
from ray_harness import no_leaks, ray_module_fixture, warm_executor  # noqa: F401  (fixtures)

import hvd_torch as hvd
import ray_integration
from ray_integration import DistributedTrainableCreator, ElasticRayExecutor, RayExecutor

# The shape of test_ray_executor (its GPU tests): one Ray serves both.
RAY_SHAPE = dict(num_cpus=4, num_gpus=4)
ray_session = ray_module_fixture(**RAY_SHAPE)
# A safety net for a hang, not a budget: on a loaded machine (make test-stress)
# the checkpoint-restore test on 2 workers took 222 s, and on 3 over 240 s.
pytestmark = [pytest.mark.usefixtures("ray_session", "no_leaks"), pytest.mark.timeout(480)]


def _describe(executable):
    hvd.init()
    total = hvd.allreduce(torch.tensor([hvd.rank() + 1.0]), op=hvd.Sum, name="exe").item()
    return (None if executable is None else executable.value, hvd.rank(), total)


class _Executable:
    def __init__(self, value):
        self.value = value


@pytest.mark.parametrize("warm_executor", [2, 3], indirect=True)
def test_execute_without_executable_cls_passes_none(warm_executor):
    # Warm workers (ray_harness.warm_executor) were started without an executable.
    executor = warm_executor
    results = executor.execute(_describe)
    single = executor.execute_single(lambda exe: exe)
    nworkers = executor.num_workers
    total = float(sum(range(1, nworkers + 1)))
    assert results == [(None, r, total) for r in range(nworkers)]
    assert single is None


@pytest.mark.parametrize("nworkers", [2, 3])
def test_elastic_executor_start_executable_and_execute(nworkers):
    # timeout_s is the workers' deadline to start and join round 1 (the driver
    # kills a late one): fresh actors import torch and hvd_torch, and under
    # make test-stress two and three of them missed 30 s. 90 s, as ray_harness's
    # warm executor and test_ray_elastic give them.
    settings = RayExecutor.create_settings(timeout_s=90, verbose=0)
    executor = RayExecutor(settings, min_workers=nworkers, max_workers=nworkers,
                           elastic_timeout=30)
    assert isinstance(executor, ElasticRayExecutor)
    executor.start(executable_cls=_Executable, executable_args=[7])
    try:
        with pytest.raises(NotImplementedError, match="workers are ephemeral"):
            executor.run_remote(_describe)
        with pytest.raises(NotImplementedError, match="execute_single"):
            executor.execute_single(_describe)
        results = executor.execute(_describe)
    finally:
        executor.shutdown()
    total = float(sum(range(1, nworkers + 1)))
    assert sorted(results, key=lambda r: r[1]) == [(7, r, total) for r in range(nworkers)]


def test_unsupported_horovod_options_fail_clearly():
    settings = RayExecutor.create_settings(verbose=0)
    with pytest.raises(ValueError, match="cooldown_range=\\(1, 10\\) is not supported"):
        RayExecutor(settings, min_workers=2, cooldown_range=(1, 10))
    with pytest.raises(ValueError, match="cooldown_range"):
        ElasticRayExecutor.create_settings(cooldown_range=(1, 10))
    with pytest.raises(ValueError, match="override_discovery=False is not supported"):
        RayExecutor(settings, min_workers=2, override_discovery=False)
    with pytest.raises(ValueError, match="nics"):
        RayExecutor.create_settings(nics={"eth0"})
    assert isinstance(RayExecutor(settings, min_workers=2, cooldown_range=None,
                                  override_discovery=True), ElasticRayExecutor)


STEPS = 4


def _resumable(config, checkpoint_dir=None):
    """Ray's historical function trainable: (config, checkpoint_dir). Saves a
    checkpoint after every step; fails once, after step 1, the first time."""
    hvd.init()
    start = 0
    if checkpoint_dir is not None:
        with open(os.path.join(checkpoint_dir, "state.json")) as f:
            start = json.load(f)["next_step"]
    for step in range(start, STEPS):
        total = hvd.allreduce(torch.tensor([float(step)]), op=hvd.Sum, name=f"s.{step}").item()
        if hvd.rank() == 0:
            directory = os.path.join(config["scratch"], f"ckpt.{step}")
            os.makedirs(directory, exist_ok=True)
            with open(os.path.join(directory, "state.json"), "w") as f:
                json.dump({"next_step": step + 1}, f)
            ray_integration.report_checkpoint(
                {"step": step, "total": total, "resumed_from": start}, directory)
        hvd.barrier()
        marker = os.path.join(config["scratch"], "failed.once")
        if step == 1 and not os.path.exists(marker):
            hvd.barrier()
            if hvd.rank() == 0:
                open(marker, "w").close()
            raise RuntimeError("planned failure after step 1")


@pytest.mark.parametrize("nworkers", [2, 3])
def test_trainable_creator_historical_signature_and_checkpoint_restore(nworkers, tmp_path):
    from ray import tune

    scratch = tmp_path / "scratch"
    scratch.mkdir()
    # Ray's positional order: func, use_gpu, num_hosts, num_workers, num_cpus_per_worker,
    # timeout_s, replicate_pem.
    trainable = DistributedTrainableCreator(_resumable, False, None, nworkers, 1, 60, False)
    tuner = tune.Tuner(
        trainable,
        param_space={"scratch": str(scratch)},
        tune_config=tune.TuneConfig(metric="step", mode="max"),
        run_config=tune.RunConfig(storage_path=str(tmp_path / "runs"), verbose=0,
                                  failure_config=tune.FailureConfig(max_failures=1)),
    )
    results = tuner.fit()
    assert results.errors == []
    (result,) = list(results)
    assert (scratch / "failed.once").exists()  # the trial did fail once, after step 1
    history = result.metrics_dataframe
    # After the failure the trial restarted from its last checkpoint (step 1's:
    # next_step 2) and ran steps 2 and 3 only.
    assert list(history["step"])[-2:] == [2, 3], history
    assert list(history["resumed_from"])[-2:] == [2, 2], history
    assert list(history["total"])[-2:] == [float(nworkers * s) for s in (2, 3)]
    assert result.metrics["step"] == STEPS - 1 and result.metrics["resumed_from"] == 2
    assert result.checkpoint is not None
