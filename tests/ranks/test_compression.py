"""hvd.Compression: the compressors in one process, and allreduce(compression=...)
on 2 real rank processes.

The cast compressors convert only floating-point tensors wider than their
16-bit format; ctx is the input's dtype (Horovod's convention). A compressed
allreduce must return the input's dtype and agree with the exact float64
result within the 16-bit format's rounding: each rank's input is rounded once
(u = 2^-11 for float16, 2^-8 for bfloat16), the sum is formed in float32 and
rounded once more, so |out - exact| <= 2u * sum_r |x_r| (divided by n for
Average).
"""

import pytest
import torch

from dist_harness import run_ranks

import hvd_torch as hvd

TIMEOUT = 90
NRANKS = 2
FORMATS = {"fp16": (hvd.Compression.fp16, torch.float16, 2.0**-11),
           "bf16": (hvd.Compression.bf16, torch.bfloat16, 2.0**-8)}
WIDE = [torch.float32, torch.float64]
NARROW = [torch.float16, torch.bfloat16]
INTS = [torch.uint8, torch.int8, torch.int16, torch.int32, torch.int64, torch.bool]


def _input(rank, dtype, n, seed):
    g = torch.Generator().manual_seed(seed * 7919 + rank)
    if dtype == torch.bool:
        return torch.randint(0, 2, (n,), generator=g).bool()
    if dtype.is_floating_point:
        return (torch.randn(n, generator=g, dtype=torch.float64) * 10).to(dtype)
    return torch.randint(0, 50, (n,), generator=g).to(dtype)


# ---------------------------------------------------------------- one process


@pytest.mark.parametrize("fmt", FORMATS)
@pytest.mark.parametrize("dtype", WIDE)
@pytest.mark.unit
def test_round_trip_of_wide_floats(fmt, dtype):
    comp, low, u = FORMATS[fmt]
    x = _input(0, dtype, 1000, 1).reshape(10, 100)
    compressed, ctx = comp.compress(x)
    assert compressed.dtype == low and compressed.shape == x.shape
    assert ctx == dtype  # Horovod's ctx: the original dtype
    back = comp.decompress(compressed, ctx)
    assert back.dtype == dtype and back.shape == x.shape
    assert torch.equal(back, x.to(low).to(dtype))  # exactly one rounding, no more
    assert ((back - x).abs() <= u * x.abs()).all()


@pytest.mark.parametrize("fmt", FORMATS)
@pytest.mark.parametrize("dtype", NARROW + INTS)
@pytest.mark.unit
def test_narrow_floats_and_integers_pass_through(fmt, dtype):
    comp, _, _ = FORMATS[fmt]
    x = _input(0, dtype, 50, 2)
    compressed, ctx = comp.compress(x)
    assert compressed is x, f"{fmt} must not convert {dtype}"
    assert ctx == dtype
    assert comp.decompress(compressed, ctx) is x


@pytest.mark.unit
def test_float64_keeps_its_dtype_through_fp16():
    x = torch.tensor([1.0 / 3.0, 1e-3, -2.5, 60000.0], dtype=torch.float64)
    compressed, ctx = hvd.Compression.fp16.compress(x)
    assert compressed.dtype == torch.float16
    back = hvd.Compression.fp16.decompress(compressed, ctx)
    assert back.dtype == torch.float64
    torch.testing.assert_close(back, x, rtol=2.0**-11, atol=0)


@pytest.mark.unit
def test_none_and_the_interface():
    x = torch.randn(5)
    compressed, ctx = hvd.Compression.none.compress(x)
    assert compressed is x and ctx is None
    assert hvd.Compression.none.decompress(x, ctx) is x
    for comp in (hvd.Compression.none, hvd.Compression.fp16, hvd.Compression.bf16):
        assert issubclass(comp, hvd.compression.Compressor)
    # A ctx of None (nothing was cast) leaves the tensor alone.
    assert hvd.Compression.fp16.decompress(x, None) is x
    with pytest.raises(NotImplementedError):
        hvd.compression.Compressor.compress(x)


@pytest.mark.unit
def test_gradient_flows_through_the_casts():
    x = torch.randn(4, requires_grad=True)
    compressed, ctx = hvd.Compression.bf16.compress(x)
    hvd.Compression.bf16.decompress(compressed * 3, ctx).sum().backward()
    assert x.grad.dtype == torch.float32
    assert torch.equal(x.grad, torch.full((4,), 3.0))


