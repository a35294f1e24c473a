"""How every collective wrapper calls its op (hvd_torch/ops.py, grouped.py).

    call(eager, op, *args)

runs the op's eager entry (`_C.eager_*`, csrc/python/eager_fast_path.cpp: the
dispatcher's ~2 us skipped for a plain CPU tensor), or, when the entry returns
NotImplemented (it does not take the call) or there is none, the torch op
`torch.ops.hvd_torch.*` with the same arguments. Under torch.compile it calls the
torch op, which Dynamo traces. A lost peer (PeerFailure) leaves as Horovod's
HorovodInternalError. Every argument after the tensor is the schema's, in its
order: an option added to a schema is one more argument here, nothing else.
"""

import torch

from hvd_torch.error_translation import PeerFailure, horovod_internal_error

_is_compiling = torch.compiler.is_compiling


def call(eager, op, *args):
    try:
        if eager is not None and not _is_compiling():
            out = eager(*args)
            if out is not NotImplemented:
                return out
        return op(*args)
    except PeerFailure as e:
        raise horovod_internal_error(e) from None
