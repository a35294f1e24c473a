"""Ray Train v2 (ray 2.58) on hvd: TorchTrainer with TorchConfig(backend="hvd"),
and HvdTrainer (ray_integration/train_v2.py), the successor of Ray's
HorovodTrainer, on a real local Ray with 2 and 3 workers.

Every run trains the same tiny MLP on the same Ray Data dataset (loops and
files: tests/harness/ray_train_v2_loops.py). A run's weights must have changed,
be identical on every rank, and match TorchTrainer's on gloo within float
tolerance (hvd sums in another order than gloo). A worker that SIGKILLs itself
after a checkpoint is resumed from that checkpoint by FailureConfig, to the
weights of the uninterrupted run.

Each fit starts a worker group (processes that import torch: seconds each), so
a run is done once per module and shared by the tests that read it (runs).
"""

from __future__ import annotations

import re

import pytest
import ray_train_v2_loops as loops
import torch
from ray_harness import no_leaks, ray_address, ray_module_fixture, run_example  # noqa: F401
from ray_train_v2_loops import CONFIG, ROWS

RAY_SHAPE = dict(num_cpus=4, num_gpus=4)  # tests/ray's shape: one Ray serves both
ray_session = ray_module_fixture(**RAY_SHAPE)
# A fit is tens of seconds on a loaded 2-core machine; the kill test makes two.
pytestmark = [pytest.mark.usefixtures("ray_session", "no_leaks"), pytest.mark.timeout(480)]

RTOL, ATOL = 1e-5, 1e-6
KILL_STEP = 2  # rank 1 dies before this step: after the checkpoint of step 2 was committed


def fit(kind: str, num_workers: int, folder, config=None, max_failures=0):
    """Trains with one trainer: "hvd" (HvdTrainer, hvd_loop), "torch-hvd" or
    "torch-gloo" (TorchTrainer, ddp_loop). Returns (Result, what the ranks wrote)."""
    import ray.train
    from ray.train.torch import TorchConfig, TorchTrainer

    from ray_integration import HvdTrainer

    out = folder / "out"
    out.mkdir(parents=True)
    common = dict(
        train_loop_config=dict(config or CONFIG, out=str(out)),
        scaling_config=ray.train.ScalingConfig(num_workers=num_workers),
        run_config=ray.train.RunConfig(
            storage_path=str(folder / "storage"), name=f"{kind}-{num_workers}",
            failure_config=ray.train.FailureConfig(max_failures=max_failures)),
        datasets={"train": loops.make_dataset()},
    )
    if kind == "hvd":
        trainer = HvdTrainer(loops.hvd_loop, **common)
    else:
        backend = kind.removeprefix("torch-")
        trainer = TorchTrainer(loops.ddp_loop, torch_config=TorchConfig(backend=backend), **common)
    result = trainer.fit()
    return result, loops.read_run(out)


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """(kind, num_workers) -> fit()'s result, each fitted once per module, when first asked."""
    done = {}

    def get(kind, num_workers):
        if (kind, num_workers) not in done:
            folder = tmp_path_factory.mktemp(f"{kind}-{num_workers}")
            done[kind, num_workers] = fit(kind, num_workers, folder)
        return done[kind, num_workers]

    return get


def _stopped(run) -> set:
    """(rank, pid) of every process whose engine the worker group's end stopped."""
    records = run[1]["stopped"]
    assert not any(r["running_after"] for r in records)
    return {(r["rank"], r["pid"]) for r in records}


def _max_diff(a: dict, b: dict) -> float:
    assert a.keys() == b.keys()
    return max((a[k].double() - b[k].double()).abs().max().item() for k in a)


def _close(a: dict, b: dict) -> bool:
    return all(torch.allclose(a[k], b[k], rtol=RTOL, atol=ATOL) for k in a)


def check_trained(run, reference, num_workers):
    """Every rank ended; the weights changed, are the same on every rank, and
    are the reference's within float tolerance."""
    result, ranks = run
    assert result.error is None
    assert sorted(ranks["final"]) == list(range(num_workers))
    weights = ranks["final"][0]
    assert _max_diff(weights, loops.initial_weights(CONFIG)) > 1e-2
    for rank in range(1, num_workers):
        assert _max_diff(ranks["final"][rank], weights) == 0.0, f"rank {rank} differs from rank 0"
    reference_weights = reference[1]["final"][0]
    difference = _max_diff(weights, reference_weights)
    print(f"{num_workers} workers: max |weight - reference's| {difference:.3g}, "
          f"moved {_max_diff(weights, loops.initial_weights(CONFIG)):.3g} from the start")
    assert _close(weights, reference_weights), f"max difference {difference:.3g} from the reference"
    assert result.metrics["step"] == CONFIG["steps"]
    assert result.checkpoint is not None


@pytest.mark.parametrize("num_workers", [2, 3])
def test_torch_trainer_runs_ddp_on_hvd(runs, num_workers):
    """TorchTrainer(torch_config=TorchConfig(backend="hvd")): Ray's workers create the
    group before the loop could import hvd_torch (the torch.backends entry point
    finds it); prepare_model's DDP trains to gloo's weights."""
    run = runs("torch-hvd", num_workers)
    check_trained(run, runs("torch-gloo", num_workers), num_workers)
    assert {s["backend"] for s in run[1]["starts"]} == {"hvd"}
    assert {s["backend"] for s in runs("torch-gloo", num_workers)[1]["starts"]} == {"gloo"}


