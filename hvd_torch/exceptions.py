"""Exceptions with Horovod's names and meaning."""


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
