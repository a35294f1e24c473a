"""Adasum: Horovod's adaptive summation of gradients, op=hvd.Adasum.

Two ranks' vectors a and b combine into

    (1 - a.b / (2 |a|^2)) a + (1 - a.b / (2 |b|^2)) b

which is a + b when they are orthogonal and a when they are equal: parallel
gradients are averaged, independent ones added. Over n ranks the pairs form a
binary tree by rank (0 with 1, 2 with 3, then {0,1} with {2,3}, ...), as in
Horovod. With n not a power of two, rank p + i (p the largest power of two
below n) is first folded into rank i (Horovod refuses such sizes).

The tree runs as recursive vector halving, distance doubling, over the
engine's own collectives (hvd_torch never needs a new data plane for it): at
distance d, partners rank ^ d swap halves of their segment with one alltoall,
each computes a.b, |a|^2 and |b|^2 over its half, one small allreduce sums
those over the ranks that together hold the two vectors, and each combines its
half. After log2(p) levels every rank holds 1/p of the result; an allgather
puts it together. Bytes moved per rank are those of a reduce-scatter plus an
allgather, like a ring allreduce. Dot products accumulate in float64; float16
and bfloat16 are combined in float32 and rounded once.

Eager only: the functions below compose ops in Python (torch.compile runs them
outside the graph; TorchScript has no Adasum).
"""

from __future__ import annotations

import itertools

import torch
from torch.distributed import DistNetworkError

from hvd_torch.basics import Sum
from hvd_torch.exceptions import HorovodInternalError

_ops = torch.ops.hvd_torch
_FLOATS = (torch.float16, torch.bfloat16, torch.float32, torch.float64)
_unnamed = itertools.count()


def base_name(name: str | None) -> str:
    """The prefix of an Adasum's sub-op names; unnamed calls are numbered in
    call order, so every rank must issue its unnamed Adasums in the same order."""
    return name if name else f"adasum.noname.{next(_unnamed)}"


@torch.compiler.disable
def reduce(tensor: torch.Tensor, name: str, prescale: float, postscale: float,
           process_set) -> torch.Tensor:
    """Adasum of `tensor` over the ranks of `process_set`, as a new tensor."""
    if tensor.dtype not in _FLOATS:
        raise ValueError(f"allreduce '{name}': op=Adasum needs a floating-point tensor "
                         f"(float16, bfloat16, float32, float64), got {tensor.dtype}")
    work = tensor.detach().reshape(-1)
    work = work.float() if work.dtype in (torch.float16, torch.bfloat16) else work.clone()
    if prescale != 1.0:
        work.mul_(prescale)
    try:
        out = _tree(work, name, process_set.size(), process_set.rank(), process_set._id())
    except DistNetworkError as e:  # a peer failed: as every op reports it
        raise HorovodInternalError(str(e)) from None
    if postscale != 1.0:
        out.mul_(postscale)
    return out.to(tensor.dtype).reshape(tensor.shape)


class _Differentiable(torch.autograd.Function):
    """The gradient of an Adasum is the Adasum of the gradient (Horovod's rule
    for allreduce: the same op on the way back)."""

    @staticmethod
    def forward(ctx, tensor, name, prescale, postscale, process_set):
        ctx.args = (name, prescale, postscale, process_set)
        return reduce(tensor, name, prescale, postscale, process_set)

    @staticmethod
    def backward(ctx, grad):
        name, prescale, postscale, process_set = ctx.args
        return reduce(grad, f"{name}.grad", prescale, postscale, process_set), None, None, None, \
            None


def allreduce(tensor, name, prescale, postscale, process_set) -> torch.Tensor:
    """hvd.allreduce(..., op=Adasum): differentiable when `tensor` requires grad."""
    base = base_name(name)
    if tensor.requires_grad and torch.is_grad_enabled():
        return _Differentiable.apply(tensor, base, prescale, postscale, process_set)
    return reduce(tensor, base, prescale, postscale, process_set)


