"""Failure paths, for real: a caller's mistake, a dead rank, a rendezvous that
cannot complete, use before init() and after shutdown(), and living next to
torch.distributed's own Gloo in one process.

A caller's mistake raises ValueError on every rank at once, naming the
tensor and each rank's value, and the job goes on; a dead peer raises
HorovodInternalError within seconds.  See docs/errors.md.
"""

import datetime
import json
import os
import socket
import subprocess
import sys
import textwrap
import time

import pytest
import torch

from dist_harness import RankFailure, attempt, run_ranks

TIMEOUT = 90
FAST = 10.0  # seconds: "at once" for an error every rank must see




def _attempt_async(hvd, submit, limit=FAST):
    """Like _attempt for an async op, but gives up after `limit` seconds instead
    of hanging: ("Hung", ...) then means no rank was told anything."""
    start = time.monotonic()
    try:
        handle = submit()
        while not hvd.poll(handle):
            if time.monotonic() - start > limit:
                return "Hung", f"no result after {limit:g} s", time.monotonic() - start
            time.sleep(0.005)
        hvd.synchronize(handle)
        return None, "", time.monotonic() - start
    except Exception as e:  # noqa: BLE001
        return type(e).__name__, str(e), time.monotonic() - start


# ---------------------------------------------------------------- rank side


def _mismatches(hvd):
    """Every kind of disagreement, each followed by a correct allreduce."""
    rank = hvd.rank()
    other = 0 if rank == 0 else 1  # rank 0 differs from everyone else
    res = {}

    def check(kind, fn):
        res[kind] = attempt(fn)
        res[kind + ".after"] = hvd.allreduce(torch.tensor([1.0]), name="after." + kind, op=hvd.Sum)

    check("shape", lambda: hvd.allreduce(torch.ones(rank + 1), name="bad.shape"))
    check(
        "dtype",
        lambda: hvd.allreduce(
            torch.ones(2, dtype=torch.float32 if other == 0 else torch.float64), name="bad.dtype"
        ),
    )
    check(
        "op",
        lambda: hvd.allreduce(torch.ones(2), name="bad.op", op=hvd.Sum if other == 0 else hvd.Max),
    )
    check(
        "prescale",
        lambda: hvd.allreduce(torch.ones(2), name="bad.prescale", prescale_factor=1.0 + 0.5 * rank),
    )
    check(
        "postscale",
        lambda: hvd.allreduce(
            torch.ones(2), name="bad.postscale", postscale_factor=1.0 + 0.5 * rank
        ),
    )
    check("large.shape", lambda: hvd.allreduce(torch.ones(10_000 + rank), name="bad.large.shape"))
    check("root", lambda: hvd.broadcast(torch.ones(2), rank, name="bad.root"))
    check("broadcast.shape", lambda: hvd.broadcast(torch.ones(rank + 1), 0, name="bad.bshape"))
    check("allgather.shape", lambda: hvd.allgather(torch.ones(1, rank + 1), name="bad.gshape"))
    check(
        "allgather.dtype",
        lambda: hvd.allgather(
            torch.ones(1, dtype=torch.int32 if other == 0 else torch.int64), name="bad.gdtype"
        ),
    )
    # The response cache must not skip validation. Each rank caches one slot
    # per name, its latest ("cached" of shape [3]): rank 0 then asks with a
    # shape it had cached before (a miss: the full request) while the others
    # name the slot, and then with a shape nobody has cached.
    for n in (2, 3, 2, 3):
        hvd.allreduce(torch.ones(n), name="cached", op=hvd.Sum)
    check(
        "cache.slots",
        lambda: hvd.allreduce(torch.ones(2 if rank == 0 else 3), name="cached", op=hvd.Sum),
    )
    check(
        "cache.one",
        lambda: hvd.allreduce(torch.ones(2 if rank == 0 else 4), name="cached", op=hvd.Sum),
    )
    res["cache.same"] = hvd.allreduce(torch.ones(3), name="cached", op=hvd.Sum)
    # Unnamed ops with mismatched shapes: the error names the generated name.
    check("unnamed", lambda: hvd.allreduce(torch.ones(rank + 2)))
    # The same user name, a different collective: allreduce on rank 0, allgather elsewhere.
    res["optype"] = _attempt_async(
        hvd,
        limit=3.0,
        submit=lambda: (
            hvd.allreduce_async(torch.ones(2), name="bad.optype")
            if rank == 0
            else hvd.allgather_async(torch.ones(2), name="bad.optype")
        ),
    )
    res["optype.after"] = hvd.allreduce(torch.tensor([1.0]), name="after.optype", op=hvd.Sum)

    # Local argument errors, raised before any communication.
    for form in ("allreduce", "allgather", "broadcast"):
        args = (0,) if form == "broadcast" else ()
        fn = getattr(hvd, form)
        res["complex." + form] = attempt(
            lambda fn=fn, args=args: fn(torch.ones(2, dtype=torch.complex64), *args, name="cplx")
        )
    # Adasum is composed in Python (hvd_torch/adasum.py): the raw op refuses it.
    res["adasum"] = attempt(lambda: torch.ops.hvd_torch.allreduce(torch.ones(2), "adasum", 2,
                                                                  1.0, 1.0, 0))
    res["end"] = hvd.allreduce(torch.tensor([float(rank)]), name="end", op=hvd.Sum)
    return res


