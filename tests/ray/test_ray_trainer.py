"""TrainingOperator and TorchTrainer on a real local Ray (2 workers): the
default loops against a hand-written hvd loop, use_fp16, save/load, a
failing worker; examples/ray_trainer_digits.py. Operators: tests/harness/trainer_operators.py."""

from __future__ import annotations

import re

import mlp_reference
import pytest
import torch
from ray_harness import no_leaks, ray_address, ray_module_fixture, run_example  # noqa: F401
from trainer_operators import MLPOperator, TwoModelOperator

from ray_integration import TorchTrainer, WorkerFailure

# Two workers; the third CPU is test_ray_elastic's (one Ray serves both).
RAY_SHAPE = dict(num_cpus=3)
ray_session = ray_module_fixture(**RAY_SHAPE)
pytestmark = [pytest.mark.usefixtures("ray_session", "no_leaks"), pytest.mark.timeout(180)]

CONFIG = {"lr": 0.1, "momentum": 0.9, "gamma": 0.5, "seed": 3}
EPOCHS = 2


def _trainer(**kw):
    kw.setdefault("config", CONFIG)
    return TorchTrainer(training_operator_cls=MLPOperator, num_workers=2,
                        scheduler_step_freq="epoch", **kw)  # fmt: skip


@pytest.fixture(scope="module")
def hand_reference():
    """(weights, per-epoch losses) of the hand-written loop on 2 ranks, once per module."""
    return mlp_reference.hand_reference(CONFIG, EPOCHS)


def _max_diff(a: dict, b: dict) -> float:
    assert a.keys() == b.keys()
    return max((a[k].double() - b[k].double()).abs().max().item() for k in a)


def test_default_loops_equal_a_hand_written_hvd_loop(hand_reference):
    """Same data, same seeds, same order of float operations: the operator's
    default train_epoch/train_batch must give the hand loop's weights bit for
    bit (tolerance 0; a 2-rank Average is (a + b) / 2 either way), and the
    trainer's epoch loss must be the hand loop's metric_average."""
    trainer = _trainer()
    try:
        stats = [trainer.train() for _ in range(EPOCHS)]
        val = trainer.validate()
        weights = trainer.get_model().state_dict()
        per_rank = trainer.apply_all_operators(lambda op: op.model.state_dict())
    finally:
        trainer.shutdown()
    reference, losses = hand_reference

    assert _max_diff(weights, reference) == 0.0
    assert all(_max_diff(w, reference) == 0.0 for w in per_rank)
    assert [s["epoch"] for s in stats] == [1, 2]
    assert [s["train_loss"] for s in stats] == pytest.approx(losses, rel=1e-12, abs=0)
    # 64 samples in 2 shards of 4 batches of 8, the per-epoch StepLR applied.
    assert [(s["num_samples"], s["batch_count"]) for s in stats] == [(64, 8)] * EPOCHS
    assert [s["lr"] for s in stats] == pytest.approx([0.05, 0.025])
    assert stats[1]["train_loss"] < stats[0]["train_loss"]
    # Validation: 32 samples, 16 per worker, accuracy a fraction.
    assert val["num_samples"] == 32 and 0.0 <= val["val_accuracy"] <= 1.0
    assert val["val_loss"] > 0


def test_use_fp16_runs_autocast_with_a_gradient_scaler(hand_reference):
    """On a CPU, use_fp16 means bfloat16 autocast and a GradScaler: the
    forward pass runs in bfloat16, the ranks stay identical, and the weights
    end close to the float32 run's but not equal to them."""
    trainer = _trainer(use_fp16=True)
    try:
        stats = [trainer.train() for _ in range(EPOCHS)]
        dtypes = trainer.apply_all_operators(lambda op: sorted(op.output_dtypes))
        per_rank = trainer.apply_all_operators(lambda op: op.model.state_dict())
        state = trainer.state_dict()
    finally:
        trainer.shutdown()
    reference, losses = hand_reference

    assert dtypes == [["torch.bfloat16"], ["torch.bfloat16"]]
    assert _max_diff(per_rank[0], per_rank[1]) == 0.0
    assert state["scaler"] is not None and state["scaler"]["scale"] > 0
    diff = _max_diff(per_rank[0], reference)
    # bfloat16 keeps 8 significant bits (relative error 2^-9 per rounding);
    # after 16 small steps the weights (|w| < 1) move by well under 0.05.
    assert 0.0 < diff < 0.05, diff
    print(f"\nuse_fp16 (bfloat16) vs float32 after {EPOCHS} epochs: max |dw| {diff:.2e}")
    assert stats[-1]["train_loss"] == pytest.approx(losses[-1], rel=0.05)


