"""Scaling arithmetic bit for bit as Horovod's CPU path does it, on 2 and 3
ranks, for allreduce, reducescatter and their grouped forms, through both the
coordinator's inline path (small tensors) and the Gloo path (large ones):

- prescale multiplies each rank's input before the reduction, postscale the
  result after it; Average is folded into the postscale factor as
  postscale / size (one multiplication, in double);
- float64 multiplies in double; float32 multiplies by float32(factor) in
  float32; float16 (and bfloat16) widen to float32, multiply by
  float32(factor) and round once;
- integers multiply in double and convert back truncating toward zero, so an
  integer Average is trunc(sum * (1.0 / size)), not floor division.

Inputs are small integers and the reference adds the (scaled) inputs in rank
order in the tensor's precision, as the coordinator's inline path does; the
large (Gloo) cases have no prescale, so their sums are exact whatever Gloo's
order. Any difference is then the scaling's, and the comparison is
torch.equal, not a tolerance. (Horovod's own summation order over MPI or Gloo
is not specified; only its scaling is reproduced bit for bit.)
"""

import pytest
import torch

from dist_harness import launch_once

AVERAGE, SUM = 0, 1
DTYPES = [torch.uint8, torch.int8, torch.int32, torch.int64, torch.float16, torch.bfloat16,
          torch.float32, torch.float64]
# (prescale, postscale): factors that are inexact in binary, so the precision
# and the order of the multiplications show in the last bit.
SCALES = [(1.0, 1.0), (1.0 / 3, 1.0), (1.0, 0.1), (0.7, 1.0 / 3)]
SMALL, LARGE = 12, 300_000  # LARGE: past the inline threshold on 2 and 3 ranks


def _input(rank, dtype, n):
    g = torch.Generator().manual_seed(1000 + rank)
    lo = 0 if dtype == torch.uint8 else -9
    return torch.randint(lo, 10, (n,), generator=g).to(dtype)


def _horovod_scale(x, factor):
    if factor == 1.0:
        return x
    if x.dtype == torch.float64:
        return x * factor
    if x.dtype.is_floating_point:
        return (x.float() * torch.tensor(factor, dtype=torch.float32)).to(x.dtype)
    return (x.double() * factor).trunc().to(x.dtype)


def _reference(size, dtype, n, op, pre, post):
    scaled = [_horovod_scale(_input(r, dtype, n), pre) for r in range(size)]
    if dtype.is_floating_point:
        total = scaled[0]
        for x in scaled[1:]:  # in rank order, rounded after each add (16-bit: via float32)
            total = (total.float() + x.float()).to(dtype) if dtype.itemsize == 2 else total + x
    else:  # integers wrap in their dtype
        total = sum(x.to(torch.int64) for x in scaled).to(dtype)
    return _horovod_scale(total, post / size if op == AVERAGE else post)


def _slice(rows, size, rank):
    base, extra = divmod(rows, size)
    return rank * base + min(rank, extra), base + (1 if rank < extra else 0)


def _cases():
    cases = []
    for dtype in DTYPES:
        for op in (AVERAGE, SUM):
            for pre, post in SCALES:
                cases.append((dtype, op, pre, post, SMALL))
    for dtype in (torch.int32, torch.float32, torch.float16):
        cases.append((dtype, AVERAGE, 1.0, 0.1, LARGE))
        cases.append((dtype, SUM, 1.0, 1.0 / 3, LARGE))
    return cases


def _rank_main():
    import hvd_torch as hvd

    torch.set_num_threads(1)
    hvd.init()
    r = hvd.rank()
    out = {}
    for i, (dtype, op, pre, post, n) in enumerate(_cases()):
        x = _input(r, dtype, n)
        kw = {"op": op, "prescale_factor": pre, "postscale_factor": post}
        out[("allreduce", i)] = hvd.allreduce(x, name=f"ar.{i}", **kw)
        out[("reducescatter", i)] = hvd.reducescatter(x, name=f"rs.{i}", **kw)
        if n == SMALL:
            out[("grouped_allreduce", i)] = hvd.grouped_allreduce([x, x[:5]], name=f"gar.{i}",
                                                                  **kw)
            out[("grouped_reducescatter", i)] = hvd.grouped_reducescatter(
                [x, x[:5]], name=f"grs.{i}", **kw)
    hvd.shutdown()
    return out


def _launch(nranks):
    return launch_once(_rank_main, nranks, timeout=240)


@pytest.mark.parametrize("nranks", [2, 3])
def test_scaling_is_bit_identical_to_horovods_rules(nranks):
    results = _launch(nranks)
    for i, (dtype, op, pre, post, n) in enumerate(_cases()):
        want = _reference(nranks, dtype, n, op, pre, post)
        want5 = _reference(nranks, dtype, 5, op, pre, post) if n == SMALL else None
        for rank, out in enumerate(results):
            what = (f"rank {rank} of {nranks}, {dtype}, op {op}, pre {pre:.4g}, "
                    f"post {post:.4g}, n {n}")
            got = out[("allreduce", i)]
            assert got.dtype == dtype and torch.equal(got, want), (what, got, want)
            start, rows = _slice(n, nranks, rank)
            got = out[("reducescatter", i)]
            assert torch.equal(got, want[start:start + rows]), (what, "reducescatter", got)
            if n == SMALL:
                g0, g1 = out[("grouped_allreduce", i)]
                assert torch.equal(g0, want) and torch.equal(g1, want5), (what, "grouped", g0, g1)
                s0, s1 = out[("grouped_reducescatter", i)]
                start5, rows5 = _slice(5, nranks, rank)
                assert torch.equal(s0, want[start:start + rows]), (what, "grouped rs", s0)
                assert torch.equal(s1, want5[start5:start5 + rows5]), (what, "grouped rs", s1)


@pytest.mark.unit
def test_the_reference_tells_the_rules_apart():
    """The reference is not the naive arithmetic: float32 by float32(1/3)
    differs from rounding the double product, and integer Average truncates."""
    x = torch.arange(1, 200, dtype=torch.float32)
    naive = (x.double() * (1.0 / 3)).float()
    assert not torch.equal(_horovod_scale(x, 1.0 / 3), naive)
    assert torch.equal(_horovod_scale(torch.tensor([-7, 7]), 0.5), torch.tensor([-3, 3]))
    assert torch.equal(_horovod_scale(torch.tensor([49]), 1.0 / 49), torch.tensor([0]))
