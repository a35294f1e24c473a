"""hvd.elastic state objects and sampler: commit/restore/sync semantics on 2 real ranks,
and the sampler's sharding.  (Resets under real faults: test_elastic_faults.py.)"""

import pytest
from dist_harness import run_ranks


@pytest.mark.unit
def test_shard_partitions_the_remaining_indices():
    from hvd_torch.elastic.sampler import shard

    remaining = [i for i in range(20) if i % 3]  # 13 indices
    shards = [shard(remaining, 4, 0, True, r, 3) for r in range(3)]
    assert [len(s) for s in shards] == [5, 5, 5]  # padded to 15
    flat = [i for s in shards for i in s]
    assert set(flat) == set(remaining) and len(flat) - len(set(flat)) == 2
    assert shards == [shard(remaining, 4, 0, True, r, 3) for r in range(3)]  # deterministic
    assert shard(remaining, 5, 0, True, 0, 3) != shards[0]  # the epoch reshuffles
    assert shard(list(range(6)), 0, 0, False, 1, 3) == [1, 4]  # no shuffle: round robin
    assert shard([7], 0, 0, True, 2, 3) == [7]  # one sample, three replicas
    assert shard([], 0, 0, True, 0, 2) == []


def _state_semantics():
    import torch

    import hvd_torch as hvd

    hvd.init()
    r = hvd.rank()
    torch.manual_seed(r)  # different models on each rank until the sync
    model = torch.nn.Linear(3, 1)
    opt = hvd.DistributedOptimizer(
        torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9),
        named_parameters=model.named_parameters(),
    )
    sampler = hvd.elastic.ElasticSampler(list(range(10)), shuffle=False)
    resets = []
    state = hvd.elastic.TorchState(model, opt, sampler=sampler, epoch=0, history=[])
    state.register_reset_callbacks([lambda: resets.append(1)])
    out = {}

    state.sync()  # rank 0's model everywhere
    w = model.weight.detach().clone()
    out["synced"] = hvd.allgather(w.reshape(1, -1)).tolist()

    def step():
        opt.zero_grad()
        model(torch.ones(2, 3)).sum().backward()
        opt.step()

    step()
    out["shard"] = list(sampler)
    sampler.record_batch(0, 2)  # each rank its own first 2 samples
    state.epoch, state.history = 1, [1]
    state.commit()
    committed = model.weight.detach().clone()
    momentum = opt.state_dict()["state"][0]["momentum_buffer"].clone()
    out["processed"] = sorted(sampler.processed_indices)  # the union after the commit

    step()  # uncommitted
    sampler.record_batch(1, 2)
    state.epoch = 2
    state.history.append(2)
    state.restore()
    out["restored"] = bool(torch.equal(model.weight, committed)) and state.epoch == 1
    out["history"] = state.history
    out["sampler_restored"] = sorted(sampler.processed_indices)
    # The restored optimizer state must not share tensors with the commit: a step
    # after the restore must leave a second restore unchanged.
    step()
    state.restore()
    out["momentum_restored"] = bool(
        torch.equal(opt.state_dict()["state"][0]["momentum_buffer"], momentum)
    )
    state.on_reset()
    out["resets"] = len(resets)
    state.check_host_updates()  # not an elastic job: nothing to check, no collective

    # set_epoch() of the current epoch keeps its progress (resuming mid-epoch).
    sampler.set_epoch(sampler.epoch)
    out["same_epoch"] = sorted(sampler.processed_indices)
    sampler.set_epoch(sampler.epoch + 1)
    out["next_epoch"] = (sorted(sampler.processed_indices), len(sampler))

    @hvd.elastic.run
    def train(state):
        raise hvd.HorovodInternalError("peer died")

    try:
        train(state)
    except hvd.HorovodInternalError as e:
        out["error"] = str(e)
    return out


def test_state_commit_restore_and_sync_on_two_ranks():
    out = run_ranks(_state_semantics, 2, timeout=120)
    assert out[0]["synced"][0] == out[0]["synced"][1]
    assert out[0]["shard"] == [0, 2, 4, 6, 8] and out[1]["shard"] == [1, 3, 5, 7, 9]
    for o in out:
        assert o["processed"] == [0, 1, 2, 3]  # both ranks' batches were committed
        assert o["restored"] and o["history"] == [1] and o["sampler_restored"] == [0, 1, 2, 3]
        assert o["momentum_restored"]
        assert o["resets"] == 1
        assert o["same_epoch"] == [0, 1, 2, 3] and o["next_epoch"] == ([], 5)
        assert "peer died" in o["error"] and "not an elastic job" in o["error"]
