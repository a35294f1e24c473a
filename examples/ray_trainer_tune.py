"""Ray Tune over TorchTrainer trials: ASHA over learning rate and momentum for the digits.

    python examples/ray_trainer_tune.py                 (4 trials of 2 workers, ASHA)
    python examples/ray_trainer_tune.py --num-samples 8 --epochs 6 --csv /tmp/results.csv
    python examples/ray_trainer_tune.py --address auto  (an existing cluster)

TorchTrainer.as_trainable turns examples/ray_trainer_digits.py's
DigitsOperator into a Tune trainable: each trial is a TorchTrainer with
--num-workers workers in the trial's own placement group (the trainable asks
for them; no resources_per_trial), each step one train() and one validate(),
and checkpoints are the trainer's state. ASHA stops poor trials after their
first epochs. The script uses tune.run with a CLIReporter, as Ray SGD's
tutorials did (tune.Tuner works the same way), prints the best config and
writes the results table (one row per trial) to CSV.
"""

import argparse
import os
import tempfile

import ray
import ray_trainer_digits  # this script's directory is on sys.path
from ray import tune
from ray.tune import CLIReporter
from ray.tune.schedulers import ASHAScheduler
from ray_trainer_digits import DigitsOperator

from ray_integration import TorchTrainer

# The workers cannot import this directory's modules: send the operator (and
# the model it builds) by value, as if it were defined in this script.
ray.cloudpickle.register_pickle_by_value(ray_trainer_digits)


def parse_args():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--num-samples", type=int, default=4, help="trials")
    p.add_argument("--epochs", type=int, default=5, help="per trial, at most (ASHA's max_t)")
    p.add_argument("--num-workers", type=int, default=2, help="per trial")
    p.add_argument("--concurrent", type=int, default=2, help="trials at once on a local Ray")
    p.add_argument("--address", default=None, help="a running cluster, e.g. auto")
    p.add_argument("--storage", default=None, help="Tune's results (default: a temp dir)")
    p.add_argument("--csv", default=None, help="the results table (default: in --storage)")
    return p.parse_args()


def main():
    args = parse_args()
    if args.address:
        ray.init(address=args.address)
    else:
        # Logical CPUs: enough for --concurrent trials of --num-workers workers.
        cpus = max(os.cpu_count() or 1, args.concurrent * args.num_workers)
        ray.init(address="local", num_cpus=cpus, include_dashboard=False)
    storage = args.storage or tempfile.mkdtemp(prefix="hvd-trainer-tune-")
    # Tune prints its own tables unless told to use the older reporters, which
    # it otherwise ignores (with a warning): let the CLIReporter below print.
    os.environ.setdefault("RAY_AIR_NEW_OUTPUT", "0")

    trainable = TorchTrainer.as_trainable(
        training_operator_cls=DigitsOperator,
        num_workers=args.num_workers,
        scheduler_step_freq="batch",
        config={"batch_size": 32},
    )
    analysis = tune.run(
        trainable,
        config={"lr": tune.loguniform(1e-3, 3e-1), "momentum": tune.uniform(0.5, 0.95)},
        num_samples=args.num_samples,
        metric="val_accuracy",
        mode="max",
        scheduler=ASHAScheduler(max_t=args.epochs, grace_period=1, reduction_factor=2),
        # A new trial takes over a finished one's trainable and workers
        # (reset_config builds its operator there): no processes to start.
        reuse_actors=True,
        stop={"training_iteration": args.epochs},
        progress_reporter=CLIReporter(
            parameter_columns=["lr", "momentum"],
            metric_columns=["train_loss", "val_loss", "val_accuracy", "training_iteration"],
        ),
        storage_path=storage,
        verbose=1,
    )
    best = analysis.best_trial
    table = args.csv or os.path.join(storage, "results.csv")
    analysis.results_df.to_csv(table)
    print(
        f"best config: lr={best.config['lr']:.4g} momentum={best.config['momentum']:.3f} "
        f"(val_accuracy {best.last_result['val_accuracy']:.3f} after "
        f"{best.last_result['training_iteration']} epochs; {len(analysis.trials)} trials)"
    )
    print(f"results table: {table}")


if __name__ == "__main__":
    main()
