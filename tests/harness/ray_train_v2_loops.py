"""The Ray Train v2 tests' training loops (tests/integrations/test_ray_train_v2.py).

One tiny problem (mlp_reference's data and MLP, ROWS rows as a Ray Data
dataset) trained three ways, on whichever trainer the test picks:

- hvd_loop: Horovod's API, as a HorovodTrainer user writes it (hvd.init(),
  DistributedOptimizer, broadcast_parameters): HvdTrainer;
- ddp_loop: ray.train.torch.prepare_model's DDP over the default group:
  TorchTrainer, on "hvd" or on "gloo" (the reference).

Every rank reads its whole Ray Data shard (get_dataset_shard) once and takes
full-batch steps on it. The shards are equal in size, so the averaged gradient
is the mean over all rows whichever rows a rank got: runs agree within float
rounding even though Ray Data may split the rows differently each time. Every
config["checkpoint_every"] steps, ray.train.report with a checkpoint of rank
0's model, optimizer and step; a (re)started loop resumes from
ray.train.get_checkpoint().

What the test checks goes to files under config["out"], one per rank and
process (JSON at start, the weights at the end): Result.metrics holds rank 0's
only. Workers import this module by name (tests/harness is on their PYTHONPATH).
"""

from __future__ import annotations

import json
import os
import signal
import tempfile
import time
from pathlib import Path

import mlp_reference
import torch
import torch.nn.functional as F

ROWS = 48  # divisible by 2 and 3: equal shards
# A report every checkpoint_every steps: a worker holds one unread report, so a
# report waits until the controller's poll (every 2 s) took the one before; a
# report per step would cost most of a run.
CONFIG = {"lr": 0.2, "momentum": 0.9, "steps": 4, "checkpoint_every": 2, "seed": 3}
STATE_FILE = "state.pt"


def make_dataset():
    """ROWS rows of {id, x (8 floats), y}: the dataset every run trains on."""
    import ray.data

    x, y = mlp_reference.make_data(ROWS)
    rows = [{"id": i, "x": x[i].tolist(), "y": int(y[i])} for i in range(ROWS)]
    return ray.data.from_items(rows, override_num_blocks=6)


def initial_weights(config) -> dict:
    """Rank 0's model before training: what every rank starts from after the broadcast."""
    return mlp_reference.make_model(config["seed"]).state_dict()


def hvd_loop(config):
    import ray.train

    import hvd_torch as hvd

    running_before_init = hvd.is_initialized()
    hvd.init()  # a no-op: the worker group's "hvd" process group started the engine
    context = ray.train.get_context()
    _record_engine_stop(config["out"], context.get_world_rank())
    # A different start on every rank: only the broadcast makes them agree.
    model = mlp_reference.make_model(config["seed"] + context.get_world_rank())
    optimizer = torch.optim.SGD(model.parameters(), lr=config["lr"], momentum=config["momentum"])
    optimizer = hvd.DistributedOptimizer(optimizer, named_parameters=model.named_parameters())
    start = _restore(model, optimizer)
    hvd.broadcast_parameters(model.state_dict(), root_rank=0)
    hvd.broadcast_optimizer_state(optimizer, root_rank=0)
    _train(model, optimizer, start, config, hvd_running_before_init=running_before_init,
           hvd_rank=hvd.rank(), hvd_size=hvd.size())


def ddp_loop(config):
    import ray.train
    import ray.train.torch
    import torch.distributed as dist

    context = ray.train.get_context()
    model = mlp_reference.make_model(config["seed"] + context.get_world_rank())
    ddp = ray.train.torch.prepare_model(model)  # DDP broadcasts rank 0's weights
    optimizer = torch.optim.SGD(ddp.parameters(), lr=config["lr"], momentum=config["momentum"])
    start = _restore(model, optimizer)
    _train(ddp, optimizer, start, config, backend=dist.get_backend())


def _record_engine_stop(folder, rank):
    """Makes hvd.shutdown() leave a file naming this rank and process once the
    engine stopped: the worker group's end (HvdBackend.on_shutdown) calls it,
    and Ray kills the process right after, so nothing else could tell."""
    import hvd_torch as hvd

    stop = hvd.shutdown

    def shutdown():
        stop()
        _write_json(folder, f"stopped_rank{rank}_pid{os.getpid()}.json", dict(
            rank=rank, pid=os.getpid(), running_after=hvd.is_initialized(), time=time.time()))

    hvd.shutdown = shutdown


