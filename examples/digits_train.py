"""Digits classifier trained with Horovod's training API: resumable, checked at the end.

    hvdrun -np 2 python examples/digits_train.py
    hvdrun -np 2 python examples/digits_train.py --epochs 20 --checkpoint /tmp/run.pt
    hvdrun -np 2 python examples/digits_train.py --no-resume     (ignore a saved checkpoint)
    hvdrun -np 2 python examples/digits_train.py --logdir /tmp/tb  (TensorBoard logs)

What examples/digits_allreduce.py does by hand, this does the way Horovod's
pytorch_imagenet_resnet50.py does, on scikit-learn's digits (nothing downloaded):
  - hvd.DistributedOptimizer averages the gradients: a hook per parameter starts
    its allreduce as soon as backward has produced it, and step() waits for them;
  - the learning rate is the single-rank rate times hvd.size() (the global batch
    is size times larger), reached by a linear warm-up over --warmup-epochs
    (hvd.warmup_scheduler, stepped every batch); with --use-adasum the ranks'
    updates are combined by Adasum instead (op=hvd.Adasum) and the rate is not
    scaled, as in Horovod's examples;
  - a DistributedSampler gives every rank its shard; set_epoch reshuffles it;
  - each rank scores its shard of the validation set and metric_average averages
    the accuracies over ranks;
  - rank 0 writes a checkpoint (model, optimizer, scheduler, epoch) after every
    epoch. On start rank 0 looks for it, broadcast_object tells every rank the
    epoch to resume from (and the scheduler's position), and
    broadcast_parameters/broadcast_optimizer_state give rank 0's state to all.
    The same broadcasts make a fresh start begin from rank 0's weights (each
    rank seeds its model differently on purpose, so a missed broadcast would
    show). Resume with the same number of ranks: the warm-up schedule restored
    from the checkpoint keeps the size it was saved with;
  - at the end the ranks compare a checksum of their weights (allgather_object)
    and the script exits with 1 if any rank differs.
  - monitoring (rank 0 only): a tqdm progress bar per epoch when tqdm is installed,
    and with --logdir, TensorBoard scalars per epoch: train/loss, val/accuracy,
    train/samples_per_sec (all ranks together), train/comm_seconds (time spent
    waiting for the gradient allreduces in optimizer.synchronize()), train/lr.
    Writer: torch.utils.tensorboard (pip install tensorboard, or hvd-torch's
    [tensorboard] extra), else tensorboardX; `tensorboard --logdir /tmp/tb` shows them.

examples/digits_train_scripted.py reuses train() with a TorchScript model.
"""

import argparse
import hashlib
import os
import sys
import time

import torch
import torch.nn.functional as F
from torch.utils.data import DataLoader, TensorDataset
from torch.utils.data.distributed import DistributedSampler

import hvd_torch as hvd
from digits_allreduce import DigitsNet, load_data
from progress import progress

DEFAULT_CHECKPOINT = "/tmp/digits_ckpt.pt"


def summary_writer_class():
    """TensorBoard's SummaryWriter: torch.utils.tensorboard's (needs the tensorboard
    package), else tensorboardX's. Checked on every rank before init(), so a missing
    package stops the job at once instead of failing rank 0 alone mid-run."""
    try:
        from torch.utils.tensorboard import SummaryWriter
    except ImportError:
        try:
            from tensorboardX import SummaryWriter
        except ImportError:
            sys.exit("--logdir needs TensorBoard's writer: pip install tensorboard "
                     "(or pip install 'hvd-torch[tensorboard]'), or tensorboardX")
    return SummaryWriter


def parse_args(argv=None, checkpoint=DEFAULT_CHECKPOINT, description=None):
    p = argparse.ArgumentParser(description=description or __doc__.split("\n")[0])
    p.add_argument("--epochs", type=int, default=10, help="total epochs, resumed ones included")
    p.add_argument("--batch-size", type=int, default=32, help="per rank")
    p.add_argument("--lr", type=float, default=0.025, help="single-rank rate; x size()")
    p.add_argument("--momentum", type=float, default=0.9)
    p.add_argument("--warmup-epochs", type=float, default=1.0)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--checkpoint", default=checkpoint, help="written by rank 0 every epoch")
    p.add_argument("--device", choices=["cpu", "cuda"], default="cpu",
                   help="cuda: each rank trains on GPU local_rank %% visible GPUs")
    p.add_argument("--logdir", default=None,
                   help="write TensorBoard scalars here (rank 0; needs tensorboard or tensorboardX)")
    p.add_argument("--use-adasum", action="store_true",
                   help="combine the ranks' updates with Adasum (op=hvd.Adasum), as Horovod's "
                        "examples do; the rate is then not scaled by size()")
    p.add_argument(
        "--resume",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="continue from --checkpoint if it exists (default: yes)",
    )
    return p.parse_args(argv)