class Handle:
    """What allreduce_async(op=Adasum) returns: the work is done when the call
    returns (each level waits for the partner's half), so poll() is True."""

    def __init__(self, result: torch.Tensor):
        self.result = result

    def poll(self) -> bool:
        return True


def _pair_stats(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """[a.b, |a|^2, |b|^2] in float64."""
    a, b = a.double(), b.double()
    return torch.stack([torch.dot(a, b), torch.dot(a, a), torch.dot(b, b)])


def _combine(a: torch.Tensor, b: torch.Tensor, stats: torch.Tensor) -> torch.Tensor:
    """Adasum of a and b, given _pair_stats of the whole vectors they are part of.
    A zero vector's coefficient does not matter (it multiplies zeros): 1."""
    dot, a2, b2 = stats[0], stats[1], stats[2]
    one = torch.ones((), dtype=stats.dtype, device=stats.device)
    ca = torch.where(a2 > 0, 1 - dot / (2 * torch.where(a2 > 0, a2, one)), one)
    cb = torch.where(b2 > 0, 1 - dot / (2 * torch.where(b2 > 0, b2, one)), one)
    return ca.to(a.dtype) * a + cb.to(b.dtype) * b


def _splits(n: int, to: int | None, count: int) -> torch.Tensor:
    """alltoall splits sending `count` elements to rank `to` only."""
    splits = [0] * n
    if to is not None:
        splits[to] = count
    return torch.tensor(splits, dtype=torch.int32)


def _segment(rank: int, p: int, count: int) -> tuple[int, int]:
    """The part [lo, hi) of the result that `rank` (< p) holds after the halving."""
    lo, hi, d = 0, count, 1
    while d < p:
        mid = lo + (hi - lo) // 2
        lo, hi = (mid, hi) if rank & d else (lo, mid)
        d *= 2
    return lo, hi


def _tree(x: torch.Tensor, name: str, n: int, me: int, ps: int) -> torch.Tensor:
    if n == 1:
        return x
    p = 1 << (n.bit_length() - 1)
    count = x.numel()
    if n > p:  # fold rank p + i into rank i
        to = me - p if me >= p else None
        got, _ = _ops.alltoall(x if to is not None else x[:0], _splits(n, to, count),
                               f"{name}.adasum.fold", ps)
        if me < n - p:
            x = _combine(x, got, _pair_stats(x, got))
    lo, hi, d = 0, count, 1
    while d < p:
        mid = lo + (hi - lo) // 2
        lower = not me & d
        keep, give = ((lo, mid), (mid, hi)) if lower else ((mid, hi), (lo, mid))
        active = me < p
        out = x[give[0] - lo:give[1] - lo] if active else x[:0]
        got, _ = _ops.alltoall(out.contiguous(),
                               _splits(n, me ^ d if active else None, out.numel()),
                               f"{name}.adasum.{d}.halves", ps)
        stats = torch.zeros(3 * (p // (2 * d)), dtype=torch.float64, device=x.device)
        if active:
            mine = x[keep[0] - lo:keep[1] - lo]
            a, b = (mine, got) if lower else (got, mine)
            group = me // (2 * d)
            stats[3 * group:3 * group + 3] = _pair_stats(a, b)
        stats = _ops.allreduce(stats, f"{name}.adasum.{d}.stats", Sum, 1.0, 1.0, ps)
        if active:
            x = _combine(a, b, stats[3 * group:3 * group + 3])
            lo, hi = keep
        d *= 2
    pieces = _ops.allgather(x if me < p else x[:0], f"{name}.adasum.gather", ps)
    result = torch.empty(count, dtype=x.dtype, device=x.device)
    at = 0
    for rank in range(p):
        lo, hi = _segment(rank, p, count)
        result[lo:hi] = pieces[at:at + hi - lo]
        at += hi - lo
    return result
