"""The "hvd" torch.distributed backend (hvd_torch/distributed.py, csrc/torch/c10d_backend.cc)
on 2 and 3 real rank processes: DDP gives gloo's weights, a DDP comm hook works,
every collective we implement gives the numbers a plain-PyTorch reference gives,
an unsupported op or a rank's own mistake is a clear error on every rank, ranks that
ask for different backends are named at once, and hvd.allreduce and DDP share one
engine in one script.

Each rank calls hvd.init() (the harness gives hvdrun's variables) and then
init_process_group("hvd") through a FileStore, so the group reuses that engine;
test_init_process_group_starts_the_engine starts it from init_process_group alone.
"""

import datetime
import os
import time

import pytest
import torch

from dist_harness import attempt, run_ranks

TIMEOUT = 120


def _init(backend, path, rank=None, size=None):
    import torch.distributed as dist

    import hvd_torch as hvd

    if backend == "hvd" and not hvd.is_initialized():
        hvd.init()
    rank = int(os.environ["HOROVOD_RANK"]) if rank is None else rank
    size = int(os.environ["HOROVOD_SIZE"]) if size is None else size
    dist.init_process_group(backend, init_method=f"file://{path}", rank=rank, world_size=size,
                            timeout=datetime.timedelta(seconds=60))
    return dist


def _model():
    torch.manual_seed(0)
    return torch.nn.Sequential(
        torch.nn.Conv2d(1, 4, 3), torch.nn.ReLU(), torch.nn.Flatten(),
        torch.nn.Linear(4 * 6 * 6, 10))


def _train(dist, hook=None, steps=5):
    from torch.nn.parallel import DistributedDataParallel as DDP

    model = DDP(_model(), bucket_cap_mb=0.001)  # several buckets, so several allreduces
    if hook is not None:
        model.register_comm_hook(None, hook)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    g = torch.Generator().manual_seed(100 + dist.get_rank())
    for _ in range(steps):
        x = torch.randn(8, 1, 8, 8, generator=g)
        y = torch.randint(0, 10, (8,), generator=g)
        opt.zero_grad()
        torch.nn.functional.cross_entropy(model(x), y).backward()
        opt.step()
    return torch.cat([p.detach().reshape(-1) for p in model.module.parameters()])


def _ddp_over(backends, tmp, hook_name=None):
    """Trains the same model over each backend in turn; returns the weights."""
    from torch.distributed.algorithms.ddp_comm_hooks import default_hooks

    hook = getattr(default_hooks, hook_name) if hook_name else None
    out = {}
    for i, backend in enumerate(backends):
        dist = _init(backend, os.path.join(tmp, f"store.{i}"))
        try:
            out[backend] = _train(dist, hook)
        finally:
            dist.destroy_process_group()
    return out


@pytest.mark.parametrize("nranks", [2, 3])
def test_ddp_gives_the_weights_gloo_gives(nranks, tmp_path):
    results = run_ranks(_ddp_over, nranks, args=(["gloo", "hvd"], str(tmp_path)), timeout=TIMEOUT)
    for r in results:
        torch.testing.assert_close(r["hvd"], r["gloo"], rtol=0, atol=1e-6)
        torch.testing.assert_close(r["hvd"], results[0]["hvd"], rtol=0, atol=0)


def test_ddp_fp16_compression_hook(tmp_path):
    results = run_ranks(_ddp_over, 2, args=(["gloo", "hvd"], str(tmp_path), "fp16_compress_hook"),
                        timeout=TIMEOUT)
    (tmp_path / "plain").mkdir()
    plain = run_ranks(_ddp_over, 2, args=(["gloo"], str(tmp_path / "plain")), timeout=TIMEOUT)
    for r, p in zip(results, plain):
        # The same fp16 rounding as gloo's, within fp16's last bit; and it did compress.
        torch.testing.assert_close(r["hvd"], r["gloo"], rtol=0, atol=1e-3)
        assert not torch.equal(r["hvd"], p["gloo"])
        torch.testing.assert_close(r["hvd"], results[0]["hvd"], rtol=0, atol=0)


