"""Horovod's backward rules, on 2 and 3 ranks, on the global set and on a
process set, single and grouped (horovod/torch/mpi_ops.py, 0.28.1):

- allgather: Average-allreduce of the incoming gradient over the set, then
  this rank's rows;
- broadcast: Average-allreduce of the incoming gradient on the root, zero on
  the others;
- reducescatter: allgather of the incoming gradient times prescale *
  postscale, times the set's size for Sum (none for Average).

Every upstream gradient differs per rank, so Sum and Average, and the right
and wrong rows, give different numbers.
"""

import pytest
import torch

from dist_harness import launch_once

AVERAGE, SUM = 0, 1
ROWS = 5


def _weights(rank, rows, cols=2):
    return (torch.arange(rows * cols, dtype=torch.float64).view(rows, cols) + 1) * (rank + 1)


def _slice(rows, size, index):
    base, extra = divmod(rows, size)
    return index * base + min(index, extra), base + (1 if index < extra else 0)


def _grads(hvd, ps, members):
    me = members.index(hvd.rank())
    out = {}
    # allgather: rank r sends r + 1 rows.
    x = torch.ones(me + 1, 2, dtype=torch.float64, requires_grad=True)
    y = hvd.allgather(x, process_set=ps)
    (y * _weights(me, y.shape[0])).sum().backward()
    out["allgather"] = x.grad
    xs = [torch.ones(me + 1, 2, dtype=torch.float64, requires_grad=True),
          torch.ones(2, 2, dtype=torch.float64, requires_grad=True)]
    ys = hvd.grouped_allgather(xs, process_set=ps)
    sum((yy * _weights(me, yy.shape[0])).sum() for yy in ys).backward()
    out["grouped_allgather"] = [t.grad for t in xs]
    # broadcast from the set's last member.
    root = members[-1]
    x = torch.ones(3, dtype=torch.float64, requires_grad=True)
    (hvd.broadcast(x, root, process_set=ps) * (me + 1)).sum().backward()
    out["broadcast"] = x.grad
    # reducescatter, Sum and Average, scaled.
    for op, pre, post in ((SUM, 2.0, 3.0), (AVERAGE, 2.0, 1.0), (SUM, 1.0, 1.0)):
        x = torch.ones(ROWS, 2, dtype=torch.float64, requires_grad=True)
        y = hvd.reducescatter(x, op=op, prescale_factor=pre, postscale_factor=post, process_set=ps)
        (y * (me + 1)).sum().backward()
        out[("reducescatter", op, pre, post)] = x.grad
        xs = [torch.ones(ROWS, 2, dtype=torch.float64, requires_grad=True),
              torch.ones(3, dtype=torch.float64, requires_grad=True)]
        ys = hvd.grouped_reducescatter(xs, op=op, prescale_factor=pre, postscale_factor=post,
                                       process_set=ps)
        sum((yy * (me + 1)).sum() for yy in ys).backward()
        out[("grouped_reducescatter", op, pre, post)] = [t.grad for t in xs]
    return out


def _rank_main():
    import hvd_torch as hvd

    torch.set_num_threads(1)
    hvd.init()
    n = hvd.size()
    subset = [0, n - 1] if n > 2 else [1]
    ps = hvd.add_process_set(subset)
    res = {"global": _grads(hvd, hvd.global_process_set, list(range(n)))}
    if hvd.rank() in subset:
        res["subset"] = _grads(hvd, ps, subset)
    hvd.barrier()  # the set's ops are negotiated through rank 0: it must stay up
    hvd.shutdown()
    return res


def _expected(members, me):
    k = len(members)
    out = {}
    offset = sum(i + 1 for i in range(me))
    total = sum(i + 1 for i in range(k))
    mean = sum(_weights(i, total) for i in range(k)) / k
    out["allgather"] = mean[offset:offset + me + 1]
    out["grouped_allgather"] = [mean[offset:offset + me + 1],
                                (sum(_weights(i, 2 * k) for i in range(k)) / k)[2 * me:2 * me + 2]]
    upstream_mean = sum(i + 1 for i in range(k)) / k
    out["broadcast"] = (torch.full((3,), upstream_mean, dtype=torch.float64) if me == k - 1
                        else torch.zeros(3, dtype=torch.float64))
    for op, pre, post in ((SUM, 2.0, 3.0), (AVERAGE, 2.0, 1.0), (SUM, 1.0, 1.0)):
        scale = pre * post * (k if op == SUM else 1)

        def gathered(rows, shape_tail):
            parts = [torch.full((_slice(rows, k, o)[1],) + shape_tail, float(o + 1),
                                dtype=torch.float64) for o in range(k)]
            return torch.cat(parts) * scale

        out[("reducescatter", op, pre, post)] = gathered(ROWS, (2,))
        out[("grouped_reducescatter", op, pre, post)] = [gathered(ROWS, (2,)), gathered(3, ())]
    return out


@pytest.mark.parametrize("nranks", [2, 3])
def test_backward_rules_are_horovods(nranks):
    results = launch_once(_rank_main, nranks, timeout=120)
    subset = [0, nranks - 1] if nranks > 2 else [1]
    for rank, res in enumerate(results):
        checks = [("global", list(range(nranks)))]
        if rank in subset:
            checks.append(("subset", subset))
        for where, members in checks:
            want = _expected(members, members.index(rank))
            for key, expected in want.items():
                got = res[where][key]
                what = f"rank {rank} of {nranks}, {where} {members}, {key}"
                if isinstance(expected, list):
                    assert len(got) == len(expected), what
                    for g, e in zip(got, expected):
                        torch.testing.assert_close(g, e, msg=lambda m, w=what: f"{w}: {m}")
                else:
                    torch.testing.assert_close(got, expected, msg=lambda m, w=what: f"{w}: {m}")
