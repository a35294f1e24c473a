"""The timeline at run time: Horovod's hvd.start_timeline / hvd.stop_timeline.

Call them on every rank, as in Horovod; only rank 0 records (it coordinates,
so it sees every rank's arrival) and writes the file. HOROVOD_TIMELINE=path
starts one at init() instead. Format and phases: docs/toolbox.md, "Timeline".
"""

import os

from hvd_torch import _C
from hvd_torch.basics import require_init


def start_timeline(file_path, mark_cycles=False):
    """Starts writing a Chrome-trace timeline to file_path (rank 0 writes it).

    A running timeline is closed first. mark_cycles adds a CYCLE_START instant
    for each batch of responses the engine dispatches (it has no timed cycles).
    """
    require_init("hvd_torch.start_timeline()")
    _C.start_timeline(os.fspath(file_path), bool(mark_cycles))


def stop_timeline():
    """Writes what is pending and closes the timeline file as complete JSON."""
    require_init("hvd_torch.stop_timeline()")
    _C.stop_timeline()
