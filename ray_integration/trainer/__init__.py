"""Ray SGD's trainer API on hvd-torch: TrainingOperator, TorchTrainer,
TorchTrainer.as_trainable for Tune. See docs/ray.md, "Trainer".

| module | one job |
|---|---|
| training_operator.py | TrainingOperator: the user's setup, register(), the default loops |
| precision.py | use_fp16: autocast and the gradient scaler with DistributedOptimizer |
| metrics.py | batch metrics into epoch metrics, workers' into the trainer's |
| sharding.py | a DataLoader re-made with a DistributedSampler for this rank |
| runner.py | OperatorRunner: one worker's operator and the trainer's calls on it |
| elastic_call.py | one trainer call as an elastic job that resumes from the epoch's start |
| torch_trainer.py | TorchTrainer: the driver |
| trainable.py | as_trainable: a Tune class trainable per TorchTrainer |

training_operator, precision, metrics, sharding, runner and elastic_call
import nothing of Ray (they run on the workers); torch_trainer and trainable
drive Ray. Names are resolved on first use (PEP 562), as in the parent
package, so a worker that unpickles an OperatorRunner loads only its side.
"""

import importlib

_EXPORTS = {
    "NUM_SAMPLES": ".metrics",
    "TorchTrainer": ".torch_trainer",
    "TrainingOperator": ".training_operator",
}

__all__ = ["NUM_SAMPLES", "TorchTrainer", "TrainingOperator"]


def __getattr__(name):
    if name not in _EXPORTS:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(_EXPORTS[name], __name__), name)
    globals()[name] = value
    return value


def __dir__():
    return __all__
