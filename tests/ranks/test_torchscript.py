"""The hvd_torch ops from TorchScript: scripted functions and modules, their
gradients, a module saved by rank 0 then loaded and run by fresh ranks, and a
committed module saved with older schemas (tests/fixtures) that must still run.

The scripted code calls torch.ops.hvd_torch.* directly, as a TorchScript user
must (the Python wrappers are not scriptable).  Op ints: Average=0, Sum=1.
"""

import os

import pytest
import torch

from dist_harness import run_ranks

TIMEOUT = 120
NRANKS = [1, 2, 3]


# ---------------------------------------------------------------- scripted code


def _average(x: torch.Tensor) -> torch.Tensor:
    return torch.ops.hvd_torch.allreduce(x)  # every default: Average, unnamed


def _async_sum(x: torch.Tensor) -> torch.Tensor:
    handle = torch.ops.hvd_torch.allreduce_async(x, "ts.async", 1)
    return torch.ops.hvd_torch.synchronize(handle)


def _in_place_twice(x: torch.Tensor) -> torch.Tensor:
    # Two identical mutating calls: neither may be merged or dropped.
    torch.ops.hvd_torch.allreduce_(x, "ts.inplace.1", 1)
    torch.ops.hvd_torch.allreduce_(x, "ts.inplace.2", 1)
    return x


def _broadcast_in_place(x: torch.Tensor) -> torch.Tensor:
    torch.ops.hvd_torch.synchronize(torch.ops.hvd_torch.broadcast_async_(x, 0, "ts.bcast.async_"))
    torch.ops.hvd_torch.broadcast_(x, 0, "ts.bcast_")
    return x


