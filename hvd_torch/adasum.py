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

from hvd_torch import _C
from hvd_torch.basics import Sum
from hvd_torch.exceptions import HorovodInternalError

_ops = torch.ops.hvd_torch
_FLOATS = (torch.float16, torch.bfloat16, torch.float32, torch.float64)
_unnamed = itertools.count()
_CHUNK = 1 << 16  # elements widened to float64 at a time on the host (_pair_stats)
# A vector whose squared norm is below this counts as zero in _combine: its
# coefficient is 1, as in Horovod. With "> 0" instead, a vector that cancels
# to rounding noise (two opposite updates folded together) would get a wild
# coefficient where an exact zero gets 1: results that jump with the last bit.
_ZERO_NORMSQ = 1e-8


def base_name(name: str | None) -> str:
    """The prefix of an Adasum's sub-op names; unnamed calls are numbered in
    call order, so every rank must issue its unnamed Adasums in the same order."""
    return name if name else f"adasum.noname.{next(_unnamed)}"


def reduce(tensor: torch.Tensor, name: str, prescale: float, postscale: float,
           process_set) -> torch.Tensor:
    """Adasum of `tensor` over the ranks of `process_set`, as a new tensor."""
    return reduce_many([tensor], name, prescale, postscale, process_set)[0]


@torch.compiler.disable
def reduce_many(tensors, name: str, prescale: float, postscale: float,
                process_set) -> list[torch.Tensor]:
    """The Adasum of each tensor (each its own tree: its own dot products),
    with one set of collectives for all tensors of a dtype and device."""
    for i, tensor in enumerate(tensors):
        if tensor.dtype not in _FLOATS:
            what = f"'{name}'" if len(tensors) == 1 else f"'{name}' (tensor {i})"
            raise ValueError(f"allreduce {what}: op=Adasum needs a floating-point tensor "
                             f"(float16, bfloat16, float32, float64), got {tensor.dtype}")
    if not _C.is_initialized():
        raise ValueError(f"hvd_torch.allreduce '{name}' (op=Adasum) was called before "
                         "hvd_torch.init(): call hvd.init() first")
    ps = process_set._id()
    if not process_set.included():
        raise ValueError(f"hvd_torch.allreduce '{name}': rank {_C.rank()} is not in process set "
                         f"{ps} (ranks {process_set.ranks})")
    # Views of the inputs where possible: _tree never writes into its inputs.
    works = []
    for tensor in tensors:
        work = tensor.detach().reshape(-1)
        work = work.float() if work.dtype in (torch.float16, torch.bfloat16) else work
        works.append(work * prescale if prescale != 1.0 else work)
    # Batches in order of first appearance: the same on every rank.
    batches: dict[tuple, list[int]] = {}
    for i, work in enumerate(works):
        batches.setdefault((work.dtype, work.device), []).append(i)
    outs: list[torch.Tensor | None] = [None] * len(tensors)
    n, me = process_set.size(), process_set.rank()
    try:
        for k, members in enumerate(batches.values()):
            label = name if len(batches) == 1 else f"{name}.{k}"
            for i, out in zip(members, _tree([works[i] for i in members], label, n, me, ps)):
                outs[i] = out
    except DistNetworkError as e:  # a peer failed: as every op reports it
        raise HorovodInternalError(str(e)) from None
    results = []
    for tensor, out in zip(tensors, outs):
        if postscale != 1.0:
            out = out * postscale
        elif out.numel() and out.data_ptr() == tensor.data_ptr():
            out = out.clone()  # one rank: the result must not be the input
        results.append(out.to(tensor.dtype).reshape(tensor.shape))
    return results


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
    """[a.b, |a|^2, |b|^2], accumulated in float64.

    Host tensors are widened a cache-sized chunk at a time: widening a whole
    half of a large gradient allocates (and page-faults) twice its size, 5x
    slower than the arithmetic (2M floats: 23 ms against 4.4 ms)."""
    step = _CHUNK if a.device.type == "cpu" and a.dtype != torch.float64 else max(a.numel(), 1)
    total = torch.zeros(3, dtype=torch.float64, device=a.device)
    for at in range(0, a.numel(), step):
        x, y = a[at:at + step].double(), b[at:at + step].double()
        total += torch.stack([torch.dot(x, y), torch.dot(x, x), torch.dot(y, y)])
    return total