def _duplicates(hvd):
    """For each rank d in turn: d submits the same name twice while the others
    hold back, so d's first op cannot have completed when the second arrives.
    The second submission raises at once (Horovod's ValueError), submits
    nothing, and the name is free again once the first op has completed."""
    rank, size = hvd.rank(), hvd.size()
    res = []
    for dup in range(size):
        name = f"dup.{dup}"
        x = torch.full((3,), float(rank + 1))
        if rank == dup:
            first = hvd.allreduce_async(x, name=name, op=hvd.Sum)
            second = attempt(lambda x=x, name=name: hvd.allreduce_async(x, name=name, op=hvd.Sum))
            group = hvd.grouped_allreduce_async([x, x], name=f"gdup.{dup}", op=hvd.Sum)
            second_group = attempt(
                lambda x=x, dup=dup: hvd.grouped_allreduce_async([x, x], name=f"gdup.{dup}")
            )
            res.append((second, hvd.synchronize(first), second_group, hvd.synchronize(group)))
        else:
            time.sleep(0.25)
            out = hvd.allreduce(x, name=name, op=hvd.Sum)
            res.append((None, out, None, hvd.grouped_allreduce([x, x], name=f"gdup.{dup}",
                                                              op=hvd.Sum)))
        # Completed: the same name may be used again.
        res[-1] += (hvd.allreduce(x, name=name, op=hvd.Sum),)
    res.append(hvd.allreduce(torch.ones(1), name="dup.after", op=hvd.Sum))
    return res


def _caller_mistakes_rank():
    import hvd_torch as hvd

    hvd.init()
    out = {"duplicates": _duplicates(hvd), "mismatches": _mismatches(hvd)}
    hvd.shutdown()
    return out


_LAUNCHES = {}


def _caller_mistakes(nranks):
    """One run_ranks launch per rank count, shared by the caller-mistake tests."""
    if nranks not in _LAUNCHES:
        try:
            _LAUNCHES[nranks] = run_ranks(_caller_mistakes_rank, nranks, timeout=TIMEOUT)
        except (AssertionError, TimeoutError) as e:
            _LAUNCHES[nranks] = e
    if isinstance(_LAUNCHES[nranks], Exception):
        raise _LAUNCHES[nranks]
    return _LAUNCHES[nranks]


