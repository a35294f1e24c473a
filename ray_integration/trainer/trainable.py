"""TorchTrainer.as_trainable: a Tune class trainable whose every trial is a
TorchTrainer.

    trainable = TorchTrainer.as_trainable(training_operator_cls=MyOperator,
                                          num_workers=2, use_fp16=False)
    tune.Tuner(trainable, param_space={"lr": tune.loguniform(1e-3, 1e-1)}, ...)

The trial asks for its workers' resources itself (default_resource_request: a
placement group of an empty head bundle for the trainable and one bundle per
worker), so resources_per_trial / tune.with_resources are neither needed nor
allowed (Tune refuses both), as with Ray SGD. The trainer's workers go into the
trial's bundles (RayExecutor's use_current_placement_group). Each step() is one
train() and, if the operator registered a validation_loader, one validate():
Tune gets both metric sets (validation keys that clash with training ones get a
"val_" prefix: val_num_samples, val_batch_count). save_checkpoint and
load_checkpoint write and read the trainer's full state, so schedulers that
pause, stop and resume trials (ASHA, PBT) work. reset_config is implemented:
with reuse_actors=True a new or mutated trial reuses the trainable and its
running workers (a new operator from the new config on each), which saves
starting processes at every trial and every PBT exploit.

PBT's exploit restores another trial's checkpoint into a trial with a mutated
config. The operator's setup(config) has built the optimizers from the new
config; the checkpoint's optimizer state would bring the old trial's lr and
momentum back. So when the checkpoint was written under a different config,
the optimizers keep their settings from setup() and take only the
per-parameter state (momentum buffers, ...) from the checkpoint.
"""

from __future__ import annotations

import json
import os

from ray import tune

from .checkpoint_files import load_checkpoint, save_private

__all__ = ["make_trainable"]

_CHECKPOINT_FILE = "trainer.pt"
# Fixed by the trial's placement group, or decided per trial by Tune.
_REFUSED = ("min_workers", "max_workers", "reset_limit", "elastic_timeout")


def make_trainable(
    trainer_cls,
    training_operator_cls,
    *,
    num_workers: int = 1,
    num_cpus_per_worker: float = 1,
    use_gpu: bool = False,
    config: dict | None = None,
    override_tune_step=None,
    **trainer_kwargs,
):
    """The trainable class (see the module doc). config: defaults under each
    trial's config. override_tune_step(trainer, info) -> metrics replaces the
    default step (info: {"iteration": trials's training_iteration})."""
    refused = [k for k in _REFUSED if k in trainer_kwargs]
    if refused:
        raise ValueError(
            f"as_trainable: {', '.join(refused)} not supported: a Tune trial's placement "
            "group has a fixed number of workers"
        )
    if "resources_per_trial" in trainer_kwargs:
        raise ValueError("as_trainable: the trainable requests its resources itself")
    if use_gpu == "auto":
        raise ValueError("as_trainable: use_gpu must be True or False (the trial's resources)")
    bundle = {"CPU": num_cpus_per_worker, **({"GPU": 1} if use_gpu else {})}
    base_config = dict(config or {})

    class TorchTrainable(tune.Trainable):
        @classmethod
        def default_resource_request(cls, config):
            # The head bundle is the trainable's own actor: it only drives.
            return tune.PlacementGroupFactory([{}] + [dict(bundle)] * num_workers,
                                              strategy="PACK")  # fmt: skip

        def setup(self, config):
            self._trial_config = {**base_config, **config}
            self.trainer = trainer_cls(
                training_operator_cls=training_operator_cls,
                config=self._trial_config,
                num_workers=num_workers,
                num_cpus_per_worker=num_cpus_per_worker,
                use_gpu=use_gpu,
                **trainer_kwargs,
            )

        def step(self):
            if override_tune_step is not None:
                return override_tune_step(self.trainer, {"iteration": self.training_iteration})
            stats = dict(self.trainer.train())
            if self.trainer.has_validation:
                for key, value in self.trainer.validate().items():
                    stats[f"val_{key}" if key in stats else key] = value
            return stats

        def reset_config(self, new_config):
            # reuse_actors=True: a new trial (or PBT's mutated config) on this
            # actor and its running workers; no processes start.
            self._trial_config = {**base_config, **new_config}
            self.trainer.reset(self._trial_config)
            return True

        def save_checkpoint(self, checkpoint_dir):
            """Returns None: the directory is the checkpoint. The trial's config
            travels as text (_config_text), so the file loads weights-only."""
            path = os.path.join(checkpoint_dir, _CHECKPOINT_FILE)
            save_private({"trainer": self.trainer.state_dict(),
                          "config": _config_text(self._trial_config)}, path)  # fmt: skip

        def load_checkpoint(self, checkpoint):
            path = os.path.join(checkpoint, _CHECKPOINT_FILE)
            saved = load_checkpoint(path)
            mutated = saved["config"] != _config_text(self._trial_config)
            self.trainer.load_state_dict(saved["trainer"], keep_hyperparameters=mutated)

        def cleanup(self):
            self.trainer.shutdown()

    name = f"{training_operator_cls.__name__}Trainable"
    TorchTrainable.__name__ = TorchTrainable.__qualname__ = name
    return TorchTrainable


def _config_text(config: dict) -> str:
    """A trial config as text, for telling whether a restored checkpoint came from
    another config (PBT's exploit): values JSON cannot hold (a model creator) by
    their qualified name, which is the same in every process."""
    def name(value):
        return getattr(value, "__qualname__", None) or type(value).__qualname__

    return json.dumps(config, sort_keys=True, default=name)