def _restore(model, optimizer) -> int:
    """Loads the latest reported checkpoint, if the run has one; the step to start at."""
    import ray.train

    checkpoint = ray.train.get_checkpoint()
    if checkpoint is None:
        return 0
    with checkpoint.as_directory() as folder:
        state = torch.load(Path(folder) / STATE_FILE)
    model.load_state_dict(state["model"])
    optimizer.load_state_dict(state["optimizer"])
    return state["step"]


def _read_shard():
    """This worker's rows of the "train" dataset: (ids, x, y)."""
    import ray.train

    rows = list(ray.train.get_dataset_shard("train").iter_rows())
    ids = [int(r["id"]) for r in rows]
    x = torch.tensor([list(r["x"]) for r in rows], dtype=torch.float32)
    y = torch.tensor([int(r["y"]) for r in rows])
    return ids, x, y


def _train(model, optimizer, start, config, **facts):
    import ray.train

    context = ray.train.get_context()
    rank = context.get_world_rank()
    ids, x, y = _read_shard()
    _write_json(config["out"], f"start_rank{rank}_pid{os.getpid()}.json", dict(
        facts, world_rank=rank, world_size=context.get_world_size(), pid=os.getpid(),
        start_step=start, ids=ids, time=time.time()))
    for step in range(start, config["steps"]):
        _maybe_die(config, rank, step)
        loss = F.cross_entropy(model(x), y)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        if (step + 1) % config["checkpoint_every"] == 0:
            _report(step + 1, loss.item(), model, optimizer, rank)
    weights = getattr(model, "module", model).state_dict()
    _save(config["out"], f"final_rank{rank}.pt", {k: v.clone() for k, v in weights.items()})


def _report(step, loss, model, optimizer, rank):
    """ray.train.report on every rank; rank 0 attaches the checkpoint."""
    import ray.train

    metrics = {"step": step, "loss": loss}
    if rank != 0:
        ray.train.report(metrics, checkpoint=None)
        return
    state = {"model": getattr(model, "module", model).state_dict(),
             "optimizer": optimizer.state_dict(), "step": step}
    with tempfile.TemporaryDirectory() as folder:
        torch.save(state, Path(folder) / STATE_FILE)
        ray.train.report(metrics, checkpoint=ray.train.Checkpoint.from_directory(folder))


def _maybe_die(config, rank, step):
    """With config["kill"] = {"rank", "step", "marker"}: that rank SIGKILLs its own
    process before that step, once (the marker file says it happened). It first
    waits until Ray Train has committed every checkpoint reported so far, so the
    restart resumes from the one of this very step, not an older one."""
    kill = config.get("kill")
    if not kill or rank != kill["rank"] or step != kill["step"]:
        return
    try:
        os.close(os.open(kill["marker"], os.O_CREAT | os.O_EXCL | os.O_WRONLY))
    except FileExistsError:
        return
    import ray.train

    ray.train.get_all_reported_checkpoints(
        consistency_mode=ray.train.CheckpointConsistencyMode.COMMITTED, timeout_s=120)
    os.kill(os.getpid(), signal.SIGKILL)


def _write_json(folder, name, record):
    path = Path(folder) / name
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(record))
    os.replace(tmp, path)


def _save(folder, name, obj):
    path = Path(folder) / name
    tmp = path.with_suffix(".tmp")
    torch.save(obj, tmp)
    os.replace(tmp, path)


def read_run(folder) -> dict:
    """What the ranks wrote: {"starts": [one record per process], "stopped": [one
    record per engine stopped], "final": {rank: weights at the end}}."""
    folder = Path(folder)
    records = {kind: [json.loads(p.read_text()) for p in sorted(folder.glob(f"{kind}_rank*.json"))]
               for kind in ("start", "stopped")}
    final = {int(p.stem.removeprefix("final_rank")): torch.load(p)
             for p in folder.glob("final_rank*.pt")}
    return {"starts": records["start"], "stopped": records["stopped"], "final": final}
