"""The shared-memory data plane (csrc/backends/shm): every op and dtype against a
reference on 2 and 3 ranks, with slots small enough that each op runs many rounds;
the same across hosts (hierarchical: shm inside each host, Gloo between leaders),
with host names faked per rank; the choice per process set (shm on one host,
hierarchical or Gloo across hosts, Gloo when any rank says HVD_TORCH_SHM=0); a rank
killed in the middle of a shm collective; and a soak of 100k small ops with no
growth in memory or open files."""

import os
import signal

import pytest

from dist_harness import (attempt, init_refusal, leaked_shm_segments, run_ranks,
                          shm_segments)

# Small slots: a few KiB tensors take several rounds, with uneven last pieces.
SMALL_SLOTS = {"HVD_TORCH_SHM_SLOT_BYTES": "1024", "HVD_TORCH_INLINE_THRESHOLD": "0"}
DTYPES = ["float32", "float64", "float16", "bfloat16", "int32", "int64", "uint8", "int8"]


def _rank_input(torch, dtype, rank, n):
    # Small integers: exact in every dtype, sums and products included.
    return ((torch.arange(n) * 7 + rank * 3) % 5 + 1).to(dtype)


def _every_op(n_elems, plane="shm", hosts=None):
    import torch

    import hvd_torch as hvd
    from hvd_torch import _C

    if hosts:  # the launcher's host names, faked: which ranks share a host
        os.environ["HOROVOD_HOSTNAME"] = hosts[int(os.environ["HOROVOD_RANK"])]
    hvd.init()
    rank, size = hvd.rank(), hvd.size()
    assert _C.backend_name() == plane, _C.backend_name()
    checked = 0
    for name in DTYPES:
        dtype = getattr(torch, name)
        ins = [_rank_input(torch, dtype, r, n_elems) for r in range(size)]
        wide = [t.to(torch.float64) for t in ins]
        ops = {hvd.Sum: sum(wide), hvd.Min: torch.stack(wide).min(0).values,
               hvd.Max: torch.stack(wide).max(0).values}
        if name not in ("uint8", "int8"):
            ops[hvd.Product] = torch.stack(wide).prod(0)
        for op, expect in ops.items():
            out = hvd.allreduce(ins[rank], op=op, name=f"ar.{name}.{op}")
            assert torch.equal(out.to(torch.float64), expect), (name, op)
            inplace = ins[rank].clone()
            hvd.allreduce_(inplace, op=op, name=f"ari.{name}.{op}")
            assert torch.equal(inplace, out), (name, op)
        if dtype.is_floating_point:
            # Average, pre- and postscale, as the reference computes them.
            avg = hvd.allreduce(ins[rank], op=hvd.Average, name=f"avg.{name}")
            assert torch.allclose(avg.double(), sum(wide) / size, rtol=1e-2), name
            scaled = hvd.allreduce(ins[rank], op=hvd.Sum, prescale_factor=0.5,
                                   postscale_factor=4.0, name=f"scale.{name}")
            assert torch.equal(scaled.double(), sum(w * 0.5 for w in wide) * 4.0), name
        # A fused group: three tensors of different sizes in one collective.
        group = [ins[rank][: n_elems // 3 + k] for k in range(3)]
        outs = hvd.grouped_allreduce(group, op=hvd.Sum, name=f"grp.{name}")
        for k, o in enumerate(outs):
            assert torch.equal(o.double(), sum(wide)[: n_elems // 3 + k]), name
        # Allgather with a different first dimension on every rank.
        mine = torch.full((rank + 2, 3), rank + 1, dtype=torch.int64).to(dtype)
        gathered = hvd.allgather(mine, name=f"ag.{name}")
        expect = torch.cat([torch.full((r + 2, 3), r + 1, dtype=torch.int64).to(dtype)
                            for r in range(size)])
        assert torch.equal(gathered, expect), name
        big = hvd.allgather(ins[rank], name=f"agbig.{name}")
        assert torch.equal(big, torch.cat(ins)), name
        # Broadcast from every rank.
        for root in range(size):
            b = hvd.broadcast(ins[rank], root_rank=root, name=f"bc.{name}.{root}")
            assert torch.equal(b, ins[root]), (name, root)
        # Alltoall with uneven splits: rank r sends (r + d) % 3 + 1 rows to d.
        splits = torch.tensor([(rank + d) % 3 + 1 for d in range(size)])
        rows = int(splits.sum())
        send = torch.arange(rows * 4).reshape(rows, 4).to(dtype) + rank
        got, rsplits = hvd.alltoall(send, splits=splits, name=f"a2a.{name}")
        parts = []
        for src in range(size):
            s = [(src + d) % 3 + 1 for d in range(size)]
            start = sum(s[:rank])
            full = torch.arange(sum(s) * 4).reshape(sum(s), 4).to(dtype) + src
            parts.append(full[start:start + s[rank]])
        assert torch.equal(got, torch.cat(parts)), name
        assert rsplits.tolist() == [p.shape[0] for p in parts]
        # Reducescatter of an uneven first dimension.
        rs_in = ins[rank][: (n_elems // 4) * 4].reshape(-1, 4)
        rs = hvd.reducescatter(rs_in, op=hvd.Sum, name=f"rs.{name}")
        total = sum(w[: (n_elems // 4) * 4].reshape(-1, 4) for w in wide)
        rows_all = total.shape[0]
        base, extra = divmod(rows_all, size)
        start = rank * base + min(rank, extra)
        assert torch.equal(rs.double(), total[start:start + base + (rank < extra)]), name
        checked += 1
    return checked


@pytest.mark.parametrize("nranks", [2, 3])
def test_every_op_and_dtype_through_many_rounds(nranks):
    # 1001 elements: not a multiple of any piece, so last pieces are short.
    out = run_ranks(_every_op, nranks, args=(1001,), env=SMALL_SLOTS, timeout=240)
    assert out == [len(DTYPES)] * nranks


@pytest.mark.parametrize("hosts", [["a", "a", "b", "b"], ["a", "b", "a"], ["a", "b", "b"]])
def test_every_op_and_dtype_across_hosts_hierarchical(hosts):
    # ["a", "b", "a"]: a host's ranks need not be contiguous.
    out = run_ranks(_every_op, len(hosts), args=(1001, "shm+gloo", hosts), env=SMALL_SLOTS,
                    timeout=300)
    assert out == [len(DTYPES)] * len(hosts)


def _reducescatter_across_hosts(hosts):
    import torch

    import hvd_torch as hvd
    from hvd_torch import _C

    os.environ["HOROVOD_HOSTNAME"] = hosts[int(os.environ["HOROVOD_RANK"])]
    hvd.init()
    rank, size = hvd.rank(), hvd.size()
    assert _C.backend_name() == "shm+gloo", _C.backend_name()
    for name in ("float32", "float64", "int32", "bfloat16"):
        dtype = getattr(torch, name)
        for rows in (1, 7, 64):  # fewer rows than ranks, uneven, even
            ins = [_rank_input(torch, dtype, r, rows * 5).reshape(rows, 5) for r in range(size)]
            total = sum(t.to(torch.float64) for t in ins)
            base, extra = divmod(rows, size)
            start = rank * base + min(rank, extra)
            mine = slice(start, start + base + (rank < extra))
            got = hvd.reducescatter(ins[rank], op=hvd.Sum, name=f"rs.{name}.{rows}")
            assert torch.equal(got.double(), total[mine]), (name, rows)
            if dtype.is_floating_point:
                got = hvd.reducescatter(ins[rank], op=hvd.Average, prescale_factor=2.0,
                                        postscale_factor=0.5, name=f"rsa.{name}.{rows}")
                assert torch.allclose(got.double(), total[mine] / size, rtol=1e-2), (name, rows)
    hvd.shutdown()
    return True


@pytest.mark.parametrize("hosts", [["a", "a", "b", "b"], ["a", "b", "a"]])
def test_reducescatter_across_hosts_hierarchical(hosts):
    # Nothing inline (SMALL_SLOTS): every reducescatter runs the hierarchical plane's
    # reduce-scatter, with scaling and row counts the every-op test does not try.
    assert run_ranks(_reducescatter_across_hosts, len(hosts), args=(hosts,), env=SMALL_SLOTS,
                     timeout=120) == [True] * len(hosts)


def test_hierarchical_off_is_flat_gloo():
    env = dict(SMALL_SLOTS, HOROVOD_HIERARCHICAL_ALLREDUCE="0",
               HOROVOD_HIERARCHICAL_ALLGATHER="0")
    out = run_ranks(_every_op, 3, args=(1001, "gloo", ["a", "a", "b"]), env=env, timeout=300)
    assert out == [len(DTYPES)] * 3


def _bool_and_large():
    import torch

    import hvd_torch as hvd

    hvd.init()
    rank = hvd.rank()
    flags = torch.tensor([rank == 0, True, False, rank == 1])
    anyv = hvd.allreduce(flags, op=hvd.Max, name="bool.max").tolist()
    allv = hvd.allreduce(flags, op=hvd.Min, name="bool.min").tolist()
    # 24 MiB: many default-sized rounds, and past the size from which results
    # go to their outputs through streaming stores (csrc/core/stream_copy.h).
    # Every element differs from its neighbours, so a piece copied to the
    # wrong place shows.
    size = hvd.size()
    pattern = (torch.arange(6 << 20) % 1001).float()
    x = pattern + rank
    y = hvd.allreduce(x, op=hvd.Sum, name="large")
    assert torch.equal(x, pattern + rank)  # the input is untouched
    assert torch.equal(y, pattern * size + sum(range(size)))
    root = size - 1
    b = hvd.broadcast(x, root_rank=root, name="large.bcast")
    assert torch.equal(b, pattern + root) and torch.equal(x, pattern + rank)
    z = x.clone()
    hvd.broadcast_(z, root_rank=1, name="large.bcast_")
    assert torch.equal(z, pattern + 1)
    # Alltoall of uneven blocks of MiBs (a rank's own block skips the
    # segment): rank s sends (s + d) % size + 1 blocks of 256 Ki elements to d,
    # numbered so every element says where it came from and where it went.
    block = 256 << 10
    counts = [(rank + d) % size + 1 for d in range(size)]
    send = torch.cat([torch.arange(c * block, dtype=torch.float64) + 1e7 * (rank * size + d)
                      for d, c in enumerate(counts)])
    got, splits = hvd.alltoall(send, splits=torch.tensor(counts) * block, name="large.a2a")
    from_each = [(s + rank) % size + 1 for s in range(size)]
    assert splits.tolist() == [c * block for c in from_each]
    assert torch.equal(got, torch.cat([torch.arange(c * block, dtype=torch.float64)
                                       + 1e7 * (s * size + rank)
                                       for s, c in enumerate(from_each)]))
    return anyv, allv


@pytest.mark.parametrize("nranks", [2, 3])
def test_bool_and_large_out_of_place(nranks):
    out = run_ranks(_bool_and_large, nranks, timeout=120)
    expect = ([True, True, False, True], [False, True, False, False])
    assert out == [expect] * nranks


def _large_ops_each_way():
    import torch

    import hvd_torch as hvd

    hvd.init()
    rank, size = hvd.rank(), hvd.size()
    n = 300_001  # 1.2 MB of float32: past SlotWriteChooser::kChooseFrom, short last pieces
    pattern = (torch.arange(n) % 1001).float()
    x = pattern + rank
    ranks_sum = sum(range(size))
    # Three times each: with the default HVD_TORCH_SHM_STREAM=auto, an op kind's
    # first six large ops write the segment with plain and streaming stores in
    # turn (csrc/core/slot_writes.h), so each kind here goes both ways.
    for i in range(3):
        y = hvd.allreduce(x, op=hvd.Sum, name="l.ar")
        assert torch.equal(y, pattern * size + ranks_sum), i
        z = x.clone()
        hvd.allreduce_(z, op=hvd.Sum, prescale_factor=0.5, postscale_factor=4.0, name="l.ari")
        assert torch.equal(z, (pattern * size + ranks_sum) * 2.0), i
        parts = [x[: n // 3], x[n // 3: n // 3 + 7], x[n // 3 + 7:]]
        outs = hvd.grouped_allreduce(parts, op=hvd.Sum, name="l.grp")
        assert torch.equal(torch.cat(outs), pattern * size + ranks_sum), i
        rows = x[: (n // 1000) * 1000].reshape(-1, 1000)
        rs = hvd.reducescatter(rows, op=hvd.Sum, name="l.rs")
        total = (pattern * size + ranks_sum)[: rows.numel()].reshape(-1, 1000)
        base, extra = divmod(total.shape[0], size)
        start = rank * base + min(rank, extra)
        assert torch.equal(rs, total[start:start + base + (rank < extra)]), i
        g = hvd.allgather(x, name="l.ag")
        assert torch.equal(g, torch.cat([pattern + r for r in range(size)])), i
        b = hvd.broadcast(x, root_rank=size - 1, name="l.bc")
        assert torch.equal(b, pattern + size - 1), i
        c = x.clone()
        hvd.broadcast_(c, root_rank=0, name="l.bci")
        assert torch.equal(c, pattern), i
        got = hvd.alltoall(x[: (n // size) * size], name="l.a2a")
        piece = n // size
        assert torch.equal(got, torch.cat([(pattern + s)[rank * piece:(rank + 1) * piece]
                                           for s in range(size)])), i
    return True


@pytest.mark.parametrize("nranks", [2, 3])
def test_large_ops_write_the_segment_both_ways(nranks):
    assert run_ranks(_large_ops_each_way, nranks, timeout=120) == [True] * nranks


@pytest.mark.parametrize("way", ["0", "1"])
def test_large_ops_with_the_way_of_writing_forced(way):
    env = {"HVD_TORCH_SHM_STREAM": way}
    assert run_ranks(_large_ops_each_way, 3, env=env, timeout=120) == [True] * 3


def test_an_unknown_way_of_writing_is_refused_at_init():
    for msg in run_ranks(init_refusal, 2, timeout=60, env={"HVD_TORCH_SHM_STREAM": "yes"}):
        assert msg and "HVD_TORCH_SHM_STREAM=yes" in msg and "'auto'" in msg, msg


def _backends_by_set(hosts, shm_off_rank):
    import torch

    import hvd_torch as hvd
    from hvd_torch import _C

    rank = int(os.environ["HOROVOD_RANK"])
    os.environ["HOROVOD_HOSTNAME"] = hosts[rank]
    if rank == shm_off_rank:
        os.environ["HVD_TORCH_SHM"] = "0"
    hvd.init()
    pair = hvd.add_process_set([0, 1])
    tail = hvd.add_process_set([1, 2])
    names = {"global": _C.backend_name(0)}
    if rank in (0, 1):
        names["pair"] = _C.backend_name(pair.process_set_id)
        s = hvd.allreduce(torch.full((5000,), rank + 1.0), op=hvd.Sum, name="p",
                          process_set=pair)
        assert torch.equal(s, torch.full((5000,), 3.0))
    if rank in (1, 2):
        names["tail"] = _C.backend_name(tail.process_set_id)
        s = hvd.allreduce(torch.full((5000,), rank + 1.0), op=hvd.Sum, name="t",
                          process_set=tail)
        assert torch.equal(s, torch.full((5000,), 5.0))
    g = hvd.allreduce(torch.full((5000,), rank + 1.0), op=hvd.Sum, name="g")
    assert torch.equal(g, torch.full((5000,), 6.0))
    return names


def test_shm_inside_a_host_gloo_across_hosts():
    # Ranks 0 and 1 share host "a"; rank 2 is alone on "b".
    out = run_ranks(_backends_by_set, 3, args=(["a", "a", "b"], -1), timeout=120)
    assert out[0] == {"global": "shm+gloo", "pair": "shm"}
    assert out[1] == {"global": "shm+gloo", "pair": "shm", "tail": "gloo"}
    assert out[2] == {"global": "shm+gloo", "tail": "gloo"}


def test_one_rank_turning_shm_off_turns_it_off_for_its_sets():
    out = run_ranks(_backends_by_set, 3, args=(["h", "h", "h"], 2), timeout=120)
    assert out[0] == {"global": "gloo", "pair": "shm"}
    assert out[1] == {"global": "gloo", "pair": "shm", "tail": "gloo"}
    assert out[2] == {"global": "gloo", "tail": "gloo"}


def _die_in_collective(victim):
    import threading
    import time

    import torch

    import hvd_torch as hvd
    from hvd_torch import _C

    hvd.init()
    assert _C.backend_name() == "shm"
    x = torch.ones(8 << 20)  # 32 MiB: each allreduce takes many rounds
    hvd.allreduce_(x, name="warm")
    if hvd.rank() == victim:
        # SIGKILL from a timer, so the rank dies inside the collective.
        threading.Timer(0.3, lambda: os.kill(os.getpid(), signal.SIGKILL)).start()
    start = time.monotonic()

    def loop():
        for i in range(100000):
            hvd.allreduce_(x, name="big", op=hvd.Sum)
            x.fill_(1.0)

    kind, message, _ = attempt(loop)
    return kind, message, time.monotonic() - start


@pytest.mark.parametrize("nranks", [2, 3])
def test_killed_rank_mid_collective_fails_every_rank_and_leaves_no_segment(nranks):
    before = shm_segments()
    victim = nranks - 1
    outcomes = run_ranks(_die_in_collective, nranks, args=(victim,), expect_fail=True,
                         timeout=120)
    assert outcomes[victim].exitcode == -signal.SIGKILL, outcomes[victim]
    for rank in range(nranks - 1):
        kind, message, elapsed = outcomes[rank]
        assert kind == "HorovodInternalError", (rank, kind, message)
        assert str(victim) in message, message
        assert elapsed < 0.3 + 10, (rank, elapsed, message)
    assert leaked_shm_segments(before) == []


def _die_in_set_collective():
    import threading
    import time

    import torch

    import hvd_torch as hvd
    from hvd_torch import _C

    hvd.init()
    pair = hvd.add_process_set([0, 2])
    rank = hvd.rank()
    if rank == 1:  # not in the set: learns of the death from rank 0
        return attempt(lambda: [hvd.barrier() for _ in range(1000)])[:2]
    assert _C.backend_name(pair.process_set_id) == "shm"
    x = torch.ones(8 << 20)
    hvd.allreduce_(x, name="warm", process_set=pair)
    if rank == 2:
        threading.Timer(0.3, lambda: os.kill(os.getpid(), signal.SIGKILL)).start()

    def loop():
        for i in range(100000):
            hvd.allreduce_(x, name="big", op=hvd.Sum, process_set=pair)
            x.fill_(1.0)

    start = time.monotonic()
    kind, message, _ = attempt(loop)
    return kind, message, time.monotonic() - start


def test_killed_rank_in_a_process_set_is_named_by_its_global_rank():
    outcomes = run_ranks(_die_in_set_collective, 3, expect_fail=True, timeout=120)
    assert outcomes[2].exitcode == -signal.SIGKILL, outcomes[2]
    kind, message, elapsed = outcomes[0]
    assert kind == "HorovodInternalError" and "rank 2" in message, (kind, message)
    assert elapsed < 0.3 + 10, (elapsed, message)
    # Seen by the shared-memory barrier: it names the global rank, not the position (1).
    if "shared memory" in message:
        assert "rank 2 exited during allreduce" in message, message
    kind, message = outcomes[1]
    assert kind == "HorovodInternalError", (kind, message)


def _soak(count):
    import gc

    import torch

    import hvd_torch as hvd

    hvd.init()
    rank = hvd.rank()

    def usage():
        gc.collect()
        with open("/proc/self/statm") as f:
            rss_pages = int(f.read().split()[1])
        return rss_pages * os.sysconf("SC_PAGE_SIZE"), len(os.listdir("/proc/self/fd"))

    x = torch.zeros(4)
    one = torch.ones(4)

    def ops(n):
        for i in range(n):
            k = i % 4
            if k == 0:
                hvd.allreduce_(x, name="s.ar", op=hvd.Sum)
            elif k == 1:
                hvd.broadcast_(x, root_rank=i % 2, name="s.bc")
            elif k == 2:
                hvd.allgather(one, name="s.ag")
            else:
                hvd.allreduce(one, name="s.out", op=hvd.Max)

    ops(count // 10)
    rss0, fds0 = usage()
    ops(count - count // 10)
    rss1, fds1 = usage()
    return rank, rss1 - rss0, fds1 - fds0


@pytest.mark.slow  # a soak: the slow tier
def test_soak_100k_small_ops_without_growth():
    # Inline off: every op goes through the shm plane, not through rank 0.
    out = run_ranks(_soak, 2, args=(100_000,), env={"HVD_TORCH_INLINE_THRESHOLD": "0"},
                    timeout=600)
    for rank, rss_growth, fd_growth in out:
        assert fd_growth <= 0, (rank, fd_growth)
        assert rss_growth < 4 << 20, (rank, rss_growth)