def make_loaders(args):
    """Every rank builds the same split; the samplers hand each rank its shard."""
    (x_train, y_train), (x_val, y_val) = load_data(args.seed)
    train_set, val_set = TensorDataset(x_train, y_train), TensorDataset(x_val, y_val)
    train_sampler = DistributedSampler(
        train_set, num_replicas=hvd.size(), rank=hvd.rank(), shuffle=True, seed=args.seed
    )
    # Validation shards are padded to equal length by repeating a few samples (at
    # most size - 1), like Horovod's examples; the average moves by well under 1%.
    val_sampler = DistributedSampler(
        val_set, num_replicas=hvd.size(), rank=hvd.rank(), shuffle=False
    )
    train_loader = DataLoader(train_set, batch_size=args.batch_size, sampler=train_sampler)
    val_loader = DataLoader(val_set, batch_size=256, sampler=val_sampler)
    return train_sampler, train_loader, val_loader


def resume(args, model, optimizer, scheduler):
    """Returns the epoch to start from; on return every rank holds rank 0's state.

    Only rank 0 reads the file (on a cluster, only it may see it); the others
    get the epoch and the scheduler's position from broadcast_object, and the
    weights and optimizer state from the two broadcasts.
    """
    epoch = 0
    if hvd.rank() == 0 and args.resume and os.path.exists(args.checkpoint):
        state = torch.load(args.checkpoint, map_location="cpu")
        model.load_state_dict(state["model"])
        optimizer.load_state_dict(state["optimizer"])
        scheduler.load_state_dict(state["scheduler"])
        epoch = state["epoch"]
    epoch, schedule = hvd.broadcast_object((epoch, scheduler.state_dict()), root_rank=0,
                                           name="resume")
    scheduler.load_state_dict(schedule)
    hvd.broadcast_parameters(model.state_dict(), root_rank=0)
    hvd.broadcast_optimizer_state(optimizer, root_rank=0)
    return epoch


def save_checkpoint(path, model, optimizer, scheduler, epochs_done):
    """Rank 0 only. Written to a temporary file and renamed, so a run killed while
    saving leaves the previous checkpoint intact."""
    state = {
        "epoch": epochs_done,
        "model": model.state_dict(),
        "optimizer": optimizer.state_dict(),
        "scheduler": scheduler.state_dict(),
    }
    tmp = f"{path}.tmp{os.getpid()}"
    torch.save(state, tmp)
    os.replace(tmp, path)


def train_epoch(model, optimizer, scheduler, loader, sampler, epoch, args):
    """One epoch; returns (mean training loss over all ranks, samples this rank
    trained on, seconds this rank waited for the gradient allreduces)."""
    model.train()
    sampler.set_epoch(epoch)  # a new shuffle every epoch, the same on every rank
    loss_sum, samples, comm = 0.0, 0, 0.0
    bar = progress(
        loader,
        desc=f"epoch {epoch + 1}/{args.epochs}",
        unit="batch",
        disable=hvd.rank() != 0,
        mininterval=1.0,
    )
    for x, y in bar:
        x, y = x.to(args.device), y.to(args.device)
        optimizer.zero_grad()
        loss = F.cross_entropy(model(x), y)
        loss.backward()  # each gradient's allreduce starts here, from its hook
        waited = time.perf_counter()
        if args.use_adasum:
            optimizer.step()  # steps locally, then combines the ranks' updates
            comm += time.perf_counter() - waited
        else:
            optimizer.synchronize()  # waits for the allreduces (Horovod's explicit form)
            comm += time.perf_counter() - waited
            with optimizer.skip_synchronize():
                optimizer.step()  # applies the averaged gradients
        scheduler.step()  # per batch: the warm-up is linear in steps
        loss_sum += loss.item() * len(y)
        samples += len(y)
        bar.set_postfix(loss=f"{loss.item():.3f}", refresh=False)
    bar.close()
    return hvd.metric_average(loss_sum / samples, name="train_loss"), samples, comm


@torch.no_grad()
def validate(model, loader, device="cpu"):
    """This rank's accuracy on its shard, averaged over ranks."""
    model.eval()
    correct = total = 0
    for x, y in loader:
        x, y = x.to(device), y.to(device)
        correct += (model(x).argmax(1) == y).sum().item()
        total += len(y)
    return hvd.metric_average(correct / total, name="val_accuracy")


