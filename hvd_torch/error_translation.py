"""Where the C++ layer's exceptions become the classes Horovod's users catch.

csrc/torch/adapter.cc (throwStatus) raises each kind of failure as its own
C++ type, chosen by the failure's kind (Status::Code), never by its message,
and torch raises that type as a Python class. A caller of hvd_torch's
functions then sees (docs/errors.md):

| kind                          | C++ type              | torch raises | hvd_torch raises     |
|-------------------------------|-----------------------|--------------|----------------------|
| caller's mistake on this rank | c10::ValueError       | ValueError   | ValueError           |
| caller's mistake across ranks | RefusedError          | Refused      | Refused              |
| peer failure or shutdown      | c10::DistNetworkError | PeerFailure  | HorovodInternalError |
| broken invariant (a bug)      | c10::Error            | RuntimeError | RuntimeError         |

Two rows are decided here. Refused (hvd_torch.exceptions.RefusedError) is the
class the C++ RefusedError names, registered with _C when this module is imported,
so that torch.ops.hvd_torch.* raise it too. A peer failure is the one error
translated: the raw ops raise torch's DistNetworkError, and hvd_torch's
functions raise HorovodInternalError, the class Horovod's users and elastic
training catch to restore and retry. Every other error passes through
untouched: the same object, the same traceback.

Horovod's op functions (ops.py, grouped.py, Adasum in adasum.py) and
process-set changes (process_sets.py) translate through this module:
translate_errors (a decorator), translated_errors (a `with` block), or, where
a decorator's frame would cost 0.6 us of a 4 us allreduce (ops.py) or only
part of a function needs it (adasum.py),
`except PeerFailure as e: raise horovod_internal_error(e) from None`.
tests/unit/test_error_translation.py checks the table.
"""

import contextlib
import functools

from torch.distributed import DistNetworkError

from hvd_torch import _C, exceptions
from hvd_torch.exceptions import HorovodInternalError

Refused = exceptions.RefusedError
PeerFailure = DistNetworkError

_C.set_refused_error_type(Refused)


def horovod_internal_error(error):
    """A peer failure (a PeerFailure) as Horovod reports it, with its message.
    Callers raise it `from None`: the torch error under it says nothing more
    and would double the traceback a user reads."""
    return HorovodInternalError(str(error))


def translate_errors(fn):
    """`fn` raising HorovodInternalError for a peer failure."""

    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        try:
            return fn(*args, **kwargs)
        except PeerFailure as e:
            raise horovod_internal_error(e) from None

    return wrapper


@contextlib.contextmanager
def translated_errors():
    """translate_errors for a block: a peer failure inside it leaves as
    HorovodInternalError."""
    try:
        yield
    except PeerFailure as e:
        raise horovod_internal_error(e) from None
