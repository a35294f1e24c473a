"""hvd.metric_average, scale_lr, LRWarmup / warmup_scheduler and
distributed_sampler: the schedule in one process, the rest on 2 real rank
processes (one run_ranks launch shared by the tests)."""

import pytest
import torch

from dist_harness import run_ranks

import hvd_torch as hvd

TIMEOUT = 90
NRANKS = 2
DATASET_LEN = {"even": 20, "odd": 23}


def _lrs(scheduler, steps):
    """The lr of every param group before each of `steps` optimizer steps."""
    out = []
    for _ in range(steps):
        out.append([g["lr"] for g in scheduler.optimizer.param_groups])
        scheduler.optimizer.step()
        scheduler.step()
    return out


def _optimizer(lrs=(0.4,)):
    params = [torch.nn.Parameter(torch.zeros(1)) for _ in lrs]
    return torch.optim.SGD([{"params": [p], "lr": lr} for p, lr in zip(params, lrs)])


# ---------------------------------------------------------------- one process


@pytest.mark.unit
def test_warmup_ramps_linearly_from_base_lr_to_size_times_base_lr():
    # 2 epochs of 5 steps, 4 ranks: 0.1 -> 0.4 over 10 steps, then 0.4.
    sched = hvd.warmup_scheduler(_optimizer([0.4]), warmup_epochs=2, steps_per_epoch=5,
                                 base_lr=0.1, size=4)
    assert isinstance(sched, hvd.LRWarmup)
    assert isinstance(sched, torch.optim.lr_scheduler.LambdaLR)
    lrs = [row[0] for row in _lrs(sched, 14)]
    expected = [0.1 * (1 + 3 * min(s, 10) / 10) for s in range(14)]
    assert lrs == pytest.approx(expected, rel=1e-12)
    assert lrs[0] == pytest.approx(0.1) and lrs[5] == pytest.approx(0.25)
    assert lrs[10:] == pytest.approx([0.4] * 4)


@pytest.mark.unit
def test_warmup_rates_are_absolute_and_per_group():
    # Whatever lr the optimizer was built with, the rate is base_lr-based; a
    # list gives one base_lr per group.
    sched = hvd.LRWarmup(_optimizer([1.0, 7.0]), 1, 4, base_lr=[0.1, 0.01], size=3)
    lrs = _lrs(sched, 6)
    for s, (a, b) in enumerate(lrs):
        m = 1 + 2 * min(s, 4) / 4
        assert a == pytest.approx(0.1 * m) and b == pytest.approx(0.01 * m)


@pytest.mark.unit
def test_warmup_edge_cases_and_errors():
    sched = hvd.warmup_scheduler(_optimizer(), 0, 10, base_lr=0.1, size=8)
    assert [r[0] for r in _lrs(sched, 3)] == pytest.approx([0.8] * 3)  # no warm-up
    sched = hvd.warmup_scheduler(_optimizer(), 3, 10, base_lr=0.1, size=1)
    assert [r[0] for r in _lrs(sched, 40)] == pytest.approx([0.1] * 40)  # one rank: constant
    with pytest.raises(ValueError, match="steps_per_epoch"):
        hvd.warmup_scheduler(_optimizer(), 1, 0, base_lr=0.1, size=2)
    with pytest.raises(ValueError, match="warmup_epochs"):
        hvd.warmup_scheduler(_optimizer(), -1, 5, base_lr=0.1, size=2)
    with pytest.raises(ValueError, match="2 base_lr values for 1 param groups"):
        hvd.warmup_scheduler(_optimizer(), 1, 5, base_lr=[0.1, 0.2], size=2)
    with pytest.raises(ValueError, match="lr 0"):
        hvd.warmup_scheduler(_optimizer([0.0]), 1, 5, base_lr=0.1, size=2)


@pytest.mark.unit
def test_warmup_hands_over_to_a_decay_and_survives_a_checkpoint():
    # The recommended recipe: optimizer at the scaled rate, warm-up, then decay.
    base, size, warm = 0.1, 4, 6
    opt = _optimizer([hvd.scale_lr(base, size)])
    warmup = hvd.warmup_scheduler(opt, 2, 3, base, size)
    decay = torch.optim.lr_scheduler.MultiStepLR(opt, milestones=[4], gamma=0.1)
    sched = torch.optim.lr_scheduler.SequentialLR(opt, [warmup, decay], milestones=[warm])
    lrs = [r[0] for r in _lrs(sched, 12)]
    ramp = [base * (1 + 3 * s / warm) for s in range(warm)]
    assert lrs == pytest.approx(ramp + [0.4] * 4 + [0.04] * 2)

    # state_dict() keeps the step count and the factors (the current lr travels
    # in the optimizer's state_dict, as with every torch scheduler).
    opt2 = _optimizer([0.4])
    first = hvd.warmup_scheduler(opt2, 2, 3, base, size)
    _lrs(first, 2)
    state = first.state_dict()
    opt3 = _optimizer([0.4])
    second = hvd.warmup_scheduler(opt3, 2, 3, base, size)
    second.load_state_dict(state)
    opt3.load_state_dict(opt2.state_dict())
    assert second.last_epoch == 2
    assert [r[0] for r in _lrs(second, 3)] == pytest.approx(ramp[2:5])


@pytest.mark.unit
def test_scale_lr_with_explicit_size():
    assert hvd.scale_lr(0.1, size=8) == pytest.approx(0.8)
    assert hvd.scale_lr(0.05, 1) == 0.05


