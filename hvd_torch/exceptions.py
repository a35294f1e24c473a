"""Exceptions with Horovod's names and meaning, and the one class hvd-torch adds.

Which failure raises which class (docs/errors.md):

- a caller's mistake seen by the calling rank alone (a bad argument, a name in
  flight, a set this rank is not in): the built-in ValueError, as in Horovod;
- a caller's mistake seen across ranks (ranks that disagree on shapes, dtypes,
  ops, root ranks, ...), or a reduce op a collective does not support
  (reducescatter with Adasum): RefusedError below, which `except ValueError`
  and Horovod users' `except RuntimeError` both catch;
- a dead peer, a lost network, a shutdown under an op: HorovodInternalError,
  the one elastic training restores and retries on.
"""

__all__ = ["HorovodInternalError", "HostsUpdatedInterrupt", "RefusedError"]


class HorovodInternalError(RuntimeError):
    """A peer died, the network failed or the job shut down under an operation.

    The engine is unusable afterwards: elastic training catches this, restores
    the last committed state and re-initialises.
    """


class HostsUpdatedInterrupt(RuntimeError):
    """The set of hosts changed (elastic training); raised at a commit point."""

    def __init__(self, skip_sync=False):
        super().__init__("hosts updated")
        self.skip_sync = skip_sync


class RefusedError(ValueError, RuntimeError):
    """A caller's mistake that Horovod raises as a RuntimeError, refused on
    every rank it concerns: ranks that disagree (shapes, first dimensions,
    dtypes, reduce ops, scale factors, root ranks, alltoall shapes,
    reducescatter dimensions, process sets, one op's name used for another
    op), and a reduce op a collective does not support (reducescatter with
    Adasum, Min, Max or Product).

    It is a ValueError, as hvd-torch has always raised these (a bug in the
    script: fix the call; the job goes on), and a RuntimeError, as Horovod
    raises them (its HorovodInternalError derives from RuntimeError), so code
    written for either catches it. It is not a HorovodInternalError: elastic
    training does not restore and retry a bug in the script forever.

    The C++ layer raises it (csrc/torch/adapter.cc, RefusedError, for
    Status::kRefused), decided by the failure's kind, never by its message;
    hvd_torch/error_translation.py registers it there.
    """


def __getattr__(name):
    """`hvd_torch.exceptions.ValueError`, RefusedError's old name, still
    resolves (also in `from hvd_torch.exceptions import ValueError`) to the
    same class (docs/compat.md). Looked up here rather than bound in the
    module, so that nothing here, nor `from hvd_torch.exceptions import *`,
    hides the built-in ValueError."""
    if name == "ValueError":
        return RefusedError
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
