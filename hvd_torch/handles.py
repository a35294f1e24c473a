"""What hvd.poll() and hvd.synchronize() take: an engine handle or a Handle.

Every async op the engine runs returns an int handle, as in Horovod: a single
op's, an alltoall's (synchronize returns the output and the received splits)
or a group's (synchronize returns the list of results). The one table behind
them all is C++ (csrc/torch/handle_table.h), which knows each handle's kind;
nothing here tells kinds apart by the value of an int.

Work that completes without one engine handle follows the Handle protocol
instead: a sparse allreduce (two allgathers and a sum, ops.py) and an Adasum
allreduce (done when the call returns, adasum.py).
"""

import torch

from hvd_torch import _C

_ops = torch.ops.hvd_torch
_Kind = _C.HandleKind


class Handle:
    """Async work that poll() and synchronize() accept beside engine handles.

    poll() is True once synchronize() would not wait; synchronize() returns the
    result (or raises the work's error) and may be called once. Calling the
    handle synchronizes it: Horovod's sparse handle is a function.
    """

    __slots__ = ()

    def poll(self) -> bool:
        raise NotImplementedError

    def synchronize(self):
        raise NotImplementedError

    def __call__(self):
        return self.synchronize()


def synchronize_through_ops(handle):
    """An engine handle's result through the torch ops, so that a tracer
    (torch.compile breaks the graph at them) or a dispatch mode sees the call.
    A group's results come from the table directly: no op returns a list for
    a handle."""
    kind = _C.handle_kind(handle)
    if kind == _Kind.alltoall:
        return _ops.synchronize_alltoall(handle)
    if kind == _Kind.group:
        return _C.synchronize_handle(handle)
    return _ops.synchronize(handle)
