"""TorchTrainer.as_trainable on a real local Ray Tune: every trial a
2-worker TorchTrainer in the trial's own placement group; ASHA over four
trials (tune.Tuner), PBT exploiting a checkpoint (tune.run with CLIReporter),
and examples/ray_trainer_tune.py. Operators: tests/harness/trainer_operators.py."""

from __future__ import annotations

import csv
import re
from collections import defaultdict

import pandas as pd
import pytest
from ray import tune
from ray.tune import CLIReporter
from ray.tune.schedulers import ASHAScheduler, PopulationBasedTraining
from ray_harness import no_leaks, ray_address, ray_module_fixture, run_example  # noqa: F401
from trainer_operators import MLPOperator

from ray_integration import TorchTrainer

# Two trials of two workers at once (the GPUs, unused here, are for
# test_ray_executor's GPU tests: one Ray serves both).
RAY_SHAPE = dict(num_cpus=4, num_gpus=4)
ray_session = ray_module_fixture(**RAY_SHAPE)
pytestmark = [pytest.mark.usefixtures("ray_session", "no_leaks"), pytest.mark.timeout(300)]

GOOD_LR, BAD_LR = 0.3, 1e-4


def _trainable(**kw):
    return TorchTrainer.as_trainable(
        training_operator_cls=MLPOperator, num_workers=2, scheduler_step_freq="epoch",
        config={"gamma": 1.0, "seed": 3}, **kw,
    )  # fmt: skip


def test_trainable_requests_its_own_resources(tmp_path):
    trainable = _trainable()
    request = trainable.default_resource_request({})
    # An empty head bundle for the driving trainable, one per worker.
    assert request.head_bundle_is_empty
    assert request.bundles == [{"CPU": 1}, {"CPU": 1}]
    assert request.strategy == "PACK"
    with pytest.raises(tune.TuneError, match="clear the `resources_per_trial`"):
        tune.run(trainable, config={"lr": 0.1}, resources_per_trial={"cpu": 1},
                 storage_path=str(tmp_path), verbose=0)  # fmt: skip
    with pytest.raises(ValueError, match="fixed number of workers"):
        _trainable(min_workers=1)


def test_asha_over_four_two_worker_trials_reports_the_best(tmp_path):
    tuner = tune.Tuner(
        _trainable(),
        param_space={"lr": tune.grid_search([BAD_LR, 3e-3, 0.1, GOOD_LR])},
        tune_config=tune.TuneConfig(
            metric="val_accuracy", mode="max",
            scheduler=ASHAScheduler(max_t=3, grace_period=1, reduction_factor=2),
            reuse_actors=True,  # later trials reuse the first ones' workers
        ),
        run_config=tune.RunConfig(storage_path=str(tmp_path), verbose=0),
    )  # fmt: skip
    results = tuner.fit()
    assert results.errors == []
    assert len(results) == 4
    best = results.get_best_result()
    assert best.metrics["val_accuracy"] == max(r.metrics["val_accuracy"] for r in results)
    assert best.config["lr"] in (0.1, GOOD_LR)
    assert best.metrics["val_accuracy"] > 0.6
    for result in results:
        history = result.metrics_dataframe
        n = len(history)
        assert 1 <= n <= 3
        # Each step is one epoch of the trial's own trainer, over all 64
        # samples, validated on all 32, on 2 workers.
        assert list(history["epoch"]) == list(range(1, n + 1))
        assert set(history["num_samples"]) == {64} and set(history["val_num_samples"]) == {32}
        assert set(history["lr"]) == {result.config["lr"]}


class _Histories(tune.Callback):
    """Each trial's results as Tune's controller receives them, in this (the
    driver's) process, one row per result: the trial's current config's lr and
    the step's metrics. Not progress.csv or result.json: when PBT restores a
    trial, Tune's loggers overwrite its local files with the storage's copy,
    which the last sync may not have brought up to date, and a history read
    back from them lost its rows (issue #43)."""

    METRICS = ("epoch", "training_iteration", "lr", "origin_lr", "val_accuracy")

    def __init__(self):
        self.rows = defaultdict(list)

    def on_trial_result(self, iteration, trials, trial, result, **info):
        row = {key: result[key] for key in self.METRICS}
        row["config/lr"] = result["config"]["lr"]
        self.rows[trial.trial_id].append(row)

    def history(self, trial):
        return pd.DataFrame(self.rows[trial.trial_id])


