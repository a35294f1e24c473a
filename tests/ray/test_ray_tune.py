"""Ray Tune trials as distributed hvd-torch jobs: DistributedTrainableCreator,
and examples/ray_tune_digits.py (ASHA over learning rate and momentum)."""

import re

import pytest
import torch
from ray_harness import no_leaks, ray_address, ray_module_fixture, run_example  # noqa: F401

import hvd_torch as hvd
import ray_integration
from ray_integration import DistributedTrainableCreator

# The shape of test_ray_executor (its GPU tests): one Ray serves both.
RAY_SHAPE = dict(num_cpus=4, num_gpus=4)
ray_session = ray_module_fixture(**RAY_SHAPE)
pytestmark = [pytest.mark.usefixtures("ray_session", "no_leaks"), pytest.mark.timeout(240)]

STEPS = 3


def _sum_trial(config):
    """On every worker: STEPS reports of an allreduce that depends on the config."""
    hvd.init()
    for step in range(STEPS):
        mine = torch.tensor([config["x"] * (hvd.rank() + 1) + step])
        total = hvd.allreduce(mine, op=hvd.Sum, name=f"total.{step}").item()
        ray_integration.report(
            {"total": total, "rank": hvd.rank(), "size": hvd.size(), "step": step}
        )


def test_each_trial_is_a_two_worker_job_reporting_from_rank_0(tmp_path):
    from ray import tune

    trainable = DistributedTrainableCreator(_sum_trial, num_workers=2, timeout_s=60)
    tuner = tune.Tuner(
        trainable,
        param_space={"x": tune.grid_search([1.0, 2.0])},
        tune_config=tune.TuneConfig(metric="total", mode="max"),
        run_config=tune.RunConfig(storage_path=str(tmp_path), verbose=0),
    )
    results = tuner.fit()
    assert results.errors == []
    by_x = {r.config["x"]: r for r in results}
    assert sorted(by_x) == [1.0, 2.0]
    for x, result in by_x.items():
        history = result.metrics_dataframe
        # Every step reached Tune, from rank 0 only, with the 2-rank sum
        # x * (1 + 2) + 2 * step.
        assert list(history["step"]) == list(range(STEPS))
        assert set(history["rank"]) == {0}
        assert set(history["size"]) == {2}
        assert list(history["total"]) == [3 * x + 2 * s for s in range(STEPS)]
        assert result.metrics["training_iteration"] == STEPS
    assert results.get_best_result().config == {"x": 2.0}


def test_tune_digits_example_prints_a_best_config(tmp_path):
    out = run_example(
        "ray_tune_digits.py",
        "--address",
        ray_address(),
        "--num-samples",
        "2",
        "--epochs",
        "2",
        "--storage",
        str(tmp_path),
    )
    match = re.search(
        r"best config: lr=([0-9.e-]+) momentum=([0-9.]+) \(accuracy ([0-9.]+) after (\d) "
        r"epochs; 2 trials, 0 failed\)",
        out,
    )
    assert match, out
    lr, momentum, accuracy = (float(g) for g in match.groups()[:3])
    assert 1e-3 <= lr <= 3e-1 and 0.5 <= momentum <= 0.95
    assert 0.0 < accuracy <= 1.0