def _combine(a: torch.Tensor, b: torch.Tensor, stats) -> torch.Tensor:
    """Adasum of a and b, given _pair_stats of the whole vectors they are part of.
    A vector with a squared norm below _ZERO_NORMSQ gets coefficient 1 (Horovod's rule).

    stats is a list of floats for host tensors (two tensor ops instead of a
    dozen: most of a small Adasum's cost) and a tensor for device ones, whose
    coefficients stay on the device (no wait for the GPU)."""
    if isinstance(stats, list):
        dot, a2, b2 = stats
        ca = 1 - dot / (2 * a2) if a2 >= _ZERO_NORMSQ else 1.0
        cb = 1 - dot / (2 * b2) if b2 >= _ZERO_NORMSQ else 1.0
        return torch.mul(a, ca).add_(b, alpha=cb)
    dot, a2, b2 = stats[0], stats[1], stats[2]
    one = torch.ones((), dtype=stats.dtype, device=stats.device)

    def coefficient(normsq):
        nonzero = normsq >= _ZERO_NORMSQ
        return torch.where(nonzero, 1 - dot / (2 * torch.where(nonzero, normsq, one)), one)

    return coefficient(a2).to(a.dtype) * a + coefficient(b2).to(b.dtype) * b


def _cat(xs: list[torch.Tensor]) -> torch.Tensor:
    """torch.cat without the copy of a lone tensor."""
    return xs[0] if len(xs) == 1 else torch.cat(xs)


def _host(stats: torch.Tensor):
    """stats as nested lists of floats when they are in host memory (see _combine)."""
    return stats.tolist() if stats.device.type == "cpu" else stats


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


def _tree(xs: list[torch.Tensor], name: str, n: int, me: int, ps: int) -> list[torch.Tensor]:
    """Adasum of each 1-D tensor of `xs` (one dtype and device) over the n ranks."""
    if n == 1:
        return xs
    p = 1 << (n.bit_length() - 1)
    counts = [x.numel() for x in xs]
    empty = xs[0][:0]
    if n > p:  # fold rank p + i into rank i
        to = me - p if me >= p else None
        got, _ = _ops.alltoall(_cat(xs) if to is not None else empty,
                               _splits(n, to, sum(counts)), f"{name}.adasum.fold", ps)
        if me < n - p:
            theirs = got.split(counts)
            xs = [_combine(x, y, _host(_pair_stats(x, y))) for x, y in zip(xs, theirs)]
    active = me < p
    spans = [(0, c) for c in counts]  # each tensor's segment [lo, hi); xs hold exactly it
    d = 1
    while d < p:
        lower = not me & d
        keeps, gives = [], []
        for lo, hi in spans:
            mid = lo + (hi - lo) // 2
            keeps.append((lo, mid) if lower else (mid, hi))
            gives.append((mid, hi) if lower else (lo, mid))
        out = _cat([x[g0 - lo:g1 - lo] for x, (lo, _), (g0, g1) in zip(xs, spans, gives)]) \
            if active else empty
        got, _ = _ops.alltoall(out, _splits(n, me ^ d if active else None, out.numel()),
                               f"{name}.adasum.{d}.halves", ps)
        groups = p // (2 * d)
        stats = torch.zeros(groups, len(xs), 3, dtype=torch.float64, device=empty.device)
        if active:
            mine = [x[k0 - lo:k1 - lo] for x, (lo, _), (k0, k1) in zip(xs, spans, keeps)]
            theirs = got.split([k1 - k0 for k0, k1 in keeps])
            pairs = [(m, t) if lower else (t, m) for m, t in zip(mine, theirs)]
            group = me // (2 * d)
            if pairs:
                stats[group] = torch.stack([_pair_stats(a, b) for a, b in pairs])
        stats = _host(_ops.allreduce(stats.reshape(-1), f"{name}.adasum.{d}.stats", Sum, 1.0,
                                     1.0, ps).reshape(groups, len(xs), 3))
        if active:
            xs = [_combine(a, b, stats[group][i]) for i, (a, b) in enumerate(pairs)]
            spans = keeps
        d *= 2
    pieces = _ops.allgather(_cat(xs) if active else empty, f"{name}.adasum.gather", ps)
    if p == 2 and len(xs) == 1:
        return [pieces]  # rank 0 holds the first half, rank 1 the second: in place already
    results = [torch.empty(c, dtype=empty.dtype, device=empty.device) for c in counts]
    at = 0
    for rank in range(p):  # rank's segment of every tensor, in tensor order
        for result, count in zip(results, counts):
            lo, hi = _segment(rank, p, count)
            result[lo:hi] = pieces[at:at + hi - lo]
            at += hi - lo
    return results