def _dying_rank(victim, how):
    """Everyone meets once; then the victim dies while the others allreduce."""
    import hvd_torch as hvd

    hvd.init()
    hvd.allreduce(torch.ones(1), name="warmup")
    if hvd.rank() == victim:
        time.sleep(0.5)  # the others are inside the next allreduce by now
        sys.stdout.flush()
        if how == "shutdown":  # alive, but gone from the job
            hvd.shutdown()
            time.sleep(1)  # still alive while the others notice
            return "shut down"
        if how == "exit":
            os._exit(3)
        os.kill(os.getpid(), 9)
        time.sleep(30)
    first = attempt(lambda: hvd.allreduce(torch.ones(100_000), name="doomed"))
    # The engine is broken now: new ops fail at once with the same kind of error.
    second = attempt(lambda: hvd.allreduce(torch.ones(1), name="later"))
    # Async ops too (their eager path translates the error as the op path does).
    third = attempt(lambda: hvd.synchronize(hvd.allreduce_async_(torch.ones(1), name="later.a")))
    return {"first": first, "second": second, "third": third}


def _rendezvous_rank():
    import hvd_torch as hvd

    store = (
        f"{os.environ['HOROVOD_GLOO_RENDEZVOUS_ADDR']}:{os.environ['HOROVOD_GLOO_RENDEZVOUS_PORT']}"
    )
    return store, attempt(hvd.init), hvd.is_initialized()


def _cycles_rank(cycles):
    import hvd_torch as hvd

    out = []
    for cycle in range(cycles):
        hvd.init()
        hvd.init()  # a second init() while initialised does nothing (Horovod)
        assert hvd.is_initialized()
        rank, size = hvd.rank(), hvd.size()
        named = hvd.allreduce(torch.tensor([float(rank + cycle)]), name="cycle", op=hvd.Sum)
        unnamed = hvd.allgather(torch.tensor([rank]))
        hvd.barrier()
        hvd.shutdown()
        after = {
            "is_initialized": hvd.is_initialized(),
            "allreduce": attempt(lambda: hvd.allreduce(torch.ones(1), name="x")),
            "allreduce_async": attempt(lambda: hvd.allreduce_async(torch.ones(1))),
            "broadcast": attempt(lambda: hvd.broadcast(torch.ones(1), 0)),
            "raw": attempt(lambda: torch.ops.hvd_torch.allgather(torch.ones(1))),
            "rank": attempt(hvd.rank),
        }
        out.append((size, named, unnamed, after))
    hvd.shutdown()  # a second shutdown is harmless
    return out


def _with_torch_distributed(port):
    import torch.distributed as dist

    import hvd_torch as hvd
    from hvd_torch import _C

    hvd.init()
    rank, size = hvd.rank(), hvd.size()
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group(
        "gloo", rank=rank, world_size=size, timeout=datetime.timedelta(seconds=30)
    )
    out = []
    for step in range(3):  # interleaved, so each library runs with the other's state live
        x = torch.arange(1000, dtype=torch.float32) * (rank + 1 + step)
        y = x.clone()
        dist.all_reduce(y)
        out.append((y, hvd.allreduce(x, name=f"mix.{step}", op=hvd.Sum)))
    big = torch.full((50_000,), float(rank))
    dist.broadcast(big, 1)
    out.append((big, hvd.allreduce(torch.full((50_000,), float(rank)), name="mix.big", op=hvd.Max)))
    dist.destroy_process_group()
    hvd.shutdown()
    return out, _C.gloo_library_path()


# ---------------------------------------------------------------- tests