@pytest.mark.parametrize("num_workers", [2, 3])
def test_hvd_trainer_trains_with_hvds_api(runs, num_workers):
    """HvdTrainer with hvd.DistributedOptimizer and broadcast_parameters (every rank
    starts from other weights) reaches TorchTrainer-on-gloo's weights; the engine
    runs before hvd.init(), and hvd's ranks are Ray Train's world ranks."""
    run = runs("hvd", num_workers)
    check_trained(run, runs("torch-gloo", num_workers), num_workers)
    starts = run[1]["starts"]
    assert len(starts) == num_workers
    for start in starts:
        assert start["hvd_running_before_init"] is True
        assert (start["hvd_rank"], start["hvd_size"]) == (start["world_rank"], num_workers)
        assert start["world_size"] == num_workers
    assert sorted(s["hvd_rank"] for s in starts) == list(range(num_workers))
    assert _stopped(run) == {(s["world_rank"], s["pid"]) for s in starts}, \
        "the group's end stops every worker's engine"


@pytest.mark.parametrize("num_workers", [2, 3])
def test_hvd_trainer_shards_a_ray_dataset(runs, num_workers):
    """get_dataset_shard gives every worker its own equal part of the dataset:
    disjoint, and together every row."""
    starts = runs("hvd", num_workers)[1]["starts"]
    shards = [s["ids"] for s in starts]
    assert [len(ids) for ids in shards] == [ROWS // num_workers] * num_workers
    assert sorted(i for ids in shards for i in ids) == list(range(ROWS))


def test_killed_worker_resumes_from_its_checkpoint(runs, tmp_path):
    """Rank 1 SIGKILLs its own process before step KILL_STEP, once, after the
    checkpoint of that step was committed. FailureConfig(max_failures=1) starts a
    new worker group (new processes), whose loop resumes at that step and ends at
    the uninterrupted run's weights."""
    config = dict(CONFIG, kill={"rank": 1, "step": KILL_STEP, "marker": str(tmp_path / "killed")})
    result, ranks = fit("hvd", 2, tmp_path / "run", config=config, max_failures=1)

    assert (tmp_path / "killed").exists()
    by_attempt = {}
    for start in ranks["starts"]:
        by_attempt.setdefault(start["start_step"], []).append(start)
    assert sorted(by_attempt) == [0, KILL_STEP], f"attempts started at {sorted(by_attempt)}"
    first = {s["pid"] for s in by_attempt[0]}
    second = {s["pid"] for s in by_attempt[KILL_STEP]}
    assert len(first) == len(second) == 2 and not first & second, "a restart gets new processes"
    assert sorted(s["hvd_rank"] for s in by_attempt[KILL_STEP]) == [0, 1]
    # The failed group's survivor stopped its engine too, before Ray killed it.
    survivor = {(s["world_rank"], s["pid"]) for s in by_attempt[0] if s["world_rank"] == 0}
    assert _stopped((result, ranks)) == survivor | {
        (s["world_rank"], s["pid"]) for s in by_attempt[KILL_STEP]}
    killed_at = (tmp_path / "killed").stat().st_mtime
    stopped_at = next(r["time"] for r in ranks["stopped"] if (r["rank"], r["pid"]) in survivor)
    restarted_at = min(s["time"] for s in by_attempt[KILL_STEP])
    print(f"from the kill: the survivor's engine stopped after {stopped_at - killed_at:.1f} s, "
          f"the new group's loops started after {restarted_at - killed_at:.1f} s")

    check_trained((result, ranks), runs("hvd", 2), 2)


def test_example_trains_the_digits(tmp_path):
    """examples/ray_train_v2_digits.py on 2 workers of this module's Ray: it fails
    unless every rank ends with the same weights; the final checkpoint scores
    well on the driver."""
    out = run_example("ray_train_v2_digits.py", "--num-workers", "2", "--address", ray_address(),
                      "--storage", str(tmp_path), timeout=400)
    accuracy = float(re.search(r"final checkpoint scored on the driver: val accuracy ([0-9.]+)",
                               out).group(1))
    assert accuracy > 0.9, out[-3000:]


def test_hvd_config_says_what_it_refuses_and_sends():
    """A backend without hvd is refused naming TorchTrainer, a config that is not an
    HvdConfig naming HvdConfig; every worker group gets a fresh 32-byte secret
    unless env_vars names one, and HOROVOD_START_TIMEOUT when start_timeout_s is set."""
    from ray.train.torch import TorchConfig

    from ray_integration import HvdConfig, HvdTrainer

    with pytest.raises(ValueError, match="TorchTrainer"):
        HvdConfig(backend="gloo")
    with pytest.raises(TypeError, match="HvdConfig"):
        HvdTrainer(loops.hvd_loop, horovod_config=TorchConfig(backend="hvd"))
    assert HvdConfig(backend="cpu:hvd,cuda:nccl").backend == "cpu:hvd,cuda:nccl"

    config = HvdConfig(start_timeout_s=12, env_vars={"HOROVOD_CYCLE_TIME": 2})
    first, second = config.worker_env(), config.worker_env()
    assert len(bytes.fromhex(first["HVD_TORCH_SECRET"])) == 32
    assert first["HVD_TORCH_SECRET"] != second["HVD_TORCH_SECRET"]
    assert (first["HOROVOD_START_TIMEOUT"], first["HOROVOD_CYCLE_TIME"]) == ("12", "2")
    given = "ab" * 16
    assert HvdConfig(env_vars={"HVD_TORCH_SECRET": given}).worker_env()["HVD_TORCH_SECRET"] == given