def _differentiable(
    x: torch.Tensor, w: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    a = torch.ops.hvd_torch.allreduce(x * w, "ts.grad.allreduce", 1)
    g = torch.ops.hvd_torch.allgather(x * w, "ts.grad.allgather")
    b = torch.ops.hvd_torch.broadcast(x * w, 0, "ts.grad.broadcast")
    return a, g, b


class Collectives(torch.nn.Module):
    """A module whose forward runs one of each collective, plus a layer."""

    def __init__(self, root: int):
        super().__init__()
        self.root = root
        self.linear = torch.nn.Linear(3, 2, dtype=torch.float64)
        with torch.no_grad():
            self.linear.weight.copy_(torch.arange(6, dtype=torch.float64).reshape(2, 3) / 10)
            self.linear.bias.fill_(1.0)

    def forward(self, x: torch.Tensor) -> list[torch.Tensor]:
        y = self.linear(x)
        summed = torch.ops.hvd_torch.allreduce(y, "module.allreduce", 1)
        averaged = torch.ops.hvd_torch.allreduce(y, "module.average")
        gathered = torch.ops.hvd_torch.allgather(y, "module.allgather")
        broadcast = torch.ops.hvd_torch.broadcast(y, self.root, "module.broadcast")
        return [summed, averaged, gathered, broadcast]


def _module_input(rank: int) -> torch.Tensor:
    return torch.arange(6, dtype=torch.float64).reshape(2, 3) + rank


def _module_reference(nranks: int, root: int) -> list[torch.Tensor]:
    module = Collectives(root)
    with torch.no_grad():
        ys = [module.linear(_module_input(r)) for r in range(nranks)]
    return [sum(ys), sum(ys) / nranks, torch.cat(ys), ys[root]]


# ---------------------------------------------------------------- rank side


def _script_rank(save_dir):
    import hvd_torch as hvd

    hvd.init()
    rank, size = hvd.rank(), hvd.size()
    res = {}
    average = torch.jit.script(_average)
    res["average"] = average(torch.full((4,), float(rank)))
    res["async"] = torch.jit.script(_async_sum)(torch.full((4,), float(rank)))
    # In-place ops, kept apart so that their failure does not hide the rest.
    for fn, x in [
        (_in_place_twice, torch.ones(3) * (rank + 1)),
        (_broadcast_in_place, torch.full((2,), float(rank))),
    ]:
        try:
            res[fn.__name__] = torch.jit.script(fn)(x)
        except RuntimeError as e:
            res[fn.__name__] = f"RuntimeError: {e}"

    module = torch.jit.script(Collectives(size - 1))
    res["module"] = module(_module_input(rank))
    if rank == 0:
        torch.jit.save(module, os.path.join(save_dir, "collectives.pt"))

    # Gradients through a scripted function, one per differentiable op.
    differentiable = torch.jit.script(_differentiable)
    grads = []
    for which in range(3):
        x = torch.full((2,), 1.0 + rank, dtype=torch.float64, requires_grad=True)
        w = torch.tensor([1.0, 2.0], dtype=torch.float64)
        outs = differentiable(x, w)
        outs[which].sum().backward()
        grads.append(x.grad)
    res["grads"] = grads
    # Gradient through the scripted module's parameters (allreduce Sum is the first output).
    module = torch.jit.script(Collectives(0))
    module(_module_input(rank))[0].sum().backward()
    res["weight.grad"] = module.linear.weight.grad
    hvd.shutdown()
    return res


# A module saved by the build before the per-op options of issue #46
# (tests/fixtures/make_saved_collectives.py): every op, arguments positional.
SAVED_V1 = os.path.join(os.path.dirname(__file__), "..", "fixtures", "saved_collectives_v1.ptz")


def _saved_input(rank: int, nranks: int) -> torch.Tensor:
    return torch.arange(2 * nranks * 3, dtype=torch.float64).reshape(2 * nranks, 3) + 100 * rank


def _saved_reference(rank: int, nranks: int) -> list[torch.Tensor]:
    """What SavedCollectives.forward returns on `rank`, in plain torch."""
    xs = [_saved_input(r, nranks) for r in range(nranks)]
    total, gathered, root = sum(xs), torch.cat(xs), nranks - 1
    rows = slice(2 * rank, 2 * rank + 2)
    mine = [x[rows] for x in xs]
    received = torch.full((nranks,), 2, dtype=torch.int32)
    to_root = torch.zeros(nranks, dtype=torch.int32)
    if rank == root:
        to_root.fill_(2 * nranks)
    return [
        total / 2, total / nranks, xs[-1], xs[0],  # allreduce: Sum scaled by 1/2, Average, Max, Min
        gathered, gathered,  # allgather, allgather_async
        xs[root], xs[root], xs[root], xs[root],  # broadcast, _, _async, _async_
        (total / 2)[rows], (total / nranks)[rows],  # reducescatter, reducescatter_async
        total, 2 * total, total, 2 * total, total, 2 * total, total, 2 * total,  # grouped allreduces
        gathered, 2 * gathered, gathered, 2 * gathered,  # grouped allgathers
        (total / 2)[rows], total[rows], total[rows], 2 * total[rows],  # grouped reducescatters
        torch.cat(mine), received,  # alltoall, even split
        gathered if rank == root else gathered[:0], to_root,  # alltoall_async, all rows to root
    ]


def _saved_v1_rank(nranks):
    import hvd_torch as hvd  # registers torch.ops.hvd_torch before torch.jit.load

    hvd.init()
    module = torch.jit.load(SAVED_V1)
    out = module(_saved_input(hvd.rank(), nranks), nranks, 0)
    hvd.shutdown()
    return out


def _load_rank(save_dir):
    import hvd_torch as hvd  # registers torch.ops.hvd_torch before torch.jit.load

    hvd.init()
    module = torch.jit.load(os.path.join(save_dir, "collectives.pt"))
    out = [module(_module_input(hvd.rank())) for _ in range(2)]  # twice: names are reusable
    hvd.shutdown()
    return out


# ---------------------------------------------------------------- tests


def _close(out, expected, what):
    torch.testing.assert_close(out, expected, msg=lambda m: f"{what}: {m}")


@pytest.mark.parametrize("nranks", [2, 3])
def test_module_saved_with_older_schemas_loads_and_runs(nranks):
    """Schemas only gain arguments with defaults: code saved before still runs."""
    results = run_ranks(_saved_v1_rank, nranks, args=(nranks,), timeout=TIMEOUT)
    for rank, out in enumerate(results):
        expected = _saved_reference(rank, nranks)
        assert len(out) == len(expected) + 2, f"rank {rank}: {len(out)} outputs"
        for i, (got, want) in enumerate(zip(out, expected)):
            _close(got, want, f"rank {rank} of {nranks}, saved v1 module output {i}")
        barrier, last_joined = out[-2:]
        assert barrier.numel() == 1, f"rank {rank}: barrier returned {barrier}"
        assert 0 <= int(last_joined) < nranks, f"rank {rank}: join returned {last_joined}"


@pytest.mark.parametrize("nranks", NRANKS)
def test_scripted_functions_modules_and_saved_module(nranks, tmp_path):
    results = run_ranks(_script_rank, nranks, args=(str(tmp_path),), timeout=TIMEOUT)
    mean_rank = sum(range(nranks)) / nranks
    for rank, res in enumerate(results):
        what = f"rank {rank} of {nranks}"
        _close(res["average"], torch.full((4,), mean_rank), f"{what}: scripted default allreduce")
        _close(res["async"], torch.full((4,), float(sum(range(nranks)))), f"{what}: scripted async")
        for i, (out, expected) in enumerate(
            zip(res["module"], _module_reference(nranks, nranks - 1))
        ):
            _close(out, expected, f"{what}: scripted module output {i}")

        w = torch.tensor([1.0, 2.0], dtype=torch.float64)
        allreduce_grad, allgather_grad, broadcast_grad = res["grads"]
        # allreduce Sum: the upstream ones are summed over ranks.
        _close(allreduce_grad, w * nranks, f"{what}: gradient through scripted allreduce")
        # allgather: upstream ones averaged over ranks (Horovod's rule), narrowed to our rows.
        _close(allgather_grad, w, f"{what}: gradient through scripted allgather")
        # broadcast: upstream ones averaged over ranks on the root, zero elsewhere.
        expected = w if rank == 0 else torch.zeros(2, dtype=torch.float64)
        _close(broadcast_grad, expected, f"{what}: gradient through scripted broadcast")
        # loss = sum(allreduce_sum(x_r W^T + b)): the upstream gradient of y_r is
        # allreduce_sum(ones) = nranks, so dW = nranks * (column sums of x_r) in each row.
        expected = nranks * _module_input(rank).sum(0, keepdim=True).expand(2, 3)
        _close(res["weight.grad"], expected, f"{what}: scripted module weight gradient")

    assert (tmp_path / "collectives.pt").is_file(), "rank 0 did not save the scripted module"
    loaded = run_ranks(_load_rank, nranks, args=(str(tmp_path),), timeout=TIMEOUT)
    for rank, outs in enumerate(loaded):
        for call, out in enumerate(outs):
            for i, (got, expected) in enumerate(zip(out, _module_reference(nranks, nranks - 1))):
                _close(
                    got, expected, f"rank {rank} of {nranks}, loaded module call {call} output {i}"
                )

    # Last, so the checks above run even while this fails: scripting in-place ops.
    for rank, res in enumerate(results):
        what = f"rank {rank} of {nranks}"
        for name in ("_in_place_twice", "_broadcast_in_place"):
            assert not isinstance(res[name], str), (
                f"{what}: torch.jit.script({name}) failed: {res[name]}"
            )
        total = float(sum(r + 1 for r in range(nranks)))
        _close(
            res["_in_place_twice"],
            torch.full((3,), total * nranks),
            f"{what}: two scripted in-place allreduces",
        )
        _close(res["_broadcast_in_place"], torch.zeros(2), f"{what}: scripted in-place broadcasts")
