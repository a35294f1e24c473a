"""Horovod's collective API over the hvd_torch torch ops.

Each function keeps horovod.torch's name, positional argument order and
defaults; the work happens in torch.ops.hvd_torch.* (C++), which also carries
the autograd rules, so the same ops run in eager code and in TorchScript.
"""

import warnings

import torch

from hvd_torch import _C
from hvd_torch import adasum
from hvd_torch.basics import Adasum, Average, Sum
from hvd_torch.compression import Compression
from hvd_torch.error_translation import translate_errors
from hvd_torch.handles import Handle, synchronize_through_ops
from hvd_torch.op_call import call as _call
from hvd_torch.process_sets import global_process_set, process_set_id

_ops = torch.ops.hvd_torch


# Fake kernels, and which ops are eager-only: one contract for every schema.
from hvd_torch import compile_contract  # noqa: E402,F401

def _resolve_op(average, op):
    """Horovod's rule for the deprecated `average` flag."""
    if average is not None:
        if op is not None:
            raise ValueError("allreduce: pass either `average` or `op`, not both")
        warnings.warn("allreduce(average=...) is deprecated; use op=hvd.Average or op=hvd.Sum",
                      DeprecationWarning, stacklevel=3)
        return Average if average else Sum
    return Average if op is None else op


_ps = process_set_id
# Eager blocking allreduces of plain CPU tensors skip the dispatcher's ~2 us
# (csrc/python/eager_fast_path.cpp says when); torch.compile traces the op.
# Each _eager_* entry returns NotImplemented when it does not take the call
# (never a result), and _call (op_call.py) then calls the torch op.
_is_compiling = torch.compiler.is_compiling
_eager_allreduce = _C.eager_allreduce
_eager_allreduce_ = _C.eager_allreduce_
_no_compression = Compression.none
# The async allreduces, synchronize and poll: the calls of every training step.
_eager_allreduce_async = _C.eager_allreduce_async
_eager_allreduce_async_ = _C.eager_allreduce_async_
_eager_synchronize = _C.eager_synchronize
_eager_poll = _C.eager_poll
_eager_broadcast = _C.eager_broadcast
_eager_broadcast_ = _C.eager_broadcast_
_eager_allgather = _C.eager_allgather
_eager_alltoall = _C.eager_alltoall
_eager_reducescatter = _C.eager_reducescatter


def _allreduce_async(tensor, in_place, average, name, op, prescale_factor, postscale_factor,
                     process_set, timeline_label):
    if op is None or average is not None:
        op = _resolve_op(average, op)
    if op == Adasum:
        result = adasum.allreduce(tensor, name, float(prescale_factor), float(postscale_factor),
                                  process_set)
        return adasum.Handle(tensor.copy_(result) if in_place else result)
    eager, torch_op = ((_eager_allreduce_async_, _ops.allreduce_async_) if in_place else
                       (_eager_allreduce_async, _ops.allreduce_async))
    return _call(eager, torch_op, tensor, name or "", op, float(prescale_factor),
                 float(postscale_factor), process_set._id(), timeline_label or "")


# timeline_label (not in Horovod): a label of rank 0's own that its timeline
# shows on the op's row (docs/toolbox.md, "Timeline"); other ranks' go nowhere.
def allreduce_async(tensor, average=None, name=None, op=None, prescale_factor=1.0,
                    postscale_factor=1.0, process_set=global_process_set, timeline_label=None):
    """Starts an allreduce; returns a handle for poll()/synchronize()."""
    return _allreduce_async(tensor, False, average, name, op, prescale_factor, postscale_factor,
                            process_set, timeline_label)


# allreduce and allreduce_ are the hottest calls: they skip _resolve_op when
# `op` is given, and allreduce skips the no-op compressor's two calls.
def allreduce(tensor, average=None, name=None, compression=Compression.none, op=None,
              prescale_factor=1.0, postscale_factor=1.0, process_set=global_process_set,
              timeline_label=None):
    """Reduces `tensor` over all ranks (Average by default) into a new tensor.

    Differentiable: the gradient is the same allreduce of the gradient.
    """
    if op is None or average is not None:
        op = _resolve_op(average, op)
    compressed, ctx = (tensor, None) if compression is _no_compression else \
        compression.compress(tensor)
    if op == Adasum:
        out = adasum.allreduce(compressed, name, float(prescale_factor), float(postscale_factor),
                               process_set)
        return out if compression is _no_compression else compression.decompress(out, ctx)
    out = _call(_eager_allreduce, _ops.allreduce, compressed, name or "", op,
                float(prescale_factor), float(postscale_factor), process_set._id(),
                timeline_label or "")
    return out if compression is _no_compression else compression.decompress(out, ctx)