def test_ops_before_init_raise_clearly():
    """In a subprocess, so this test process never starts an engine."""
    child = textwrap.dedent(
        """
        import json, torch
        import hvd_torch as hvd
        out = {}
        for name, fn in [
            ("allreduce", lambda: hvd.allreduce(torch.ones(1))),
            ("allgather", lambda: hvd.allgather(torch.ones(1))),
            ("broadcast", lambda: hvd.broadcast(torch.ones(1), 0)),
            ("allreduce_async", lambda: hvd.allreduce_async(torch.ones(1))),
            ("barrier", lambda: hvd.barrier()),
            ("raw", lambda: torch.ops.hvd_torch.allreduce(torch.ones(1))),
            ("rank", lambda: hvd.rank()),
            ("size", lambda: hvd.size()),
        ]:
            try:
                fn()
                out[name] = None
            except Exception as e:
                out[name] = [type(e).__name__, str(e).splitlines()[0]]
        out["is_initialized"] = hvd.is_initialized()
        print(json.dumps(out))
        """
    )
    env = {k: v for k, v in os.environ.items() if not k.startswith("HOROVOD_")}
    run = subprocess.run(
        [sys.executable, "-c", child],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert run.returncode == 0, run.stderr
    out = json.loads(run.stdout.strip().splitlines()[-1])
    assert out.pop("is_initialized") is False
    for name, outcome in out.items():
        assert outcome is not None, f"{name} before init() did not raise"
        exc_type, message = outcome
        # As Horovod: ValueError("Horovod has not been initialized; use hvd.init().")
        assert exc_type == "ValueError", (name, outcome)
        assert "before hvd_torch.init()" in message and "hvd.init()" in message, (name, message)
        op = "allreduce" if name in ("raw", "allreduce_async") else name
        assert f"hvd_torch.{op}" in message, (name, message)


@pytest.mark.unit
def test_build_facts_tell_what_was_compiled():
    import torch

    import hvd_torch as hvd  # importing does not start the engine

    # The checkout on sys.path only for this import: left there, a later fresh
    # rank (which takes this process's sys.path) imported the checkout's
    # hvd_torch rather than the one under test (scripts/sanitize.sh's build/asan).
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    sys.path.insert(0, root)
    try:
        from build_config import cuda_enabled
    finally:
        sys.path.remove(root)

    assert hvd.gloo_built() is True
    # CUDA sources compile exactly when setup.py found a CUDA torch and nvcc.
    assert hvd.cuda_built() is cuda_enabled()
    if torch.version.cuda is None:
        assert hvd.cuda_built() is False and hvd.nccl_built() is False
    assert not hvd.nccl_built() or hvd.cuda_built()
    assert not hvd.is_initialized()


@pytest.mark.parametrize("nranks", [2, 3])
def test_duplicate_in_flight_name_raises(nranks):
    results = [out["duplicates"] for out in _caller_mistakes(nranks)]
    for rank, res in enumerate(results):
        for dup in range(nranks):
            second, first, second_group, group, again = res[dup]
            expected = torch.full((3,), float(sum(r + 1 for r in range(nranks))))
            assert torch.equal(first, expected), f"rank {rank}, round {dup}: {first}"
            assert torch.equal(again, expected), f"rank {rank}, round {dup}, reused: {again}"
            assert len(group) == 2 and all(torch.equal(g, expected) for g in group), group
            if rank == dup:
                exc_type, message, elapsed = second
                assert exc_type == "ValueError", second
                assert elapsed < 1.0, f"raised after {elapsed:.2f} s, not at submission"
                assert (
                    f"allreduce 'dup.{dup}': an operation with the same name is already in "
                    f"flight on rank {rank}" in message
                ), message
                exc_type, message, _ = second_group
                assert exc_type == "ValueError", second_group
                # A grouped allreduce of one dtype is one op named after its group.
                assert f"grouped_allreduce 'gdup.{dup}'" in message, message
                assert "already in flight" in message, message
            else:
                assert second is None and second_group is None
        assert torch.equal(res[-1], torch.tensor([float(nranks)]))


@pytest.mark.parametrize("nranks", [2, 3])
def test_mismatched_arguments_raise_on_every_rank_and_the_job_goes_on(nranks):
    results = [out["mismatches"] for out in _caller_mistakes(nranks)]

    def each_rank(value):
        return ", ".join(f"rank {r} {value(r)}" for r in range(nranks))

    def first_other(a, b):
        return lambda r: a if r == 0 else b

    def mismatch(op, name, what, value):
        return f"{op} '{name}': mismatched {what} across ranks: {each_rank(value)}"

    def plus_half(r):
        return f"{1.0 + 0.5 * r:g}"

    gather_shapes = "shapes (all dimensions but the first must match)"
    expected = {
        "shape": mismatch("allreduce", "bad.shape", "shapes", lambda r: [r + 1]),
        "dtype": mismatch("allreduce", "bad.dtype", "dtypes", first_other("float32", "float64")),
        "op": mismatch("allreduce", "bad.op", "reduce ops", first_other("Sum", "Max")),
        "prescale": mismatch("allreduce", "bad.prescale", "prescale factors", plus_half),
        "postscale": mismatch("allreduce", "bad.postscale", "postscale factors", plus_half),
        "large.shape": mismatch("allreduce", "bad.large.shape", "shapes", lambda r: [10_000 + r]),
        "root": mismatch("broadcast", "bad.root", "root ranks", lambda r: r),
        "broadcast.shape": mismatch("broadcast", "bad.bshape", "shapes", lambda r: [r + 1]),
        "allgather.shape": mismatch("allgather", "bad.gshape", gather_shapes, lambda r: [1, r + 1]),
        "allgather.dtype": mismatch(
            "allgather", "bad.gdtype", "dtypes", first_other("int32", "int64")
        ),
        "cache.slots": mismatch("allreduce", "cached", "shapes", first_other([2], [3])),
        "cache.one": mismatch("allreduce", "cached", "shapes", first_other([2], [4])),
        # Unnamed: the name is generated (allreduce.noname.<n>), checked below.
        "unnamed": f"mismatched shapes across ranks: {each_rank(lambda r: [r + 2])}",
    }
    for rank, res in enumerate(results):
        what = f"rank {rank} of {nranks}"
        for kind, text in expected.items():
            exc_type, message, elapsed = res[kind]
            assert exc_type == "RefusedError", f"{what}, mismatched {kind}: {res[kind]}"
            assert text in message, (
                f"{what}, mismatched {kind}:\n  got      {message!r}\n  expected {text!r}"
            )
            assert elapsed < FAST, f"{what}, mismatched {kind}: raised after {elapsed:.1f} s"
            after = res[kind + ".after"]
            assert torch.equal(after, torch.tensor([float(nranks)])), (
                f"{what}: allreduce after mismatched {kind} gave {after}"
            )
        assert "allreduce.noname." in res["unnamed"][1], res["unnamed"]
        assert torch.equal(res["cache.same"], torch.full((3,), float(nranks)))

        for form in ("allreduce", "allgather", "broadcast"):
            exc_type, message, _ = res["complex." + form]
            assert exc_type == "ValueError", (form, res["complex." + form])
            assert "'cplx'" in message and "unsupported dtype" in message, message
            assert "complex64" in message or "ComplexFloat" in message, message
        exc_type, message, _ = res["adasum"]
        assert exc_type == "ValueError" and "unsupported reduce op 2" in message, res["adasum"]
        assert torch.equal(res["end"], torch.tensor([float(sum(range(nranks)))]))

    # Last, so the checks above run while this fails: allreduce on rank 0 and
    # allgather elsewhere under one name must fail like any other mismatch
    # (docs/errors.md: "mismatched operations for tensor '<name>'").
    for rank, res in enumerate(results):
        exc_type, message, elapsed = res["optype"]
        assert (
            exc_type == "RefusedError"
            and "mismatched operations" in message
            and "bad.optype" in message
        ), f"rank {rank} of {nranks}, allreduce vs allgather under one name: {res['optype']}"
        assert torch.equal(res["optype.after"], torch.tensor([float(nranks)]))


@pytest.mark.parametrize(
    "nranks,victim,how",
    [
        (2, 1, "exit"),
        (3, 2, "sigkill"),
        (2, 0, "exit"),
        (2, 1, "shutdown"),
    ],
)
def test_dead_rank_fails_the_others_quickly(nranks, victim, how):
    outcomes = run_ranks(_dying_rank, nranks, args=(victim, how), timeout=TIMEOUT, expect_fail=True)
    dead = outcomes[victim]
    if how == "shutdown":
        assert dead == "shut down", str(dead)
    else:
        assert isinstance(dead, RankFailure), dead
        assert dead.exitcode == (3 if how == "exit" else -9), dead
    for rank, outcome in enumerate(outcomes):
        if rank == victim:
            continue
        assert not isinstance(outcome, RankFailure), str(outcome)
        exc_type, message, elapsed = outcome["first"]
        assert exc_type == "HorovodInternalError", f"rank {rank}: {outcome['first']}"
        assert elapsed < 15, f"rank {rank} raised only after {elapsed:.1f} s"
        assert f"rank {victim}" in message, message
        if how == "shutdown":
            assert "shutdown()" in message, message
        for later in ("second", "third"):
            exc_type, _, elapsed = outcome[later]
            assert exc_type == "HorovodInternalError" and elapsed < 1, (
                f"rank {rank}: {later} {outcome[later]}"
            )


def test_incomplete_rendezvous_names_store_and_missing_rank():
    env = {"HOROVOD_SIZE": "3", "HOROVOD_LOCAL_SIZE": "3", "HOROVOD_START_TIMEOUT": "3"}
    outcomes = run_ranks(_rendezvous_rank, 2, env=env, timeout=TIMEOUT, expect_fail=True)
    for rank, outcome in enumerate(outcomes):
        assert not isinstance(outcome, RankFailure), str(outcome)
        store, (exc_type, message, elapsed), initialized = outcome
        assert exc_type == "RuntimeError", f"rank {rank}: {exc_type}: {message}"
        assert "rendezvous failed" in message and f"on rank {rank}" in message, message
        assert store in message, f"rank {rank}: the store {store} is not named: {message}"
        assert "ranks that never arrived: [2]" in message, message
        assert elapsed < 15, f"rank {rank} gave up after {elapsed:.1f} s (HOROVOD_START_TIMEOUT=3)"
        assert initialized is False


def test_shutdown_then_init_again_and_ops_after_shutdown_raise():
    cycles = 3
    results = run_ranks(_cycles_rank, 2, args=(cycles,), timeout=TIMEOUT)
    for rank, out in enumerate(results):
        assert len(out) == cycles
        for cycle, (size, named, unnamed, after) in enumerate(out):
            what = f"rank {rank}, cycle {cycle}"
            assert size == 2
            assert torch.equal(named, torch.tensor([float(1 + 2 * cycle)])), (what, named)
            assert torch.equal(unnamed, torch.tensor([0, 1])), (what, unnamed)
            assert after.pop("is_initialized") is False, what
            for op, (exc_type, message, _) in after.items():
                assert exc_type == "ValueError", (
                    f"{what}: {op} after shutdown: {exc_type} {message}"
                )
                assert "before hvd_torch.init()" in message, (
                    f"{what}: {op} after shutdown: {message}"
                )


def _free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_torch_distributed_gloo_and_hvd_torch_in_one_process():
    results = run_ranks(_with_torch_distributed, 2, args=(_free_port(),), timeout=TIMEOUT)
    for rank, (out, gloo_path) in enumerate(results):
        assert "libgloo" in os.path.basename(gloo_path), gloo_path
        for step in range(3):
            dist_result, hvd_result = out[step]
            expected = torch.arange(1000, dtype=torch.float32) * (3 + 2 * step)
            assert torch.equal(dist_result, expected), f"rank {rank}, torch.distributed step {step}"
            assert torch.equal(hvd_result, expected), f"rank {rank}, hvd_torch step {step}"
        dist_big, hvd_big = out[3]
        assert torch.equal(dist_big, torch.ones(50_000)) and torch.equal(
            hvd_big, torch.ones(50_000)
        )
