"""One Lightning run of examples/lightning_digits.py, every rank reporting what it saw.

    python tests/harness/lightning_job.py --out DIR --devices 3 [the example's options]
    hvdrun -np 3 python tests/harness/lightning_job.py --out DIR [--hvd-init] [...]

The example's train() with its model, plus two metrics logged with sync_dist whose
synced value is known in advance (this rank's number: mean and max over ranks), and a
callback that keeps this rank's weights when training starts and every batch's loss
and size. Each rank writes DIR/rank<r>.json: backend, Lightning's cluster environment,
rank and size, the start and final weights, the losses per epoch and Trainer's
callback_metrics (the synced values). --hvd-init calls hvd.init() before the Trainer
exists, as an elastic hvdrun worker must (it learns its rank there).

Run as a script only: it imports Lightning, which the test process need not.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "examples"))

import lightning_digits as example  # noqa: E402
import pytorch_lightning as pl  # noqa: E402
import torch.distributed as dist  # noqa: E402


class RankLoggingModule(example.DigitsModule):
    def training_step(self, batch, batch_idx):
        rank = float(self.global_rank)
        self.log("rank_mean", rank, on_step=False, on_epoch=True, sync_dist=True)
        self.log("rank_max", rank, on_step=False, on_epoch=True, sync_dist=True, reduce_fx="max")
        return super().training_step(batch, batch_idx)


class Recorder(pl.Callback):
    """This rank's weights at the start (after DDP's broadcast or the checkpoint's
    restore) and each epoch's [loss, batch size] pairs."""

    def __init__(self):
        self.start, self.epochs = None, {}

    def on_train_start(self, trainer, module):
        self.start = example.weights(module).tolist()

    def on_train_batch_end(self, trainer, module, outputs, batch, batch_idx):
        step = [outputs["loss"].item(), len(batch[0])]
        self.epochs.setdefault(trainer.current_epoch, []).append(step)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--out", required=True, help="the folder for rank<r>.json")
    p.add_argument("--hvd-init", action="store_true", help="hvd.init() before the Trainer")
    own, rest = p.parse_known_args(argv)
    if own.hvd_init:
        import hvd_torch as hvd

        hvd.init()
    args = example.parse_args(rest)
    recorder = Recorder()
    trainer, model = example.train(args, RankLoggingModule, [recorder])
    report = {
        "rank": trainer.global_rank, "size": trainer.world_size,
        "backend": dist.get_backend(),
        "environment": type(trainer.strategy.cluster_environment).__name__,
        "epochs_done": trainer.current_epoch,
        "start": recorder.start, "final": example.weights(model).tolist(),
        "losses": recorder.epochs,
        "metrics": {k: v.item() for k, v in trainer.callback_metrics.items()},
    }  # fmt: skip
    out = Path(own.out) / f"rank{trainer.global_rank}.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_suffix(".tmp")
    tmp.write_text(json.dumps(report))
    os.replace(tmp, out)  # a reader never sees half a report
    # On hvd too: Lightning makes a Gloo group of its own (examples/lightning_digits.py).
    example.exit_now(0)  # gloo's threads may abort the interpreter's exit


if __name__ == "__main__":
    sys.exit(main())
