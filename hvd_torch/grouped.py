"""Grouped collectives with Horovod's names: the members are negotiated and run as one unit.

A group either runs completely or fails completely (one member's mismatch fails
all of them, on every rank). Member i of a group named N is named "N.<i>".
Async forms return one int handle for the group (the members' handles merged
in the engine's handle table, csrc/torch/handle_table.h); synchronize() returns
the list of outputs, poll() is true once every member is done.
"""

import torch

from hvd_torch import adasum
from hvd_torch.basics import Adasum, Average
from hvd_torch.compression import Compression
from hvd_torch import _C
from hvd_torch.error_translation import translate_errors
from hvd_torch.op_call import call as _call
from hvd_torch.ops import _ps, _resolve_op, global_process_set

_ops = torch.ops.hvd_torch

# A grouped op's member handles as the one handle Horovod returns.
_group = _C.group_handles


def _adasum(tensors, average, name, op, prescale_factor, postscale_factor, process_set):
    """The results of a grouped allreduce with op=Adasum (hvd_torch/adasum.py), or
    None for any other op. Each tensor gets its own Adasum; one set of
    collectives serves them all unless one needs a gradient. (`average` never
    means Adasum: with it, _args resolves the op, and warns, once.)"""
    if average is not None or op != Adasum:
        return None
    tensors = list(tensors)
    args = (float(prescale_factor), float(postscale_factor), process_set)
    base = adasum.base_name(name)
    if torch.is_grad_enabled() and any(t.requires_grad for t in tensors):
        return [adasum.allreduce(t, f"{base}.{i}", *args) for i, t in enumerate(tensors)]
    return adasum.reduce_many(tensors, base, *args)


def _adasum_into(tensors, *args):
    """_adasum written into `tensors` (the in-place forms); False for other ops."""
    outs = _adasum(tensors, *args)
    for tensor, out in zip(tensors, outs or []):
        tensor.copy_(out)
    return outs is not None


def _args(average, op, prescale_factor, postscale_factor, process_set):
    return (_resolve_op(average, op), float(prescale_factor), float(postscale_factor),
            _ps(process_set))


@translate_errors
def grouped_allreduce(tensors, average=None, name=None, compression=Compression.none, op=None,
                      prescale_factor=1.0, postscale_factor=1.0, process_set=global_process_set):
    """Allreduces every tensor in `tensors` as one unit; returns the list of results."""
    compressed = [compression.compress(t) for t in tensors]
    inputs = [c for c, _ in compressed]
    outs = _adasum(inputs, average, name, op, prescale_factor, postscale_factor, process_set)
    if outs is None:
        outs = _call(_C.eager_grouped_allreduce, _ops.grouped_allreduce, inputs, name or "",
                     *_args(average, op, prescale_factor, postscale_factor, process_set))
    return [compression.decompress(o, ctx) for o, (_, ctx) in zip(outs, compressed)]


@translate_errors
def grouped_allreduce_(tensors, average=None, name=None, op=None, prescale_factor=1.0,
                       postscale_factor=1.0, process_set=global_process_set):
    """In-place grouped allreduce; returns `tensors`."""
    if _adasum_into(tensors, average, name, op, prescale_factor, postscale_factor, process_set):
        return tensors
    _call(_C.eager_grouped_allreduce_, _ops.grouped_allreduce_, list(tensors), name or "",
          *_args(average, op, prescale_factor, postscale_factor, process_set))
    return tensors


@translate_errors
def grouped_allreduce_async(tensors, average=None, name=None, op=None, prescale_factor=1.0,
                            postscale_factor=1.0, process_set=global_process_set):
    outs = _adasum(tensors, average, name, op, prescale_factor, postscale_factor, process_set)
    if outs is not None:
        return adasum.Handle(outs)
    return _group(_call(_C.eager_grouped_allreduce_async, _ops.grouped_allreduce_async,
                        list(tensors), name or "",
                        *_args(average, op, prescale_factor, postscale_factor, process_set)))


@translate_errors
def grouped_allreduce_async_(tensors, average=None, name=None, op=None, prescale_factor=1.0,
                             postscale_factor=1.0, process_set=global_process_set):
    if _adasum_into(tensors, average, name, op, prescale_factor, postscale_factor, process_set):
        return adasum.Handle(list(tensors))
    return _group(_call(_C.eager_grouped_allreduce_async_, _ops.grouped_allreduce_async_,
                        list(tensors), name or "",
                        *_args(average, op, prescale_factor, postscale_factor, process_set)))


def grouped_allgather(tensors, name=None, process_set=global_process_set):
    """Allgathers every tensor in `tensors` as one unit; returns the list of results."""
    return _call(_C.eager_grouped_allgather, _ops.grouped_allgather, list(tensors), name or "",
                 _ps(process_set))


def grouped_allgather_async(tensors, name=None, process_set=global_process_set):
    return _group(_call(_C.eager_grouped_allgather_async, _ops.grouped_allgather_async,
                        list(tensors), name or "", _ps(process_set)))


def grouped_reducescatter(tensors, name=None, compression=Compression.none, op=Average,
                          process_set=global_process_set, prescale_factor=1.0,
                          postscale_factor=1.0):
    """Reducescatters every tensor in `tensors` as one unit; returns the list of results."""
    compressed = [compression.compress(t) for t in tensors]
    outs = _call(_C.eager_grouped_reducescatter, _ops.grouped_reducescatter,
                 [c for c, _ in compressed], name or "", op, float(prescale_factor),
                 float(postscale_factor), _ps(process_set))
    return [compression.decompress(o, ctx) for o, (_, ctx) in zip(outs, compressed)]


def grouped_reducescatter_async(tensors, name=None, op=Average, process_set=global_process_set,
                                prescale_factor=1.0, postscale_factor=1.0):
    return _group(_call(_C.eager_grouped_reducescatter_async, _ops.grouped_reducescatter_async,
                        list(tensors), name or "", op, float(prescale_factor),
                        float(postscale_factor), _ps(process_set)))