def test_save_and_load_resume_training_exactly(tmp_path):
    """save() after epoch 1 and load() into a new trainer: its epoch 2 gives
    the weights, loss, learning rate and epoch count of an uninterrupted
    run's epoch 2 (momentum buffers, scheduler and counters all restored)."""
    path = str(tmp_path / "trainer.pt")
    trainer = _trainer()
    try:
        trainer.train()
        trainer.save(path)
        uninterrupted = trainer.train()
        expected = trainer.get_model().state_dict()
    finally:
        trainer.shutdown()

    resumed = _trainer()
    try:
        resumed.load(path)
        stats = resumed.train()
        weights = resumed.get_model().state_dict()
    finally:
        resumed.shutdown()
    assert _max_diff(weights, expected) == 0.0
    assert stats == uninterrupted
    saved = torch.load(path, weights_only=False)
    assert saved["epoch"] == 1 and saved["global_step"] == 4
    assert set(saved) == {"epoch", "global_step", "models", "optimizers", "schedulers", "scaler",
                          "operator"}  # fmt: skip


def test_worker_failure_names_rank_host_and_traceback():
    trainer = _trainer(config={**CONFIG, "fail_rank": 1})
    try:
        with pytest.raises(WorkerFailure) as info:
            trainer.train()
        error = info.value
        assert error.rank == 1 and error.host
        assert "ValueError: rank 1 fails on purpose" in str(error)
        assert "in train_batch" in error.remote_traceback
        with pytest.raises(RuntimeError, match="stopped after a failure"):
            trainer.validate()
    finally:
        trainer.shutdown()


def test_digits_example_trains_and_scores_rank_0s_model(tmp_path):
    out = run_example(
        "ray_trainer_digits.py", "--address", ray_address(), "--epochs", "3",
        "--checkpoint", str(tmp_path / "digits.pt"),
    )  # fmt: skip
    pattern = r"^epoch (\d+): train_loss ([0-9.]+) .*val_accuracy ([0-9.]+)"
    epochs = re.findall(pattern, out, re.MULTILINE)
    assert [int(e) for e, _, _ in epochs] == [1, 2, 3], out
    assert float(epochs[-1][1]) < float(epochs[0][1])
    final = re.search(r"rank 0's model on the driver: accuracy ([0-9.]+) on 299", out)
    assert final and float(final.group(1)) > 0.7, out
    assert (tmp_path / "digits.pt").exists()


def test_two_models_with_their_own_optimizers():
    """register() with lists (a GAN's shape) and a train_batch of the user's:
    both models train, identically on both workers, and both are saved."""
    trainer = TorchTrainer(training_operator_cls=TwoModelOperator, num_workers=2,
                           config={"lr": 0.1})  # fmt: skip
    try:
        first, second = trainer.train(), trainer.train()
        per_rank = trainer.apply_all_operators(
            lambda op: [m.state_dict() for m in op.models]
        )
        models = trainer.get_model()
        state = trainer.state_dict()
    finally:
        trainer.shutdown()
    assert isinstance(models, list) and len(models) == 2
    assert len(state["models"]) == len(state["optimizers"]) == 2
    for i in range(2):
        assert _max_diff(per_rank[0][i], per_rank[1][i]) == 0.0
        assert _max_diff(models[i].state_dict(), per_rank[0][i]) == 0.0
        assert second[f"loss_{i}"] < first[f"loss_{i}"]
    # Different seeds: two different models, not one trained twice.
    assert _max_diff(per_rank[0][0], per_rank[0][1]) > 0
