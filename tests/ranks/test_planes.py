"""Every op over each data plane a job on one machine can get, on 2 and 3 ranks:
shared memory (one host), flat Gloo (HVD_TORCH_SHM=0) and hierarchical (host
names faked per rank: shm inside each host, Gloo between the hosts' leaders; it
needs a host with two ranks, so 3 and 4 ranks). test_shm.py's every-op-and-dtype
function over flat Gloo, which it runs only across hosts; and over every plane
the async handles (all in flight at once), the in-place and grouped forms and
join(). Nothing inline (HVD_TORCH_INLINE_THRESHOLD=0): every op reaches the plane.

`make test-sanitize` runs these under ASan+UBSan (scripts/sanitize.sh)."""

import os

import pytest

from dist_harness import run_ranks
from test_shm import DTYPES, SMALL_SLOTS, _every_op

GLOO = dict(SMALL_SLOTS, HVD_TORCH_SHM="0")
# id: (ranks, the plane's backend_name(), faked host per rank or None, env)
PLANES = {
    "shm-2": (2, "shm", None, SMALL_SLOTS),
    "shm-3": (3, "shm", None, SMALL_SLOTS),
    "gloo-2": (2, "gloo", None, GLOO),
    "gloo-3": (3, "gloo", None, GLOO),
    "hierarchical-3": (3, "shm+gloo", ["a", "b", "a"], SMALL_SLOTS),
    "hierarchical-4": (4, "shm+gloo", ["a", "a", "b", "b"], SMALL_SLOTS),
}


def _extension_file():
    from hvd_torch import _C

    return _C.__file__


@pytest.mark.parametrize("fresh", [False, True])
def test_ranks_load_the_test_processs_extension(fresh):
    # Pooled ranks come from a fork server that imports hvd_torch with sys.path
    # of its own; a sanitizer run (scripts/sanitize.sh) must not test the plain
    # build there by accident.
    from hvd_torch import _C

    assert run_ranks(_extension_file, 2, timeout=60, fresh=fresh) == [_C.__file__] * 2


@pytest.mark.parametrize("nranks", [2, 3])
def test_every_op_and_dtype_over_flat_gloo(nranks):
    out = run_ranks(_every_op, nranks, args=(1001, "gloo"), env=GLOO, timeout=300)
    assert out == [len(DTYPES)] * nranks


def _async_in_place_grouped_and_join(plane, hosts):
    import torch

    import hvd_torch as hvd
    from hvd_torch import _C

    if hosts:
        os.environ["HOROVOD_HOSTNAME"] = hosts[int(os.environ["HOROVOD_RANK"])]
    hvd.init()
    rank, size = hvd.rank(), hvd.size()
    assert _C.backend_name() == plane, _C.backend_name()
    n = 1001
    mine = torch.arange(n, dtype=torch.float32) * (rank + 1)
    total = torch.arange(n, dtype=torch.float32) * sum(range(1, size + 1))
    in_place = mine.clone()
    bcast = torch.full((5,), float(rank))
    # Rank r sends r + d + 1 rows to rank d.
    send = torch.cat([torch.full((rank + d + 1, 2), float(10 * rank + d)) for d in range(size)])
    rs_rows = 2 * size + 1  # uneven: the first rank gets a row more
    rs_in = torch.arange(rs_rows * 3, dtype=torch.float64).reshape(rs_rows, 3) + rank
    group = [mine[: 100 + k] for k in range(3)]
    group_in_place = [g.clone() for g in group]
    # Every kind of handle in flight at once, synchronized in reverse order.
    handles = {
        "allreduce": hvd.allreduce_async(mine, op=hvd.Sum, name="async.ar"),
        "allreduce_": hvd.allreduce_async_(in_place, op=hvd.Sum, name="async.ar_"),
        "allgather": hvd.allgather_async(torch.full((rank + 1, 3), float(rank)), name="async.ag"),
        "broadcast_": hvd.broadcast_async_(bcast, root_rank=size - 1, name="async.bc_"),
        "alltoall": hvd.alltoall_async(send, splits=[rank + d + 1 for d in range(size)],
                                       name="async.a2a"),
        "reducescatter": hvd.reducescatter_async(rs_in, op=hvd.Sum, name="async.rs"),
        "grouped_allreduce_": hvd.grouped_allreduce_async_(group_in_place, op=hvd.Sum,
                                                           name="async.gar_"),
        "grouped_allgather": hvd.grouped_allgather_async([torch.full((rank + 1,), float(rank)),
                                                          torch.full((2, 2), float(rank))],
                                                         name="async.gag"),
        "grouped_reducescatter": hvd.grouped_reducescatter_async([rs_in, rs_in[:, :1]],
                                                                 op=hvd.Sum, name="async.grs"),
    }
    assert all(hvd.poll(h) in (True, False) for h in handles.values())
    out = {key: hvd.synchronize(handles[key]) for key in reversed(list(handles))}

    assert torch.equal(out["allreduce"], total)
    assert out["allreduce_"] is in_place or torch.equal(out["allreduce_"], total)
    assert torch.equal(in_place, total)
    assert torch.equal(out["allgather"],
                       torch.cat([torch.full((r + 1, 3), float(r)) for r in range(size)]))
    assert torch.equal(bcast, torch.full((5,), float(size - 1)))
    got, splits = out["alltoall"]
    assert splits.tolist() == [s + rank + 1 for s in range(size)]
    assert torch.equal(got, torch.cat([torch.full((s + rank + 1, 2), float(10 * s + rank))
                                       for s in range(size)]))
    rs_total = sum(torch.arange(rs_rows * 3, dtype=torch.float64).reshape(rs_rows, 3) + r
                   for r in range(size))
    base, extra = divmod(rs_rows, size)
    start = rank * base + min(rank, extra)
    rows = slice(start, start + base + (rank < extra))
    assert torch.equal(out["reducescatter"], rs_total[rows])
    for k, g in enumerate(group_in_place):
        assert torch.equal(g, total[: 100 + k]), k
    first, second = out["grouped_allgather"]
    assert torch.equal(first, torch.cat([torch.full((r + 1,), float(r)) for r in range(size)]))
    assert torch.equal(second, torch.cat([torch.full((2, 2), float(r)) for r in range(size)]))
    wide, narrow = out["grouped_reducescatter"]
    assert torch.equal(wide, rs_total[rows]) and torch.equal(narrow, rs_total[rows, :1])

    # join(): rank r runs r + 1 steps; a joined rank adds zeros to the others' sums.
    sums = [hvd.allreduce(torch.full((3,), float(rank + 1)), op=hvd.Sum, name=f"join.{s}")
            for s in range(rank + 1)]
    for s, got in enumerate(sums):
        assert torch.equal(got, torch.full((3,), float(sum(range(s + 1, size + 1))))), s
    last = hvd.join()
    assert last == size - 1, last
    after = hvd.allreduce(torch.ones(2), op=hvd.Sum, name="after.join")
    assert torch.equal(after, torch.full((2,), float(size)))
    hvd.shutdown()
    return len(handles)


@pytest.mark.parametrize("plane_id", list(PLANES))
def test_async_in_place_grouped_and_join(plane_id):
    nranks, plane, hosts, env = PLANES[plane_id]
    out = run_ranks(_async_in_place_grouped_and_join, nranks, args=(plane, hosts), env=env,
                    timeout=180)
    assert out == [9] * nranks
