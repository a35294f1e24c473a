"""The elastic training job the fault tests run under hvdrun, and its reference.

As a script (`hvdrun ... python elastic_job.py`): Horovod's elastic training loop,
written as a user would, on a tiny float64 linear regression with fixed data, so that
the final weights are a deterministic function of where the world size changed.
Every worker prints `EVENT <kind> key=value ...` lines that the tests parse:
  start   each attempt of train() (after the sync): rank, size, commits, pid, t
  step    each optimizer step (rank 0 only): epoch, batch, size, t
  commit  each commit (rank 0 only): commits, t
  done    after training: rank, size, weights (JSON, full precision)

As a module: reference(segments) replays the same training in one process, with
each rank's batches computed from ElasticSampler's shard() and gradients averaged as
DistributedOptimizer does, switching world size right after the given commits.

Environment knobs: ELASTIC_JOB_EPOCHS, ELASTIC_JOB_STEP_SLEEP (seconds per step, so
that a test can act mid-epoch), ELASTIC_JOB_FAST_FILE (once this file exists, steps no
longer sleep: a test that has seen what it waited for lets training finish at full
speed), ELASTIC_JOB_FAIL_HOST (workers started for this discovery host exit with code
5 at once: a host where every start fails).
"""

import json
import math
import os
import sys
import time

if os.environ.get("HVD_TORCH_ELASTIC_HOST", "") == os.environ.get("ELASTIC_JOB_FAIL_HOST"):
    print("EVENT failing-on-purpose", flush=True)
    sys.exit(5)

import torch
import torch.nn.functional as F

N, FEATURES, BATCH, COMMIT_EVERY, LR, MOMENTUM, SEED = 60, 4, 3, 2, 0.05, 0.9, 7
EPOCHS = int(os.environ.get("ELASTIC_JOB_EPOCHS", "3"))
STEP_SLEEP = float(os.environ.get("ELASTIC_JOB_STEP_SLEEP", "0"))


def make_data():
    g = torch.Generator().manual_seed(0)
    x = torch.randn(N, FEATURES, generator=g, dtype=torch.float64)
    w = torch.randn(FEATURES, 1, generator=g, dtype=torch.float64)
    y = x @ w + 0.1 * torch.randn(N, 1, generator=g, dtype=torch.float64)
    return x, y


def make_model():
    torch.manual_seed(1)
    return torch.nn.Linear(FEATURES, 1).double()


def weights(model):
    return [v for p in model.parameters() for v in p.detach().flatten().tolist()]


def event(kind, **fields):
    text = " ".join(f"{k}={v}" for k, v in fields.items())
    print(f"EVENT {kind} {text} t={time.time():.6f}", flush=True)


def main():
    from torch.utils.data import DataLoader, TensorDataset

    import hvd_torch as hvd

    hvd.init()
    x, y = make_data()
    dataset = TensorDataset(x, y)
    model = make_model()
    optimizer = hvd.DistributedOptimizer(
        torch.optim.SGD(model.parameters(), lr=LR, momentum=MOMENTUM),
        named_parameters=model.named_parameters(),
    )
    sampler = hvd.elastic.ElasticSampler(dataset, shuffle=True, seed=SEED)
    loader = DataLoader(dataset, batch_size=BATCH, sampler=sampler)
    state = hvd.elastic.TorchState(
        model=model, optimizer=optimizer, sampler=sampler, epoch=0, commits=0
    )

    @hvd.elastic.run
    def train(state):
        event("start", rank=hvd.rank(), size=hvd.size(), commits=state.commits, pid=os.getpid())
        # Horovod's idiom: the loop variable is the state's attribute, so a commit
        # records the epoch, and range() was evaluated from the restored value.
        for state.epoch in range(state.epoch, EPOCHS):  # noqa: B020
            state.sampler.set_epoch(state.epoch)
            for state.batch, (xb, yb) in enumerate(loader):
                optimizer.zero_grad()
                F.mse_loss(model(xb), yb).backward()
                optimizer.step()
                state.sampler.record_batch(state.batch, BATCH)
                if hvd.rank() == 0:
                    event("step", epoch=state.epoch, batch=state.batch, size=hvd.size())
                _step_pause()
                if (state.batch + 1) % COMMIT_EVERY == 0:
                    _commit(state, hvd.rank())
            _commit(state, hvd.rank())

    train(state)
    event(
        "done",
        rank=hvd.rank(),
        size=hvd.size(),
        weights=json.dumps(weights(model), separators=(",", ":")),
    )
    return weights(model)  # for a caller that runs main() in-process (the Ray tests)


def _step_pause():
    # Read per step, as the file: a Ray worker may have imported this module earlier.
    fast = os.environ.get("ELASTIC_JOB_FAST_FILE")
    if STEP_SLEEP and not (fast and os.path.exists(fast)):
        time.sleep(STEP_SLEEP)


def _commit(state, rank):
    state.commits += 1
    if rank == 0:
        event("commit", commits=state.commits)
    state.commit()


# ---------------------------------------------------------------- the reference


def reference(segments):
    """Final weights of a run whose world size is segments[i][0] until commit number
    segments[i][1] (None: to the end), in one process."""
    from hvd_torch.elastic.sampler import shard

    x, y = make_data()
    model = make_model()
    optimizer = torch.optim.SGD(model.parameters(), lr=LR, momentum=MOMENTUM)
    at = {"epoch": 0, "processed": set(), "commits": 0}
    for size, stop in segments:
        _replay(model, optimizer, x, y, at, size, stop, shard)
    return weights(model)


def _replay(model, optimizer, x, y, at, size, stop, shard):
    """Trains from the committed position `at` with `size` ranks until commit `stop`;
    `at` becomes the position of that commit."""
    params = list(model.parameters())
    for epoch in range(at["epoch"], EPOCHS):
        if epoch != at["epoch"]:  # set_epoch(): a new epoch starts with nothing processed
            at["epoch"], at["processed"] = epoch, set()
        remaining = [i for i in range(N) if i not in at["processed"]]
        shards = [shard(remaining, epoch, SEED, True, r, size) for r in range(size)]
        for b in range(math.ceil(len(shards[0]) / BATCH)):
            grads = []
            for r in range(size):
                idx = shards[r][b * BATCH : (b + 1) * BATCH]
                model.zero_grad()
                F.mse_loss(model(x[idx]), y[idx]).backward()
                grads.append([p.grad.clone() for p in params])
            for p, per_rank in zip(params, zip(*grads)):
                p.grad = sum(per_rank) / size
            optimizer.step()
            for r in range(size):
                at["processed"].update(shards[r][b * BATCH : (b + 1) * BATCH])
            if (b + 1) % COMMIT_EVERY == 0:
                at["commits"] += 1
                if at["commits"] == stop:
                    return
        at["commits"] += 1
        if at["commits"] == stop:
            return
    assert stop is None, f"the run ended before commit {stop}"


if __name__ == "__main__":
    main()
