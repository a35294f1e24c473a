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

Many tensors share one tree: laid end to end in one flat buffer, they are
halved as that buffer (so a level moves one slice, whatever the count), each
keeps its own dot products (one row of the small allreduce), and the pieces of
small tensors are reduced and combined in one pass each (segment sums), so the
Python work per level does not grow with the number of tensors.

Eager only: the functions below compose ops in Python (torch.compile runs them
outside the graph; TorchScript has no Adasum).
"""

from __future__ import annotations

import bisect
import itertools
import typing

import torch

from hvd_torch import _C, handles
from hvd_torch.basics import Sum
from hvd_torch.error_translation import PeerFailure, horovod_internal_error

_ops = torch.ops.hvd_torch
_FLOATS = (torch.float16, torch.bfloat16, torch.float32, torch.float64)
_unnamed = itertools.count()
_CHUNK = 1 << 16  # elements widened to float64 at a time on the host (_dots, _layout)
_SMALL = 2048  # a tensor's piece shorter than this shares one pass with its neighbours
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


_eager_reduce_many = None


def reduce_many(tensors, name: str, prescale: float, postscale: float,
                process_set) -> list[torch.Tensor]:
    """The Adasum of each tensor; never traced (torch.compile runs it eagerly)."""
    global _eager_reduce_many
    if _eager_reduce_many is None:
        # Disabled on first use, not at import: torch.compiler.disable imports
        # torch._dynamo (3.4 s on the test machine), which every rank process
        # would pay at `import hvd_torch` whether it uses Adasum or not.
        _eager_reduce_many = torch.compiler.disable(_reduce_many)
    return _eager_reduce_many(tensors, name, prescale, postscale, process_set)


def _reduce_many(tensors, name: str, prescale: float, postscale: float,
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
    except PeerFailure as e:  # a peer failed: as every op reports it
        raise horovod_internal_error(e) from None
    results = []
    for tensor, out in zip(tensors, outs):
        if postscale != 1.0:
            out = out * postscale
        elif out.dtype == tensor.dtype and not _own_tensor(out, tensor):
            out = out.clone()
        results.append(out.to(tensor.dtype).reshape(tensor.shape))
    return results


def _own_tensor(out: torch.Tensor, tensor: torch.Tensor) -> bool:
    """Whether `out` may be returned for `tensor` as it is: not the input (one
    rank), nor a view into the batch's shared result (several tensors), which
    would keep the others alive and go with it into a pickle or torch.save."""
    whole = out.untyped_storage().nbytes() == out.numel() * out.element_size()
    return whole and not (out.numel() and out.data_ptr() == tensor.data_ptr())


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


class Handle(handles.Handle):
    """What allreduce_async(op=Adasum) and grouped_allreduce_async(op=Adasum)
    return: the work is done when the call returns (each level waits for the
    partner's half), so poll() is True and synchronize() returns the result
    (a tensor, or a group's list)."""

    def __init__(self, result):
        self.result = result

    def poll(self) -> bool:
        return True

    def synchronize(self):
        return self.result


class _Layout(typing.NamedTuple):
    """How the part [lo, hi) of the flat buffer falls into tensors: the first
    tensor it overlaps, each overlapped tensor's length there (0 for an empty
    tensor in between), and the runs _pair_stats and _combine work in: (start
    piece, stop piece, start element, stop element), a large piece alone or
    consecutive small pieces up to _CHUNK elements."""

    first: int
    lengths: list[int]
    runs: list[tuple[int, int, int, int]]


def _layout(bounds: list[int], lo: int, hi: int) -> _Layout:
    first = bisect.bisect_right(bounds, lo) - 1
    lengths, t = [], first
    while lo < hi and t < len(bounds) - 1 and bounds[t] < hi:
        lengths.append(min(bounds[t + 1], hi) - max(bounds[t], lo))
        t += 1
    runs, at, i = [], 0, 0
    while i < len(lengths):
        j, size = i + 1, lengths[i]
        if size < _SMALL:
            while j < len(lengths) and lengths[j] < _SMALL and size + lengths[j] <= _CHUNK:
                size += lengths[j]
                j += 1
        runs.append((i, j, at, at + size))
        at += size
        i = j
    return _Layout(first, lengths, runs)


def _dots(a: torch.Tensor, b: torch.Tensor, into: torch.Tensor) -> None:
    """Adds [a.b, |a|^2, |b|^2] of one piece, accumulated in float64, to `into`.

    Host tensors are widened a cache-sized chunk at a time: widening a whole
    half of a large gradient allocates (and page-faults) twice its size, 5x
    slower than the arithmetic (2M floats: 23 ms against 4.4 ms)."""
    step = _CHUNK if a.device.type == "cpu" and a.dtype != torch.float64 else max(a.numel(), 1)
    for at in range(0, a.numel(), step):
        x, y = a[at:at + step].double(), b[at:at + step].double()
        into += torch.stack([torch.dot(x, y), torch.dot(x, x), torch.dot(y, y)])


def _segment_dots(a: torch.Tensor, b: torch.Tensor, lengths: list[int]) -> torch.Tensor:
    """The rows _dots adds, of each of consecutive small pieces, in one pass: a
    tensor op per piece would cost more than the piece's arithmetic."""
    x, y = a.double(), b.double()
    products = torch.stack([x * y, x * x, y * y], dim=1)
    return torch.segment_reduce(products, "sum", axis=0, lengths=_counts(lengths, a.device))


def _pair_stats(a: torch.Tensor, b: torch.Tensor, layout: _Layout,
                into: torch.Tensor) -> torch.Tensor:
    """Adds [a.b, |a|^2, |b|^2] of each tensor's piece to its row of `into` (a
    float64 row per tensor), for the part of the flat buffer that a and b hold
    (laid out by `layout`). Returns `into`."""
    first, lengths, runs = layout
    for i, j, s, e in runs:
        if j == i + 1:
            _dots(a[s:e], b[s:e], into[first + i])
        else:
            into[first + i:first + j] += _segment_dots(a[s:e], b[s:e], lengths[i:j])
    return into


def _coefficients(stats: torch.Tensor, as_floats: bool):
    """[[ca, cb]] per row [a.b, |a|^2, |b|^2] of stats: 1 - a.b / (2 |v|^2), or 1
    for a vector whose |v|^2 is below _ZERO_NORMSQ (Horovod's rule).

    Floats for host stats (the dozen tensor ops below would be most of a small
    Adasum's cost); a tensor for device ones, so the host never waits for the GPU."""
    if as_floats:
        return [[1 - dot / (2 * normsq) if normsq >= _ZERO_NORMSQ else 1.0 for normsq in norms]
                for dot, *norms in stats.tolist()]
    dot, normsq = stats[:, :1], stats[:, 1:]
    nonzero = normsq >= _ZERO_NORMSQ
    return torch.where(nonzero, 1 - dot / (2 * torch.where(nonzero, normsq, 1.0)), 1.0)


def _combine(a: torch.Tensor, b: torch.Tensor, stats: torch.Tensor, layout: _Layout,
             as_floats: bool | None = None) -> torch.Tensor:
    """Adasum of a and b (the part of the flat buffer laid out by `layout`),
    each tensor with the coefficients of its row of stats (the whole vectors'
    dot products). as_floats: see _coefficients (default: for host tensors)."""
    first, lengths, runs = layout
    if as_floats is None:
        as_floats = a.device.type == "cpu"
    coefficients = _coefficients(stats[first:first + len(lengths)], as_floats)
    out = torch.empty_like(a)
    for i, j, s, e in runs:
        if j == i + 1:  # one tensor's piece: its two coefficients as scalars
            ca, cb = coefficients[i]
        else:
            run = torch.as_tensor(coefficients[i:j], dtype=a.dtype, device=a.device)
            ca, cb = torch.repeat_interleave(run, _counts(lengths[i:j], a.device), dim=0,
                                             output_size=e - s).T
        torch.mul(a[s:e], ca, out=out[s:e])
        if isinstance(cb, float):
            out[s:e].add_(b[s:e], alpha=cb)
        else:
            out[s:e].addcmul_(b[s:e], cb)
    return out


def _counts(values: list[int], device: torch.device) -> torch.Tensor:
    """values as an int64 tensor on `device`; for a GPU through pinned memory,
    so the copy does not make the host wait for the GPU's queued work."""
    counts = torch.tensor(values)
    if device.type == "cpu":
        return counts
    return counts.pin_memory().to(device, non_blocking=True)


def _cat(xs: list[torch.Tensor]) -> torch.Tensor:
    """torch.cat without the copy of a lone tensor."""
    return xs[0] if len(xs) == 1 else torch.cat(xs)


def _splits(n: int, to: int | None, count: int) -> torch.Tensor:
    """alltoall splits sending `count` elements to rank `to` only."""
    splits = [0] * n
    if to is not None:
        splits[to] = count
    return torch.tensor(splits, dtype=torch.int32)


def _segment(rank: int, p: int, count: int) -> tuple[int, int]:
    """The part [lo, hi) of the flat buffer that `rank` (< p) holds after the halving."""
    lo, hi, d = 0, count, 1
    while d < p:
        mid = lo + (hi - lo) // 2
        lo, hi = (mid, hi) if rank & d else (lo, mid)
        d *= 2
    return lo, hi


def _tree(xs: list[torch.Tensor], name: str, n: int, me: int, ps: int) -> list[torch.Tensor]:
    """Adasum of each 1-D tensor of `xs` (one dtype and device) over the n ranks.

    The tensors are laid end to end in one flat buffer and the halving splits
    that buffer, as Horovod's does its fusion buffer: a rank's half may cut
    through tensors, and each tensor's dot products are summed over the ranks
    that hold its pieces. So every level moves one slice, whatever the count."""
    if n == 1:
        return xs
    counts = [x.numel() for x in xs]
    bounds = list(itertools.accumulate(counts, initial=0))
    flat = _cat(xs)
    empty = flat[:0]
    p = 1 << (n.bit_length() - 1)
    if n > p:  # fold rank p + i into rank i
        to = me - p if me >= p else None
        got, _ = _ops.alltoall(flat if to is not None else empty,
                               _splits(n, to, flat.numel()), f"{name}.adasum.fold", ps)
        if me < n - p:
            layout = _layout(bounds, 0, flat.numel())
            stats = torch.zeros(len(xs), 3, dtype=torch.float64, device=flat.device)
            flat = _combine(flat, got, _pair_stats(flat, got, layout, stats), layout)
    active = me < p
    lo, hi = 0, flat.numel()  # the part of the flat buffer this rank holds; flat is exactly it
    d = 1
    while d < p:
        lower = not me & d
        mid = lo + (hi - lo) // 2
        keep, give = ((lo, mid), (mid, hi)) if lower else ((mid, hi), (lo, mid))
        out = flat[give[0] - lo:give[1] - lo] if active else empty
        got, _ = _ops.alltoall(out, _splits(n, me ^ d if active else None, out.numel()),
                               f"{name}.adasum.{d}.halves", ps)
        groups = p // (2 * d)
        stats = torch.zeros(groups, len(xs), 3, dtype=torch.float64, device=empty.device)
        if active:
            mine = flat[keep[0] - lo:keep[1] - lo]
            a, b = (mine, got) if lower else (got, mine)
            group = me // (2 * d)
            layout = _layout(bounds, *keep)
            _pair_stats(a, b, layout, stats[group])
        stats = _ops.allreduce(stats.reshape(-1), f"{name}.adasum.{d}.stats", Sum, 1.0, 1.0,
                               ps).reshape(groups, len(xs), 3)
        if active:
            flat = _combine(a, b, stats[group], layout)
            lo, hi = keep
        d *= 2
    pieces = _ops.allgather(flat if active else empty, f"{name}.adasum.gather", ps)
    if p > 2:  # the segments arrive in rank order; put each in its place
        result = torch.empty_like(pieces)
        at = 0
        for rank in range(p):
            lo, hi = _segment(rank, p, pieces.numel())
            result[lo:hi] = pieces[at:at + hi - lo]
            at += hi - lo
        pieces = result
    # p == 2: rank 0 holds the first half, rank 1 the second: in place already.
    return [pieces] if len(xs) == 1 else list(pieces.split(counts))
