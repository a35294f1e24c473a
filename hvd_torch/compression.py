"""Gradient compression for allreduce, with Horovod's interface.

A compressor is a class with two static methods:

    compress(tensor) -> (compressed tensor, ctx)
    decompress(tensor, ctx) -> tensor

`allreduce(..., compression=c)` (and the DistributedOptimizer) reduces
`c.compress(x)[0]` and hands the result to `c.decompress(result, ctx)`. As in
Horovod, `ctx` of the cast compressors is the input's dtype, so a custom
compressor written for horovod.torch works unchanged.

The cast compressors (fp16, bf16) halve the bytes on the wire for float32 and
float64 tensors. They convert only floating-point tensors *wider* than the
target: integers and bool pass through untouched (a cast would corrupt them),
and so do tensors already 16 bits wide (float16 <-> bfloat16 would lose
precision for no saving). Horovod's FP16Compressor casts every floating-point
tensor, bfloat16 included; that difference is deliberate.

Cost: the conversion runs on the caller's thread before and after the
collective (one read and one write of the tensor each way); bench/
compression_bench.py measures its throughput.
"""

import torch


class Compressor:
    """Interface for compressing and decompressing a given tensor."""

    @staticmethod
    def compress(tensor):
        """Returns (compressed tensor, ctx); ctx is whatever decompress needs."""
        raise NotImplementedError

    @staticmethod
    def decompress(tensor, ctx):
        """Returns `tensor` restored with the ctx that compress returned."""
        raise NotImplementedError


class NoneCompressor(Compressor):
    """No compression (the default)."""

    @staticmethod
    def compress(tensor):
        return tensor, None

    @staticmethod
    def decompress(tensor, ctx):
        return tensor


class _CastCompressor(Compressor):
    """Casts floating-point tensors wider than `dtype` to `dtype` and back."""

    dtype = None

    @classmethod
    def compress(cls, tensor):
        if tensor.dtype.is_floating_point and tensor.dtype.itemsize > cls.dtype.itemsize:
            return tensor.to(cls.dtype), tensor.dtype
        return tensor, tensor.dtype

    @staticmethod
    def decompress(tensor, ctx):
        # ctx None: a tensor from an older hvd-torch compress(), never cast.
        if ctx is None or tensor.dtype == ctx:
            return tensor
        return tensor.to(ctx)


class FP16Compressor(_CastCompressor):
    """float32/float64 travel as float16 (5 exponent bits: values above 65504
    overflow to inf; gradients scaled by a loss scaler are the usual fit)."""

    dtype = torch.float16


class BF16Compressor(_CastCompressor):
    """float32/float64 travel as bfloat16 (float32's range, 8 significant bits)."""

    dtype = torch.bfloat16


class Compression:
    """The built-in compressors: `hvd.Compression.none`, `.fp16`, `.bf16`."""

    none = NoneCompressor
    fp16 = FP16Compressor
    bf16 = BF16Compressor