def allreduce_async_(tensor, average=None, name=None, op=None, prescale_factor=1.0,
                     postscale_factor=1.0, process_set=global_process_set, timeline_label=None):
    """In-place allreduce_async: the result is written into `tensor`."""
    return _allreduce_async(tensor, True, average, name, op, prescale_factor, postscale_factor,
                            process_set, timeline_label)


def allreduce_(tensor, average=None, name=None, op=None, prescale_factor=1.0,
               postscale_factor=1.0, process_set=global_process_set, timeline_label=None):
    """In-place allreduce; returns `tensor`."""
    if op is None or average is not None:
        op = _resolve_op(average, op)
    if op == Adasum:
        return tensor.copy_(adasum.allreduce(tensor, name, float(prescale_factor),
                                             float(postscale_factor), process_set))
    _call(_eager_allreduce_, _ops.allreduce_, tensor, name or "", op, float(prescale_factor),
          float(postscale_factor), process_set._id(), timeline_label or "")
    return tensor


def allgather_async(tensor, name=None, process_set=global_process_set):
    """Starts an allgather; returns a handle for poll()/synchronize()."""
    return _call(_C.eager_allgather_async, _ops.allgather_async, tensor, name or "",
                 _ps(process_set))


def allgather(tensor, name=None, process_set=global_process_set):
    """Concatenates every rank's `tensor` along dimension 0 (first dims may differ)."""
    return _call(_eager_allgather, _ops.allgather, tensor, name or "", process_set._id())


def broadcast_async(tensor, root_rank, name=None, process_set=global_process_set):
    """Starts a broadcast from `root_rank` into a new tensor; returns a handle."""
    return _call(_C.eager_broadcast_async, _ops.broadcast_async, tensor, root_rank, name or "",
                 _ps(process_set))


def broadcast(tensor, root_rank, name=None, process_set=global_process_set):
    """Returns `root_rank`'s `tensor` on every rank."""
    return _call(_eager_broadcast, _ops.broadcast, tensor, root_rank, name or "",
                 process_set._id())


def broadcast_async_(tensor, root_rank, name=None, process_set=global_process_set):
    """In-place broadcast_async."""
    return _call(_C.eager_broadcast_async_, _ops.broadcast_async_, tensor, root_rank,
                 name or "", _ps(process_set))


def broadcast_(tensor, root_rank, name=None, process_set=global_process_set):
    """In-place broadcast; returns `tensor`."""
    _call(_eager_broadcast_, _ops.broadcast_, tensor, root_rank, name or "", process_set._id())
    return tensor


def reducescatter_async(tensor, name=None, op=Average, process_set=global_process_set,
                        prescale_factor=1.0, postscale_factor=1.0):
    """Starts a reducescatter; returns a handle for poll()/synchronize()."""
    return _call(_C.eager_reducescatter_async, _ops.reducescatter_async, tensor, name or "", op,
                 float(prescale_factor), float(postscale_factor), _ps(process_set))


def reducescatter(tensor, name=None, compression=Compression.none, op=Average,
                  process_set=global_process_set, prescale_factor=1.0, postscale_factor=1.0):
    """Reduces `tensor` over all ranks (Average or Sum) and returns this rank's rows.

    The first dimension is split as in Horovod: rows // size rows each, and the
    first rows % size ranks get one more. Differentiable: the gradient is the
    allgather of the gradient (scaled like the forward).
    """
    compressed, ctx = compression.compress(tensor)
    out = _call(_eager_reducescatter, _ops.reducescatter, compressed, name or "", op,
                float(prescale_factor), float(postscale_factor), _ps(process_set))
    return compression.decompress(out, ctx)