def checksum(model):
    """sha256 of every parameter and buffer: ranks that applied the same averaged
    gradients to the same starting state agree bit for bit."""
    h = hashlib.sha256()
    for name, t in model.state_dict().items():
        h.update(name.encode())
        h.update(t.detach().cpu().contiguous().numpy().tobytes())
    return h.hexdigest()[:16]


def train(args, prepare_model=None):
    """The whole run; returns the process exit code. prepare_model, when given,
    transforms the model before the optimizer sees its parameters (e.g. torch.jit.script)."""
    writer_class = summary_writer_class() if args.logdir else None
    hvd.init()
    # One thread per rank: the ranks share the machine's cores.
    torch.set_num_threads(1)
    rank, size = hvd.rank(), hvd.size()
    log = print if rank == 0 else (lambda *a, **k: None)

    if args.device == "cuda":
        # Horovod's convention: one GPU per local rank (ranks share when there are fewer).
        torch.cuda.set_device(hvd.local_rank() % torch.cuda.device_count())
        args.device = torch.device("cuda", torch.cuda.current_device())
    torch.manual_seed(args.seed + rank)  # different on purpose: the broadcasts must fix it
    model = DigitsNet().to(args.device)
    if prepare_model is not None:
        model = prepare_model(model)
    # Adasum adds independent updates and averages parallel ones: no rate scaling.
    lr_scale = 1 if args.use_adasum else size
    optimizer = torch.optim.SGD(model.parameters(), lr=args.lr * lr_scale,
                                momentum=args.momentum)
    optimizer = hvd.DistributedOptimizer(
        optimizer, named_parameters=model.named_parameters(),
        op=hvd.Adasum if args.use_adasum else hvd.Average
    )
    sampler, train_loader, val_loader = make_loaders(args)
    # From args.lr on the first batch linearly to args.lr * size after the warm-up.
    scheduler = hvd.warmup_scheduler(optimizer, args.warmup_epochs, len(train_loader), args.lr,
                                     size=lr_scale)
    start_epoch = resume(args, model, optimizer, scheduler)

    log(
        f"{size} rank(s), {type(model).__name__}, {len(sampler.dataset)} training images, "
        f"{len(train_loader)} steps of {args.batch_size} per rank per epoch, "
        f"lr {args.lr} x {lr_scale} after {args.warmup_epochs:g} warm-up epoch(s)"
        + (", Adasum" if args.use_adasum else "")
    )
    if start_epoch > 0:
        log(f"resuming from epoch {start_epoch} (checkpoint {args.checkpoint})")
    if start_epoch >= args.epochs:
        log(f"nothing to train: the checkpoint has {start_epoch} of {args.epochs} epochs")
    writer = writer_class(args.logdir) if writer_class is not None and rank == 0 else None
    started = time.perf_counter()
    for epoch in range(start_epoch, args.epochs):
        epoch_start = time.perf_counter()
        loss, samples, comm = train_epoch(model, optimizer, scheduler, train_loader, sampler,
                                          epoch, args)
        seconds = time.perf_counter() - epoch_start
        accuracy = validate(model, val_loader, args.device)
        if rank == 0:
            save_checkpoint(args.checkpoint, model, optimizer, scheduler, epoch + 1)
        if writer is not None:
            step = epoch + 1
            writer.add_scalar("train/loss", loss, step)
            writer.add_scalar("val/accuracy", accuracy, step)
            writer.add_scalar("train/samples_per_sec", samples * size / seconds, step)
            writer.add_scalar("train/comm_seconds", comm, step)
            writer.add_scalar("train/lr", optimizer.param_groups[0]["lr"], step)
            writer.flush()
        log(
            f"epoch {epoch + 1:2d}/{args.epochs}  loss {loss:.4f}  "
            f"val accuracy {100 * accuracy:5.1f}%  lr {optimizer.param_groups[0]['lr']:.3f}  "
            f"({time.perf_counter() - started:.1f}s)"
        )

    if writer is not None:
        writer.close()
    sums = hvd.allgather_object(checksum(model))
    if len(set(sums)) != 1:
        print(
            f"rank {rank}: weights differ across ranks: "
            + ", ".join(f"rank {r}: {s}" for r, s in enumerate(sums)),
            file=sys.stderr,
        )
        return 1
    log(f"all {size} ranks hold identical weights (sha256 prefix {sums[0]})")
    return 0


def main():
    return train(parse_args())


if __name__ == "__main__":
    sys.exit(main())
