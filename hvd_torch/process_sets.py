"""Process sets: subsets of ranks that run collectives among themselves.

Horovod's API (horovod.common.process_sets): a ProcessSet holds sorted global
ranks and, once registered, the id the engine gave it; every op takes
`process_set=`.  Registration is a collective over all ranks, made in the same
order everywhere, so ids agree.  Unlike Horovod, sets can always be added and
removed after init() (no HOROVOD_DYNAMIC_PROCESS_SETS switch): the registry
change is negotiated like any op and costs nothing when unused.
"""

from hvd_torch import _C
from hvd_torch.error_translation import translated_errors


class ProcessSet:
    """A set of global ranks. Register it with init(process_sets=[...]) or
    add_process_set() before passing it to an op."""

    process_set_id = None
    ranks = None
    mpi_comm = None

    def __init__(self, ranks_or_comm):
        try:
            ranks = sorted(ranks_or_comm)
        except TypeError:
            raise ValueError("ProcessSet takes a list of ranks (MPI communicators are not "
                             "supported: hvd-torch runs on Gloo)") from None
        if any(not isinstance(r, int) or isinstance(r, bool) for r in ranks):
            raise ValueError(f"ProcessSet ranks must be ints, got {ranks_or_comm!r}")
        self.ranks = ranks

    def size(self):
        """Number of ranks in the set (None before init), on every rank: members
        or not, every rank registered the set, as in Horovod."""
        if not _C.is_initialized():
            return None
        return _C.process_set_size(self._id())

    def rank(self):
        """This process's position in the set (None before init); a ValueError on
        a rank outside the set, as in Horovod."""
        if not _C.is_initialized():
            return None
        return _C.process_set_rank(self._id())

    def included(self):
        """Whether this process is in the set (None before init)."""
        if not _C.is_initialized():
            return None
        return _C.rank() in self.ranks

    def invalidate(self):
        self.process_set_id = None
        self.ranks = None

    def _id(self):
        if self.process_set_id is None:
            raise ValueError(f"{self} is not registered: pass it to hvd.init(process_sets=...) "
                             "or hvd.add_process_set() first")
        return self.process_set_id

    def __str__(self):
        return (f"ProcessSet(process_set_id={self.process_set_id}, ranks={self.ranks}, "
                f"mpi_comm={self.mpi_comm})")

    __repr__ = __str__


global_process_set = ProcessSet([])
global_process_set.process_set_id = 0

# Registered sets by id; more than one object may name the same id.
_registered = {0: [global_process_set]}


def process_set_id(process_set):
    """The id an op sends to the engine."""
    return process_set._id()


def add_process_set(process_set):
    """Registers a set (a ProcessSet or a list of ranks) on every rank and
    returns it. Every rank must call this with the same ranks, in the same order."""
    if not isinstance(process_set, ProcessSet):
        process_set = ProcessSet(process_set)
    if process_set.process_set_id is not None:
        raise ValueError(f"{process_set} is already registered")
    with translated_errors():
        new_id = _C.add_process_set(process_set.ranks)
    process_set.process_set_id = new_id
    _registered.setdefault(new_id, []).append(process_set)
    return process_set


def remove_process_set(process_set):
    """Unregisters a set on every rank (a collective). Returns False for the
    global set, which cannot be removed, True otherwise."""
    set_id = process_set._id()
    if set_id == 0:
        return False
    with translated_errors():
        _C.remove_process_set(set_id)
    for ps in _registered.pop(set_id, [process_set]):
        ps.invalidate()
    return True


def _after_init(process_sets):
    """init(): the global set's ranks, then the user's static sets in order."""
    global_process_set.ranks = list(range(_C.size()))
    if process_sets is None or process_sets == "dynamic":
        return
    for ps in process_sets:
        add_process_set(ps)


def _after_shutdown():
    """A new init() starts a new registry: old ids must not silently alias."""
    for set_id in [i for i in _registered if i != 0]:
        for ps in _registered.pop(set_id):
            ps.process_set_id = None