def _collectives(tmp):
    dist = _init("hvd", os.path.join(tmp, "store"))
    try:
        rank, n = dist.get_rank(), dist.get_world_size()
        assert dist.get_backend() == "hvd"
        checked = []

        def check(name, got, want):
            torch.testing.assert_close(got, want, rtol=0, atol=0, msg=lambda m: f"{name}: {m}")
            checked.append(name)

        # all_reduce: every op we map, in place, float and int.
        base = torch.arange(6, dtype=torch.float64) + 1
        inputs = [base * (r + 1) for r in range(n)]
        for op, ref in [(dist.ReduceOp.SUM, lambda ts: sum(ts)),
                        (dist.ReduceOp.AVG, lambda ts: sum(ts) / n),
                        (dist.ReduceOp.MIN, lambda ts: torch.stack(ts).min(0).values),
                        (dist.ReduceOp.MAX, lambda ts: torch.stack(ts).max(0).values),
                        (dist.ReduceOp.PRODUCT, lambda ts: torch.stack(ts).prod(0))]:
            t = inputs[rank].clone()
            dist.all_reduce(t, op=op)
            check(f"all_reduce {op}", t, ref(inputs))
        ti = torch.full((5,), rank + 1, dtype=torch.int32)
        dist.all_reduce(ti)
        check("all_reduce int32", ti, torch.full((5,), n * (n + 1) // 2, dtype=torch.int32))
        # A non-contiguous tensor is reduced in place too.
        nc = (torch.arange(12.0).reshape(3, 4) * (rank + 1)).t()
        dist.all_reduce(nc)
        check("all_reduce non-contiguous", nc, torch.arange(12.0).reshape(3, 4).t() * n * (n + 1) / 2)
        # async_op: Work.wait and the future's value.
        t = torch.ones(3) * rank
        work = dist.all_reduce(t, async_op=True)
        fut_value = work.get_future().wait()
        assert work.wait() and work.is_completed() and work.is_success()
        check("all_reduce async", t, torch.ones(3) * sum(range(n)))
        check("all_reduce future value", fut_value[0], t)
        chained = dist.all_reduce(torch.ones(2), async_op=True).get_future().then(
            lambda f: f.value()[0] * 2)
        check("future.then", chained.wait(), torch.full((2,), 2.0 * n))
        # Coalesced: one engine op for a list of one dtype.
        ts = [torch.ones(3) * (rank + 1), torch.ones(2, 2) * (rank + 1)]
        dist.all_reduce_coalesced(ts)
        check("all_reduce_coalesced 0", ts[0], torch.ones(3) * n * (n + 1) / 2)
        check("all_reduce_coalesced 1", ts[1], torch.ones(2, 2) * n * (n + 1) / 2)

        # broadcast from every root.
        for root in range(n):
            t = torch.arange(4.0) + 10 * rank
            dist.broadcast(t, src=root)
            check(f"broadcast from {root}", t, torch.arange(4.0) + 10 * root)

        # all_gather_into_tensor / all_gather.
        x = torch.arange(6, dtype=torch.float32).reshape(2, 3) + 100 * rank
        out = torch.empty(2 * n, 3)
        dist.all_gather_into_tensor(out, x)
        check("all_gather_into_tensor", out,
              torch.cat([torch.arange(6.0).reshape(2, 3) + 100 * r for r in range(n)]))
        stacked = torch.empty(n, 2, 3)
        dist.all_gather_into_tensor(stacked, x)
        check("all_gather_into_tensor stacked", stacked,
              torch.stack([torch.arange(6.0).reshape(2, 3) + 100 * r for r in range(n)]))
        outs = [torch.empty(2, 3) for _ in range(n)]
        dist.all_gather(outs, x)
        for r in range(n):
            check(f"all_gather {r}", outs[r], torch.arange(6.0).reshape(2, 3) + 100 * r)

        # reduce_scatter_tensor: SUM and AVG; reduce_scatter (list).
        full = [torch.arange(4 * n, dtype=torch.float64) * (r + 1) for r in range(n)]
        for op, scale in [(dist.ReduceOp.SUM, n * (n + 1) / 2), (dist.ReduceOp.AVG, (n + 1) / 2)]:
            o = torch.empty(4, dtype=torch.float64)
            dist.reduce_scatter_tensor(o, full[rank], op=op)
            check(f"reduce_scatter_tensor {op}", o,
                  torch.arange(4 * rank, 4 * rank + 4, dtype=torch.float64) * scale)
        o = torch.empty(2, 2)
        dist.reduce_scatter(o, [torch.full((2, 2), float(rank + 10 * j)) for j in range(n)])
        check("reduce_scatter", o, torch.full((2, 2), float(sum(range(n)) + 10 * rank * n)))

        # all_to_all_single: even, and with splits (rank r sends j+1 rows to rank j).
        inp = torch.arange(2 * n, dtype=torch.float32) + 100 * rank
        o = torch.empty(2 * n)
        dist.all_to_all_single(o, inp)
        check("all_to_all_single even", o,
              torch.cat([torch.arange(2 * rank, 2 * rank + 2, dtype=torch.float32) + 100 * s
                         for s in range(n)]))
        send = [j + 1 for j in range(n)]
        recv = [rank + 1] * n
        inp = torch.cat([torch.full((j + 1, 2), float(10 * rank + j)) for j in range(n)])
        o = torch.empty(sum(recv), 2)
        dist.all_to_all_single(o, inp, output_split_sizes=recv, input_split_sizes=send)
        check("all_to_all_single splits", o,
              torch.cat([torch.full((rank + 1, 2), float(10 * s + rank)) for s in range(n)]))
        # all_to_all (lists).
        outs = [torch.empty(3) for _ in range(n)]
        dist.all_to_all(outs, [torch.full((3,), float(10 * rank + j)) for j in range(n)])
        for s in range(n):
            check(f"all_to_all from {s}", outs[s], torch.full((3,), float(10 * s + rank)))

        # reduce, gather, scatter to/from the last rank.
        root = n - 1
        t = torch.ones(3) * (rank + 1)
        dist.reduce(t, dst=root)
        check("reduce", t, torch.ones(3) * (n * (n + 1) / 2 if rank == root else rank + 1))
        g = [torch.empty(2) for _ in range(n)] if rank == root else None
        dist.gather(torch.full((2,), float(rank)), g, dst=root)
        if rank == root:
            for r in range(n):
                check(f"gather {r}", g[r], torch.full((2,), float(r)))
        o = torch.empty(2)
        dist.scatter(o, [torch.full((2,), float(r * 7)) for r in range(n)] if rank == root else None,
                     src=root)
        check("scatter", o, torch.full((2,), float(rank * 7)))

        # Objects ride on these (all_gather_object: allgather; broadcast_object_list: broadcast).
        objs = [None] * n
        dist.all_gather_object(objs, {"rank": rank})
        assert objs == [{"rank": r} for r in range(n)], objs
        lst = [f"from {rank}"]
        dist.broadcast_object_list(lst, src=1)
        assert lst == ["from 1"], lst
        gathered = [None] * n if rank == 0 else None
        dist.gather_object(("r", rank), gathered, dst=0)
        assert rank != 0 or gathered == [("r", r) for r in range(n)], gathered
        got = [None]
        dist.scatter_object_list(got, [{"to": r} for r in range(n)] if rank == n - 1 else None,
                                 src=n - 1)
        assert got == [{"to": rank}], got
        checked.append("objects")

        # barrier: nobody leaves before the last rank arrives.
        if rank == n - 1:
            time.sleep(0.3)
        start = time.monotonic()
        dist.barrier()
        waited = time.monotonic() - start
        if rank == 0:
            assert waited > 0.2, f"rank 0 left the barrier after {waited:.3f} s"
        checked.append("barrier")
        return checked
    finally:
        dist.destroy_process_group()


@pytest.mark.parametrize("nranks", [2, 3])
def test_collectives_give_the_reference_numbers(nranks, tmp_path):
    results = run_ranks(_collectives, nranks, args=(str(tmp_path),), timeout=TIMEOUT)
    for r in results:  # every check ran (gather's only on its root)
        assert len(r) >= 25 and r[-2:] == ["objects", "barrier"], r


def _errors(tmp):
    dist = _init("hvd", os.path.join(tmp, "store"))
    try:
        rank, n = dist.get_rank(), dist.get_world_size()
        seen = {}

        def expect(name, exc_type, fn, *words):
            start = time.monotonic()
            with pytest.raises(exc_type) as info:
                fn()
            message = str(info.value)
            for w in words:
                assert w in message, f"{name}: {w!r} not in {message!r}"
            seen[name] = (time.monotonic() - start, message)

        # Point-to-point: the sender and the receiver both raise at once.
        if rank == 0:
            expect("send", NotImplementedError, lambda: dist.send(torch.ones(1), dst=1),
                   "dist.send", "not supported", "gloo")
        elif rank == 1:
            expect("recv", NotImplementedError, lambda: dist.recv(torch.ones(1), src=0),
                   "dist.recv", "not supported")
        # A reduce op we do not have: every rank.
        expect("band", NotImplementedError,
               lambda: dist.all_reduce(torch.ones(2, dtype=torch.int32), op=dist.ReduceOp.BAND),
               "all_reduce", "BAND")
        expect("reduce_scatter max", NotImplementedError,
               lambda: dist.reduce_scatter_tensor(torch.empty(1), torch.ones(n),
                                                  op=dist.ReduceOp.MAX),
               "reduce_scatter_tensor", "MAX")
        # One rank's own mistake (a wrong output size): that rank says what is wrong,
        # the others get the engine's mismatch error, all within seconds.
        out = torch.empty(n + (1 if rank == 1 else 0))
        if rank == 1:
            expect("bad output", ValueError, lambda: dist.all_gather_into_tensor(out, torch.ones(1)),
                   "all_gather_into_tensor", "output has")
        else:
            expect("peer's bad output", RuntimeError,
                   lambda: dist.all_gather_into_tensor(out, torch.ones(1)), "mismatched operations")
        # Ranks that disagree: different collectives, or dtypes, at the same position.
        if rank == 0:
            expect("different ops", RuntimeError, lambda: dist.all_reduce(torch.ones(2)),
                   "mismatched operations")
        else:
            expect("different ops", RuntimeError, lambda: dist.broadcast(torch.ones(2), src=0),
                   "mismatched operations")
        expect("different dtypes", RuntimeError, lambda: dist.all_reduce(
            torch.ones(2, dtype=torch.float64 if rank == 1 else torch.float32)),
            "mismatched dtypes")
        # A dtype we do not move: every rank. (A CUDA tensor is refused the same way,
        # naming its device; this machine has none. torch routes meta tensors to its own
        # no-op kernels, never to a backend.)
        expect("uint16", ValueError,
               lambda: dist.all_reduce(torch.ones(2, dtype=torch.uint16)), "unsupported dtype")
        # A subgroup that only its members create cannot be an hvd process set.
        if n > 2 and rank in (0, 1):
            expect("new_group", NotImplementedError,
                   lambda: dist.new_group([0, 1], use_local_synchronization=True),
                   "new_group(ranks=[0, 1])", "use_local_synchronization")
        # The group still works afterwards.
        t = torch.ones(1)
        dist.all_reduce(t)
        assert t.item() == n
        return {k: v[0] for k, v in seen.items()}
    finally:
        dist.destroy_process_group()


@pytest.mark.parametrize("nranks", [2, 3])
def test_errors_are_clear_on_every_rank(nranks, tmp_path):
    results = run_ranks(_errors, nranks, args=(str(tmp_path),), timeout=TIMEOUT)
    for r in results:
        assert all(seconds < 10 for seconds in r.values()), results
        assert {"band", "reduce_scatter max", "bad output", "peer's bad output", "different ops",
                "different dtypes", "uint16"} & set(r) == \
            {"band", "reduce_scatter max", "different ops", "different dtypes", "uint16",
             "bad output" if r is results[1] else "peer's bad output"}


def _subgroups(tmp):
    """new_group(ranks) maps to an hvd process set: collectives over a subgroup,
    two overlapping subgroups, and a group over every rank."""
    dist = _init("hvd", os.path.join(tmp, "store"))
    try:
        rank, n = dist.get_rank(), dist.get_world_size()
        low, high = dist.new_group([0, 1]), dist.new_group(list(range(1, n)))
        everyone = dist.new_group(list(range(n)))
        out = {}
        for name, group, members in [("low", low, [0, 1]), ("high", high, list(range(1, n))),
                                     ("everyone", everyone, list(range(n)))]:
            if rank not in members:
                continue
            t = torch.ones(2) * (rank + 1)
            dist.all_reduce(t, group=group)
            assert t.tolist() == [float(sum(r + 1 for r in members))] * 2, (name, t)
            b = torch.full((3,), float(rank))
            dist.broadcast(b, src=members[-1], group=group)  # src: a global rank
            assert b.tolist() == [float(members[-1])] * 3, (name, b)
            g = torch.empty(len(members))
            dist.all_gather_into_tensor(g, torch.tensor([float(rank)]), group=group)
            assert g.tolist() == [float(r) for r in members], (name, g)
            o = torch.empty(1)
            dist.reduce_scatter_tensor(o, torch.arange(len(members), dtype=torch.float32),
                                       group=group)
            me = members.index(rank)
            assert o.item() == me * len(members), (name, o)
            dist.barrier(group=group)
            out[name] = dist.get_group_rank(group, rank)
        return out
    finally:
        dist.destroy_process_group()


@pytest.mark.parametrize("nranks", [2, 3])
def test_new_group_maps_to_a_process_set(nranks, tmp_path):
    results = run_ranks(_subgroups, nranks, args=(str(tmp_path),), timeout=TIMEOUT)
    assert results[0] == {"low": 0, "everyone": 0}
    assert results[1]["high"] == 0 and results[1]["low"] == 1


def _mixed(tmp):
    """hvd.allreduce, hvd.DistributedOptimizer-style averaging and DDP over one engine."""
    import hvd_torch as hvd

    dist = _init("hvd", os.path.join(tmp, "store"))
    try:
        engine_ops = hvd.allreduce(torch.tensor([1.0]), op=hvd.Sum).item()
        weights = _train(dist)
        # Between DDP steps, hvd ops and dist ops interleave on the same engine.
        a = hvd.allreduce(torch.ones(4) * (hvd.rank() + 1), op=hvd.Sum)
        b = torch.ones(4) * (hvd.rank() + 1)
        dist.all_reduce(b)
        torch.testing.assert_close(a, b)
        same = hvd.allgather(weights.reshape(1, -1))
        assert all(torch.equal(same[i], weights) for i in range(hvd.size()))
        return engine_ops, hvd.size(), dist.get_world_size()
    finally:
        dist.destroy_process_group()


def test_hvd_ops_and_ddp_share_one_engine(tmp_path):
    for engine_ops, size, world in run_ranks(_mixed, 2, args=(str(tmp_path),), timeout=TIMEOUT):
        assert engine_ops == size == world == 2


def _mixed_backends(tmp):
    """Rank 0 asks init_process_group for "hvd", rank 1 for "gloo", with a short timeout
    so that it gives up by itself; each returns attempt()'s (error, message, seconds)."""
    import torch.distributed as tdist

    import hvd_torch  # noqa: F401  (registers "hvd")

    rank = int(os.environ["HOROVOD_RANK"])
    return attempt(lambda: tdist.init_process_group(
        "hvd" if rank == 0 else "gloo", init_method=f"file://{os.path.join(tmp, 'store')}",
        rank=rank, world_size=2, timeout=datetime.timedelta(seconds=3)))


def test_mixed_backends_are_named_not_a_hang(tmp_path):
    (hvd_error, message, seconds), (gloo_error, gloo_message, _) = run_ranks(
        _mixed_backends, 2, args=(str(tmp_path),), timeout=TIMEOUT)
    # Named from rank 1's Gloo key, not at the start timeout (whose message says "no
    # backend posted"); the bound leaves room for rank 1 reaching its rendezvous late
    # on a loaded machine (the looks are 0.5, 1.5, 3.5 and 7.5 s in; 1.3 s measured).
    assert hvd_error == "RefusedError" and seconds < 10, (hvd_error, message, seconds)
    assert "rank 0: hvd; rank 1: gloo (this is rank 0)" in message, message
    # The Gloo rank waits for rank 0's Gloo address until its own timeout.
    assert gloo_error is not None and "timeout" in gloo_message.lower(), gloo_message


def _mixed_subgroup_backends(tmp):
    """Every rank's default group is "hvd"; for new_group([0, 1]) rank 0 asks for "hvd",
    the others for "gloo"."""
    dist = _init("hvd", os.path.join(tmp, "store"))
    try:
        rank = dist.get_rank()
        return attempt(lambda: dist.new_group([0, 1], backend="hvd" if rank == 0 else "gloo"))
    finally:
        dist.destroy_process_group()


@pytest.mark.parametrize("nranks", [2, 3])
def test_mixed_backends_in_a_subgroup_are_named_on_every_rank(nranks, tmp_path):
    outcomes = run_ranks(_mixed_subgroup_backends, nranks, args=(str(tmp_path),),
                         timeout=TIMEOUT)  # fmt: skip
    others = "rank 1: gloo" if nranks == 2 else "ranks 1, 2: gloo"
    for rank, (error, message, seconds) in enumerate(outcomes):
        # Before the process set registration or Gloo's rendezvous: not at a timeout.
        assert error == "RefusedError" and seconds < 10, (rank, error, message, seconds)
        assert f"asked for different backends: rank 0: hvd; {others} (this is rank {rank})" \
            in message, message


def _starts_engine(tmp):
    """No hvd.init(): init_process_group("hvd") starts the engine, and hvd's API uses it."""
    import hvd_torch as hvd

    rank, size = int(os.environ["HOROVOD_RANK"]), int(os.environ["HOROVOD_SIZE"])
    # Only torch's rendezvous: none of hvdrun's variables.
    saved = {k: os.environ.pop(k) for k in list(os.environ) if k.startswith("HOROVOD_")}
    try:
        assert not hvd.is_initialized()
        import torch.distributed as tdist

        tdist.init_process_group("hvd", init_method=f"file://{os.path.join(tmp, 'store')}",
                                 rank=rank, world_size=size,
                                 timeout=datetime.timedelta(seconds=60))
        try:
            assert hvd.is_initialized() and (hvd.rank(), hvd.size()) == (rank, size)
            t = torch.ones(2) * rank
            tdist.all_reduce(t)
            u = hvd.allreduce(torch.ones(2) * rank, op=hvd.Sum)
            torch.testing.assert_close(t, u)
            result = t.tolist(), hvd.local_size()
            hvd.shutdown()  # the group outlives the engine: a clear error, not a hang
            with pytest.raises(RuntimeError, match="was shut down"):
                tdist.all_reduce(t)
            return result
        finally:
            tdist.destroy_process_group()
    finally:
        hvd.shutdown()
        os.environ.update(saved)


@pytest.mark.parametrize("nranks", [2, 3])
def test_init_process_group_starts_the_engine(nranks, tmp_path):
    results = run_ranks(_starts_engine, nranks, args=(str(tmp_path),), timeout=TIMEOUT)
    total = float(sum(range(nranks)))
    assert results == [([total, total], nranks)] * nranks


def _block():
    torch.manual_seed(0)
    return torch.nn.Sequential(
        torch.nn.TransformerEncoderLayer(d_model=16, nhead=2, dim_feedforward=32, dropout=0.0,
                                         batch_first=True),
        torch.nn.Flatten(), torch.nn.Linear(16 * 4, 3))


def _fsdp(tmp):
    """FSDP2's fully_shard of a small transformer block trains as the unsharded model
    does on every rank's batch; torch.distributed.checkpoint saves and loads its
    sharded state."""
    import torch.distributed.checkpoint as dcp
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard

    dist = _init("hvd", os.path.join(tmp, "store"))
    try:
        rank, n = dist.get_rank(), dist.get_world_size()
        mesh = init_device_mesh("cpu", (n,))
        model = _block()
        for layer in model[0], model:
            fully_shard(layer, mesh=mesh)
        reference = _block()
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        ref_opt = torch.optim.SGD(reference.parameters(), lr=0.1)
        batches = [torch.randn(3, 4, 16, generator=torch.Generator().manual_seed(10 * s + r))
                   for s in range(3) for r in range(n)]
        for step in range(3):
            mine = batches[step * n + rank]
            opt.zero_grad()
            model(mine).pow(2).mean().backward()
            opt.step()
            # The reference sees every rank's batch: the mean of their losses.
            ref_opt.zero_grad()
            sum(reference(batches[step * n + r]).pow(2).mean() for r in range(n)).div(n).backward()
            ref_opt.step()
        trained = {k: v.full_tensor() for k, v in model.state_dict().items()}
        for k, v in reference.state_dict().items():
            torch.testing.assert_close(trained[k], v, rtol=0, atol=1e-5, msg=lambda m: f"{k}: {m}")
        sharded = model.state_dict()
        assert any(v.to_local().numel() < v.numel() for v in sharded.values())

        # torch.distributed.checkpoint: save the shards, load them into a fresh model.
        dcp.save({"model": sharded}, checkpoint_id=os.path.join(tmp, "ckpt"))
        torch.manual_seed(1)
        other = torch.nn.Sequential(
            torch.nn.TransformerEncoderLayer(d_model=16, nhead=2, dim_feedforward=32,
                                             dropout=0.0, batch_first=True),
            torch.nn.Flatten(), torch.nn.Linear(16 * 4, 3))
        for layer in other[0], other:
            fully_shard(layer, mesh=mesh)
        state = {"model": other.state_dict()}
        dcp.load(state, checkpoint_id=os.path.join(tmp, "ckpt"))
        other.load_state_dict(state["model"])
        for k, v in other.state_dict().items():
            torch.testing.assert_close(v.full_tensor(), trained[k], rtol=0, atol=0)
        return sorted(trained)
    finally:
        dist.destroy_process_group()


@pytest.mark.parametrize("nranks", [2, 3])
def test_fsdp2_trains_like_the_unsharded_model_and_checkpoints(nranks, tmp_path):
    results = run_ranks(_fsdp, nranks, args=(str(tmp_path),), timeout=TIMEOUT)
    assert results[0] == results[-1] and len(results[0]) > 4


def _hsdp(tmp):
    """A 2x2 DeviceMesh (two subgroups per dimension, each an hvd process set): HSDP
    (replicate over one dimension, shard over the other) trains as the unsharded model
    on all 4 batches. The ranks of one pair finish before the other pair has gathered
    its full tensors: destroy_process_group waits for every rank, so no engine shuts
    down under the others' collectives."""
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard

    dist = _init("hvd", os.path.join(tmp, "store"))
    try:
        rank = dist.get_rank()
        mesh = init_device_mesh("cpu", (2, 2), mesh_dim_names=("rep", "shard"))
        groups = {name: dist.get_process_group_ranks(mesh.get_group(name))
                  for name in ("rep", "shard")}
        model, reference = _block(), _block()
        for layer in model[0], model:
            fully_shard(layer, mesh=mesh)
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        ref_opt = torch.optim.SGD(reference.parameters(), lr=0.1)
        batches = [torch.randn(3, 4, 16, generator=torch.Generator().manual_seed(r))
                   for r in range(4)]
        for _ in range(2):
            opt.zero_grad()
            model(batches[rank]).pow(2).mean().backward()
            opt.step()
            ref_opt.zero_grad()
            sum(reference(b).pow(2).mean() for b in batches).div(4).backward()
            ref_opt.step()
        trained = model.state_dict()
        for k, v in reference.state_dict().items():
            torch.testing.assert_close(trained[k].full_tensor(), v, rtol=0, atol=1e-5,
                                       msg=lambda m: f"{k}: {m}")
        return groups
    finally:
        dist.destroy_process_group()


def test_hsdp_on_a_2x2_device_mesh(tmp_path):
    results = run_ranks(_hsdp, 4, args=(str(tmp_path),), timeout=TIMEOUT)
    assert [r["rep"] for r in results] == [[0, 2], [1, 3], [0, 2], [1, 3]]
    assert [r["shard"] for r in results] == [[0, 1], [0, 1], [2, 3], [2, 3]]