def test_pbt_exploits_a_checkpoint(tmp_path, monkeypatch):
    """Two trials, a good and a bad learning rate; PBT makes the bad one
    continue from the good one's checkpoint, under a mutated config whose
    learning rate the restored optimizer then uses. reuse_actors: exploits
    and pauses reuse the trial's running workers (reset_config)."""
    # synch: perturb only once both trials reached the step. Without it, a trial
    # whose workers started late (a loaded machine) found the good trial already
    # finished, with no checkpoint PBT had kept, and nothing was exploited.
    pbt = PopulationBasedTraining(
        time_attr="training_iteration", perturbation_interval=1, quantile_fraction=0.5,
        hyperparam_mutations={"lr": [BAD_LR, 0.1, GOOD_LR]}, synch=True,
    )  # fmt: skip
    monkeypatch.setenv("RAY_AIR_NEW_OUTPUT", "0")  # Tune would ignore the CLIReporter
    results = _Histories()
    analysis = tune.run(
        _trainable(),
        config={"lr": tune.grid_search([GOOD_LR, BAD_LR])},
        metric="val_accuracy", mode="max", scheduler=pbt, reuse_actors=True,
        # Two steps: the exploit after the first, a step from the good weights.
        # A checkpoint every step: a trial may reach its exploit before PBT
        # had the better trial save one.
        stop={"training_iteration": 2},
        checkpoint_config=tune.CheckpointConfig(checkpoint_frequency=1),
        progress_reporter=CLIReporter(metric_columns=["val_accuracy", "lr", "origin_lr"]),
        storage_path=str(tmp_path), verbose=1, callbacks=[results],
    )  # fmt: skip
    assert all(t.status == "TERMINATED" for t in analysis.trials), analysis.trials
    histories = [results.history(t) for t in analysis.trials]
    # The epochs the good trial reached, each saved in a checkpoint.
    good_epochs = {int(e) for h in histories if h["config/lr"][0] == GOOD_LR for e in h["epoch"]}
    exploited = 0
    for history in histories:
        # Whatever was restored, the trial's current config's learning rate trains.
        assert list(history["lr"]) == list(history["config/lr"])
        # origin_lr is operator state: it travels in the checkpoint. A trial
        # that started with the bad rate and ends holding the good trial's
        # lineage resumed from the good trial's checkpoint.
        if history["config/lr"][0] != BAD_LR or history["origin_lr"].iloc[-1] != GOOD_LR:
            continue
        exploited += 1
        first = int((history["origin_lr"] == GOOD_LR).idxmax())
        assert first > 0 and set(history["origin_lr"][:first]) == {BAD_LR}
        # Before the exploit it trained from its own start; right after it,
        # from the good trial's better weights, with the epoch counter that
        # came in the checkpoint: one past an epoch the good trial saved. That
        # may be a later step than the exploit's own (a fast machine lets the
        # good trial save its next checkpoint before PBT hands one over), never
        # an earlier one.
        assert history["val_accuracy"][first] > history["val_accuracy"][:first].max()
        assert int(history["epoch"][first]) - 1 in good_epochs, (history, good_epochs)
        assert history["epoch"][first] >= history["training_iteration"][first]
    assert exploited == 1, histories


def test_tune_example_prints_the_best_config_and_writes_csv(tmp_path):
    table = tmp_path / "results.csv"
    out = run_example(
        "ray_trainer_tune.py", "--address", ray_address(), "--num-samples", "2",
        "--epochs", "2", "--storage", str(tmp_path), "--csv", str(table),
    )  # fmt: skip
    match = re.search(
        r"best config: lr=([0-9.e-]+) momentum=([0-9.]+) \(val_accuracy ([0-9.]+) after (\d) "
        r"epochs; 2 trials\)",
        out,
    )
    assert match, out
    assert 1e-3 <= float(match.group(1)) <= 3e-1 and 0.5 <= float(match.group(2)) <= 0.95
    with open(table) as f:
        rows = list(csv.DictReader(f))
    assert len(rows) == 2 and {"val_accuracy", "config/lr", "config/momentum"} <= set(rows[0])


class _Accumulator:
    """The low-level alternative's per-worker state: a number every step adds
    the allreduced config["x"] to."""

    def __init__(self, config):
        import hvd_torch as hvd

        hvd.init()
        self.x, self.total = config["x"], 0.0

    def step(self):
        import torch

        import hvd_torch as hvd

        self.total += hvd.allreduce(torch.tensor([self.x]), op=hvd.Sum, name="x").item()
        return {"total": self.total, "size": hvd.size()}


class _LowLevelTrainable(tune.Trainable):
    """docs/ray.md's plain tune.Trainable that drives its own RayExecutor."""

    @classmethod
    def default_resource_request(cls, config):
        return tune.PlacementGroupFactory([{}] + [{"CPU": 1}] * 2)

    def setup(self, config):
        from ray_integration import RayExecutor

        settings = RayExecutor.create_settings(timeout_s=60, verbose=0)
        self.executor = RayExecutor(settings, num_workers=2)
        self.executor.start(executable_cls=_Accumulator, executable_args=(config,))

    def step(self):
        return self.executor.execute(lambda worker: worker.step())[0]

    def save_checkpoint(self, checkpoint_dir):
        return {"total": self.executor.execute_single(lambda worker: worker.total)}

    def load_checkpoint(self, checkpoint):
        total = checkpoint["total"]
        self.executor.execute(lambda worker: setattr(worker, "total", total))

    def cleanup(self):
        self.executor.shutdown()


def test_low_level_trainable_with_its_own_executor(tmp_path):
    tuner = tune.Tuner(
        _LowLevelTrainable,
        param_space={"x": 2.0},
        tune_config=tune.TuneConfig(metric="total", mode="max"),
        run_config=tune.RunConfig(storage_path=str(tmp_path), verbose=0,
                                  stop={"training_iteration": 2}),
    )  # fmt: skip
    results = tuner.fit()
    assert results.errors == []
    # Two workers each add x per step: 2x, then 4x.
    assert [r.metrics["total"] for r in results] == [8.0]
    assert {r.metrics["size"] for r in results} == {2}
