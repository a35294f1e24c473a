"""ElasticSampler.processed_num, Horovod's public counter, on 2 and 3 real ranks: what
record_batch() adds, what state.commit()/restore() and set_epoch() do with it, and
load_state_dict() of Horovod's form ({"epoch", "processed_num"}).  (The sampler's
processed_indices and the state objects: test_elastic_state.py.)"""

import pytest
from dist_harness import run_ranks


def _processed_num(n_samples, batch):
    import hvd_torch as hvd

    hvd.init()
    n = hvd.size()
    sampler = hvd.elastic.ElasticSampler(list(range(n_samples)), shuffle=True, seed=3)
    state = hvd.elastic.TorchState(sampler=sampler, epoch=0)
    out = {"start": sampler.processed_num}
    sampler.record_batch(0, batch)
    out["after_batch"] = sampler.processed_num
    state.commit()  # unions the processed indices over the ranks
    out["committed_indices"] = sorted(sampler.processed_indices)
    out["state_dict"] = sampler.state_dict()
    sampler.record_batch(1, batch)
    out["uncommitted"] = sampler.processed_num
    state.restore()
    out["restored"] = sampler.processed_num
    sampler.set_epoch(sampler.epoch)  # the current epoch: progress kept
    out["same_epoch"] = sampler.processed_num
    # Horovod's state_dict form (a checkpoint written under Horovod): the first
    # processed_num samples of the epoch's order count as processed, the very
    # ones the ranks' first batches were.
    horovods = hvd.elastic.ElasticSampler(list(range(n_samples)), shuffle=True, seed=3)
    horovods.load_state_dict({"epoch": 0, "processed_num": batch * n})
    out["horovod_form"] = (sorted(horovods.processed_indices), horovods.processed_num,
                           len(horovods))
    # A state_dict from before processed_num: the distinct samples processed.
    older = hvd.elastic.ElasticSampler(list(range(n_samples)), shuffle=True, seed=3)
    older.load_state_dict({"epoch": 0, "processed_indices": {1, 2, 5}})
    out["older_form"] = older.processed_num
    sampler.set_epoch(sampler.epoch + 1)
    out["next_epoch"] = (sampler.processed_num, sorted(sampler.processed_indices))
    hvd.shutdown()
    return out


@pytest.mark.parametrize("nranks", [2, 3])
def test_processed_num_as_horovod(nranks):
    n_samples, batch = 10, 2
    for rank, o in enumerate(run_ranks(_processed_num, nranks, args=(n_samples, batch),
                                       timeout=60)):
        # Horovod's count: each record_batch adds batch_size x the number of workers.
        assert o["start"] == 0
        assert o["after_batch"] == batch * nranks, (rank, o)
        assert o["state_dict"]["processed_num"] == batch * nranks
        assert sorted(o["state_dict"]["processed_indices"]) == o["committed_indices"]
        assert len(o["committed_indices"]) == batch * nranks
        assert o["uncommitted"] == 2 * batch * nranks
        assert o["restored"] == batch * nranks  # state.restore() brings the commit back
        assert o["same_epoch"] == batch * nranks
        indices, num, length = o["horovod_form"]
        assert indices == o["committed_indices"] and num == batch * nranks, (rank, o)
        assert length == -(-(n_samples - batch * nranks) // nranks)
        assert o["older_form"] == 3
        assert o["next_epoch"] == (0, [])  # set_epoch() of a new epoch starts from zero