# ---------------------------------------------------------------- 2 ranks


def _rank_main():
    import numpy as np

    import hvd_torch as hvd

    torch.set_num_threads(1)
    hvd.init()
    rank = hvd.rank()
    out = {}
    out["float"] = hvd.metric_average(float(rank), name="float")
    out["int"] = hvd.metric_average(rank + 1, name="int")
    out["numpy"] = hvd.metric_average(np.float32(rank * 2), name="numpy")
    out["unnamed"] = [hvd.metric_average(rank * 10 + i) for i in range(3)]
    loss = (torch.tensor([1.0, 2.0], requires_grad=True) * (rank + 1)).sum()
    out["tensor"] = hvd.metric_average(loss, name="loss")
    out["tensor.requires_grad"] = out["tensor"].requires_grad
    out["vector"] = hvd.metric_average(torch.tensor([rank, 2 * rank], dtype=torch.float32))
    out["ints"] = hvd.metric_average(torch.tensor([rank, 3]), name="ints")
    try:
        hvd.metric_average("accuracy")
        out["type_error"] = None
    except TypeError as e:
        out["type_error"] = str(e)

    out["scale_lr"] = hvd.scale_lr(0.1)
    opt = torch.optim.SGD([torch.nn.Parameter(torch.zeros(1))], lr=hvd.scale_lr(0.1))
    sched = hvd.warmup_scheduler(opt, warmup_epochs=1, steps_per_epoch=4, base_lr=0.1)
    out["warmup"] = [r[0] for r in _lrs(sched, 6)]

    samplers = {}
    for kind, n in DATASET_LEN.items():
        for shuffle in (False, True):
            for drop_last in (False, True):
                s = hvd.distributed_sampler(list(range(n)), shuffle=shuffle, seed=3,
                                            drop_last=drop_last)
                epochs = []
                for epoch in range(2):
                    s.set_epoch(epoch)
                    epochs.append(list(s))
                samplers[(kind, shuffle, drop_last)] = (type(s).__name__, s.num_replicas,
                                                        s.rank, len(s), epochs)
    out["samplers"] = samplers
    out["after"] = hvd.allreduce(torch.ones(1), name="after", op=hvd.Sum).item()
    hvd.shutdown()
    return out


_RESULTS = []


def _launch():
    if not _RESULTS:
        _RESULTS.append(run_ranks(_rank_main, NRANKS, timeout=TIMEOUT))
    return _RESULTS[0]


def test_metric_average():
    for rank, res in enumerate(_launch()):
        what = f"rank {rank}"
        assert res["float"] == 0.5 and type(res["float"]) is float, what
        assert res["int"] == 1.5 and type(res["int"]) is float, what
        assert res["numpy"] == 1.0, what
        assert res["unnamed"] == [5.0, 6.0, 7.0], what
        # loss on rank r is 3 (r + 1): the average over 2 ranks is 4.5.
        assert torch.equal(res["tensor"], torch.tensor(4.5)), what
        assert not res["tensor.requires_grad"], what
        assert torch.equal(res["vector"], torch.tensor([0.5, 1.0])), what
        assert res["ints"].dtype == torch.float64, what
        assert torch.equal(res["ints"], torch.tensor([0.5, 3.0], dtype=torch.float64)), what
        assert "expected a number or a tensor, got str" in res["type_error"], what
        assert res["after"] == NRANKS, f"{what}: ranks out of step"


def test_scale_lr_and_warmup_use_hvd_size():
    for rank, res in enumerate(_launch()):
        assert res["scale_lr"] == pytest.approx(0.2)
        # 0.1 -> 0.2 over 4 steps on 2 ranks.
        assert res["warmup"] == pytest.approx([0.1, 0.125, 0.15, 0.175, 0.2, 0.2]), rank


@pytest.mark.parametrize("kind", DATASET_LEN)
@pytest.mark.parametrize("shuffle", [False, True])
@pytest.mark.parametrize("drop_last", [False, True])
def test_sampler_shards_are_disjoint_and_cover(kind, shuffle, drop_last):
    n = DATASET_LEN[kind]
    results = [res["samplers"][(kind, shuffle, drop_last)] for res in _launch()]
    per_rank = n // NRANKS if drop_last else -(-n // NRANKS)
    for rank, (cls, replicas, sampler_rank, length, _) in enumerate(results):
        assert (cls, replicas, sampler_rank, length) == (
            "DistributedSampler", NRANKS, rank, per_rank)
    for epoch in range(2):
        shards = [r[4][epoch] for r in results]
        assert all(len(s) == per_rank for s in shards)
        everything = [i for s in shards for i in s]
        assert all(0 <= i < n for i in everything)
        if n % NRANKS == 0 or drop_last:
            # Disjoint; every index once (drop_last: all but the dropped tail).
            assert len(set(everything)) == len(everything) == NRANKS * per_rank
            if n % NRANKS == 0:
                assert sorted(everything) == list(range(n))
        else:
            # Padded to equal shards by repeating indices: still covers everything,
            # and only the padding repeats.
            assert set(everything) == set(range(n))
            assert len(everything) - len(set(everything)) == NRANKS * per_rank - n
    if shuffle:
        assert results[0][4][0] != results[0][4][1], "set_epoch() must reshuffle"
    else:
        # In order, interleaved: rank r takes every NRANKS-th index from r (wrapping when padded).
        for rank, r in enumerate(results):
            assert r[4][0] == [i % n for i in range(rank, NRANKS * per_rank, NRANKS)]
