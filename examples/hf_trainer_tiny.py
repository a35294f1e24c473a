r"""The Hugging Face Transformers Trainer on the "hvd" torch.distributed backend, on CPU.

    torchrun --nproc-per-node 2 examples/hf_trainer_tiny.py
    hvdrun -np 2 python examples/hf_trainer_tiny.py
    accelerate launch --multi_gpu --num_processes 2 --main_process_port 0 \
        examples/hf_trainer_tiny.py
    ... examples/hf_trainer_tiny.py --backend gloo    (the Trainer's own CPU backend, to compare)

A tiny BERT (2 layers, hidden 32, vocabulary 100) made from a config in code, trained
a few steps on random token sequences made in code (label: is the first token below
50?), so nothing is downloaded; the Hub is switched off all the same.

The Trainer makes its process group through Accelerate, which maps every CPU job to
gloo and refuses `TrainingArguments(ddp_backend="hvd")` ("Your assigned backend hvd
is not available, please use gloo"). It adopts a group that already exists, so the
script creates it first: hvd_torch.integrations.accelerate.partial_state(), before
TrainingArguments (a plain `dist.init_process_group("hvd")` there works the same).
TrainingArguments then makes Accelerate's state anew, which labels the adopted group
"gloo" (`dist.get_backend()` says "hvd"); `accelerator_config={"use_configured_state":
True}` keeps the helper's state, label and all. `use_cpu=True` is what makes the
Trainer distribute at all on a machine without GPUs: without it (on gloo as on hvd)
every rank trains alone on the group's world, and the ranks' weights drift apart.

With --out DIR every rank saves its start and end weights, its loss and the group's
backend to DIR/rank<r>.pt.
"""

import argparse
import os
import tempfile

os.environ.setdefault("HF_HUB_OFFLINE", "1")  # before transformers reads them
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402
from ddp_on_hvd import exit_now  # noqa: E402
from transformers import (BertConfig, BertForSequenceClassification, Trainer,  # noqa: E402
                          TrainingArguments)

from hvd_torch.integrations.accelerate import partial_state  # noqa: E402

VOCAB, SEQ = 100, 16


def parse_args():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--backend", default="hvd", choices=["hvd", "gloo"])
    p.add_argument("--steps", type=int, default=4, help="optimizer steps")
    p.add_argument("--batch-size", type=int, default=4, help="per process")
    p.add_argument("--optim", default="adamw_torch", help="TrainingArguments(optim=...)")
    p.add_argument("--out", help="folder for each rank's rank<r>.pt")
    return p.parse_args()


class RandomTokens(torch.utils.data.Dataset):
    """Token sequences drawn once from a fixed seed: the same on every rank."""

    def __init__(self, n: int = 128):
        g = torch.Generator().manual_seed(0)
        self.ids = torch.randint(1, VOCAB, (n, SEQ), generator=g)

    def __len__(self):
        return len(self.ids)

    def __getitem__(self, i):
        ids = self.ids[i]
        return {"input_ids": ids, "attention_mask": torch.ones_like(ids),
                "labels": (ids[0] < VOCAB // 2).long()}


def tiny_bert():
    torch.manual_seed(0)
    return BertForSequenceClassification(BertConfig(
        vocab_size=VOCAB, hidden_size=32, num_hidden_layers=2, num_attention_heads=2,
        intermediate_size=64, max_position_embeddings=SEQ, num_labels=2,
        hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0))  # no dropout: runs compare


def group_backend() -> str:
    """The process group's backend; a plain `python` run has none (one process)."""
    return dist.get_backend() if dist.is_initialized() else "none"


def weights(model) -> torch.Tensor:
    return torch.cat([p.detach().reshape(-1).clone() for p in model.parameters()])


def main(args):
    if args.backend == "hvd":
        partial_state()  # the group on "hvd"; TrainingArguments' Accelerate adopts it
    model = tiny_bert()
    start = weights(model)
    with tempfile.TemporaryDirectory() as scratch:
        targs = TrainingArguments(
            output_dir=scratch, use_cpu=True, max_steps=args.steps,
            per_device_train_batch_size=args.batch_size, optim=args.optim, learning_rate=1e-2,
            seed=0, report_to="none", save_strategy="no", logging_steps=1, disable_tqdm=True,
            dataloader_num_workers=0, ddp_find_unused_parameters=False)
        trainer = Trainer(model=model, args=targs, train_dataset=RandomTokens())
        result = trainer.train()
    rank = targs.process_index
    if rank == 0:
        print(f"trained {result.global_step} steps  loss {result.training_loss:.4f}  "
              f"(backend {group_backend()}, {targs.world_size} processes)", flush=True)
    if args.out:
        os.makedirs(args.out, exist_ok=True)
        torch.save({"rank": rank, "size": targs.world_size, "backend": group_backend(),
                    "start": start, "end": weights(trainer.model), "loss": result.training_loss},
                   os.path.join(args.out, f"rank{rank}.pt"))
    if dist.is_initialized():
        dist.barrier()  # every rank has saved before any tears the group down
        dist.destroy_process_group()


if __name__ == "__main__":
    ARGS = parse_args()
    main(ARGS)
    if ARGS.backend == "gloo":
        exit_now(0)  # torch's gloo threads outlive DDP's group at exit (see ddp_on_hvd.py)