# ---------------------------------------------------------------- 2 ranks


class _Negate(hvd.compression.Compressor):
    """A Horovod-style user compressor: negate on the way in and out."""

    @staticmethod
    def compress(tensor):
        return -tensor, "negated"

    @staticmethod
    def decompress(tensor, ctx):
        assert ctx == "negated"
        return -tensor


def _cases():
    """(case, format, dtype, op, numel): small ones go inline through the
    coordinator, 20000 elements through Gloo (16 KiB inline budget)."""
    cases = []
    for fmt in FORMATS:
        for dtype in WIDE + NARROW + [torch.int32]:
            for op in ("Sum", "Average"):
                for n in (37, 20_000):
                    cases.append((len(cases), fmt, dtype, op, n))
    return cases


def _rank_main():
    import hvd_torch as hvd

    torch.set_num_threads(1)
    hvd.init()
    rank = hvd.rank()
    out = {"cases": []}
    for case, fmt, dtype, op, n in _cases():
        comp = FORMATS[fmt][0]
        x = _input(rank, dtype, n, case)
        before = x.clone()
        y = hvd.allreduce(x, name=f"c.{case}", compression=comp, op=getattr(hvd, op))
        assert torch.equal(x, before), f"case {case}: allreduce changed its input"
        out["cases"].append(y)

    # Differentiable through the compression: d(sum(avg(x)))/dx = 1 per element.
    x = _input(rank, torch.float32, 10, 900).requires_grad_()
    hvd.allreduce(x, name="grad", compression=hvd.Compression.fp16).sum().backward()
    out["grad"] = x.grad
    out["custom"] = hvd.allreduce(torch.full((3,), float(rank + 1)), name="custom",
                                  compression=_Negate, op=hvd.Sum)
    hvd.shutdown()
    return out


_RESULTS = []


def _launch():
    if not _RESULTS:
        _RESULTS.append(run_ranks(_rank_main, NRANKS, timeout=TIMEOUT,
                                  env={"HVD_TORCH_INLINE_THRESHOLD": "16384"}))
    return _RESULTS[0]


def test_compressed_allreduce_within_16_bit_tolerance():
    results = _launch()
    for case, fmt, dtype, op, n in _cases():
        _, low, u = FORMATS[fmt]
        inputs = [_input(r, dtype, n, case) for r in range(NRANKS)]
        what = f"case {case}: {fmt} {dtype} {op} numel={n}"
        if dtype.is_floating_point:
            exact = torch.stack([x.double() for x in inputs]).sum(0)
            bound = torch.stack([x.double().abs() for x in inputs]).sum(0)
        else:
            exact = torch.stack([x.long() for x in inputs]).sum(0)
        if op == "Average":
            exact = exact / NRANKS if dtype.is_floating_point else exact // NRANKS
        for rank, res in enumerate(results):
            y = res["cases"][case]
            assert y.dtype == dtype and y.shape == (n,), what
            if not dtype.is_floating_point:
                assert torch.equal(y, exact.to(dtype)), f"{what}: integers must be exact"
                continue
            scale = 1.0 if op == "Sum" else 1.0 / NRANKS
            # A narrow input is not converted: it reduces in its own format (one rounding).
            unit = max(u, torch.finfo(dtype).eps / 2) if dtype in NARROW else u
            err = (y.double() - exact).abs()
            assert (err <= 2 * unit * bound * scale).all(), (
                f"rank {rank}, {what}: max error {err.max().item():.3g}")
            if dtype in WIDE:
                # It did travel in 16 bits: the result is a 16-bit value.
                assert torch.equal(y, y.to(low).to(dtype)), f"{what}: not compressed"
            if rank:
                assert torch.equal(y, results[0]["cases"][case]), f"{what}: ranks disagree"


def test_gradient_and_custom_compressor_on_two_ranks():
    for rank, res in enumerate(_launch()):
        assert torch.equal(res["grad"], torch.ones(10)), f"rank {rank}: {res['grad']}"
        # -(-1 + -2) = 3
        assert torch.equal(res["custom"], torch.full((3,), 3.0)), f"rank {rank}"