def sparse_allreduce_async(tensor, name, op, process_set=global_process_set):
    """Starts Horovod's sparse allreduce of a sparse COO `tensor`: an allgather
    of its indices and one of its values (every rank's entries, concatenated;
    duplicates are summed when the result is coalesced). Returns a handle for
    synchronize(), which returns the sparse result; Average divides the values
    by the set's size, as Horovod does. Ranks may have different numbers of
    entries. Only Average and Sum: Min/Max/Product of scattered entries are not
    defined (Horovod computes a Sum for them silently).
    """
    if not tensor.is_sparse:
        raise ValueError(f"sparse_allreduce_async '{name}': the tensor is not sparse "
                         f"(layout {tensor.layout}); use allreduce_async")
    if op not in (Average, Sum):
        raise ValueError(f"sparse_allreduce_async '{name}': op {op} is not supported "
                         "(Average=0 or Sum=1)")
    # Allgather concatenates along dimension 0: indices go as (nnz, ndim) rows.
    indices = allgather_async(tensor._indices().transpose(0, 1).contiguous(),
                              name=f"{name}.indices" if name else None, process_set=process_set)
    values = allgather_async(tensor._values().contiguous(),
                             name=f"{name}.values" if name else None, process_set=process_set)
    return _SparseHandle(indices, values, tensor.size(), op, process_set)


class _SparseHandle(Handle):
    """What sparse_allreduce_async returns: the indices' and the values'
    allgathers, summed when the result is coalesced."""

    def __init__(self, indices, values, size, op, process_set):
        self._handles = (indices, values)
        self._size, self._op, self._process_set = size, op, process_set

    def poll(self):
        return all(poll(h) for h in self._handles)

    def synchronize(self):
        values = synchronize(self._handles[1])  # values first, as Horovod does
        indices = synchronize(self._handles[0])
        if self._op == Average:
            values = values / self._process_set.size()
        return torch.sparse_coo_tensor(indices.transpose(0, 1), values, self._size)


def _splits(splits):
    """Horovod also takes splits as a list of ints."""
    if splits is None or isinstance(splits, torch.Tensor):
        return splits
    return torch.tensor(list(splits), dtype=torch.int32)


def alltoall_async(tensor, splits=None, name=None, process_set=global_process_set):
    """Starts an alltoall; synchronize(handle) returns (output, received_splits)."""
    return _call(_C.eager_alltoall_async, _ops.alltoall_async, tensor, _splits(splits),
                 name or "", _ps(process_set))


def alltoall(tensor, splits=None, name=None, process_set=global_process_set):
    """Sends splits[r] rows of `tensor` (in order) to rank r and concatenates what arrives.

    Without `splits` the first dimension is split evenly. Returns the received
    tensor, and with `splits` also the rows received from each rank (int32),
    as Horovod does. Differentiable: the gradient is sent back the same way.
    """
    out = _call(_eager_alltoall, _ops.alltoall, tensor, _splits(splits), name or "",
                _ps(process_set))
    # The torch op gives (output, received_splits); the eager entry, without
    # splits, the output alone.
    return out[0] if splits is None and isinstance(out, tuple) else out


def barrier(process_set=global_process_set):
    """Returns once every rank has called barrier()."""
    _call(None, _ops.barrier, _ps(process_set))


@translate_errors
def join(device=-1):
    """This rank has no more data; returns the last rank to join once all have.

    Until every rank has joined, this rank takes part in the others' ops, so
    uneven numbers of batches per rank finish instead of hanging: allreduce and
    reducescatter with zeros, allgather with no rows, broadcast from a root
    that has not joined (Horovod's rules). Average divides by every rank, as
    Horovod's does; HVD_TORCH_JOIN_AVERAGE=contributors divides by the ranks
    that submitted (docs/compat.md). Alltoall, and a broadcast from a joined
    root, fail on every rank while ranks are joined.
    """
    return int(_ops.join(device))


@translate_errors
def poll(handle):
    """True once the async operation behind `handle` has finished."""
    if type(handle) is int and not _is_compiling():  # an engine handle, of any kind
        return _eager_poll(handle)
    if isinstance(handle, Handle):
        return handle.poll()
    return _ops.poll(handle)


def synchronize(handle):
    """Waits for `handle` and returns the operation's output (raises its error):
    a tensor, an alltoall's (output, received_splits), a group's list."""
    if type(handle) is int:  # an engine handle, of any kind (csrc/torch/handle_table.h)
        return _call(_eager_synchronize, synchronize_through_ops, handle)
    return _synchronize_other(handle)


@translate_errors
def _synchronize_other(handle):
    if isinstance(handle, Handle):
        return handle.synchronize()
    return synchronize_through_ops(handle)
