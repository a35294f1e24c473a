"""hvd.elastic.run: the retry loop around an elastic training function.

    @hvd.elastic.run
    def train(state, ...):
        for state.epoch in range(state.epoch, epochs):
            ...
            state.commit()

    train(state)

Each attempt first syncs the state from rank 0, then calls train.  When it raises:
  - HorovodInternalError (a peer died, the network failed): restore the last commit;
  - HostsUpdatedInterrupt (raised by commit() / check_host_updates()): keep the state,
    it is at a commit;
then reset (shut the engine down, join the driver's next round, initialise with the
new rank and size), run the reset callbacks, and try again.  Horovod's order.

(This file is not named run.py: hvd_torch.elastic.run is the decorator, and a
submodule of the same name would shadow it, or be shadowed, depending on imports.)
"""

from __future__ import annotations

import functools
import sys
import time

from hvd_torch import basics
from hvd_torch.exceptions import HorovodInternalError, HostsUpdatedInterrupt

from . import worker_rendezvous

__all__ = ["run"]


def run(func):
    """Decorator: makes func(state, *args, **kwargs) survive resets (see module doc)."""

    @functools.wraps(func)
    def wrapper(state, *args, **kwargs):
        skip_sync = False
        while True:
            try:
                if not skip_sync:
                    state.sync()
                return func(state, *args, **kwargs)
            except HorovodInternalError as e:
                if not worker_rendezvous.enabled():
                    raise HorovodInternalError(
                        f"{e} (not an elastic job, so there is no one to re-rendezvous "
                        "with: start it with hvdrun --min-np/--max-np/"
                        "--host-discovery-script to survive failures)"
                    ) from e
                failed_at = time.monotonic()
                state.restore()
                skip_sync = False
                _reset(failed=True)
            except HostsUpdatedInterrupt as e:
                failed_at = time.monotonic()
                skip_sync = e.skip_sync
                _reset(failed=False)
            state.on_reset()
            sys.stderr.write(
                f"hvd_torch.elastic: rank {basics.rank()} of {basics.size()} after reset "
                f"(round {worker_rendezvous.current_round()}, "
                f"{time.monotonic() - failed_at:.2f}s)\n"
            )

    return wrapper


def _reset(failed: bool) -> None:
    """Shuts the engine down and initialises it in the driver's next round.

    An engine rendezvous can still fail after the driver assigned the round (a member
    died between its assignment and its init): that round is reported failed and the
    next one joined.  join_round() bounds the whole loop: it raises RendezvousError
    once the driver stops answering or ends the job.
    """
    while True:
        if failed:
            worker_rendezvous.request_reset()
        basics.shutdown()
        try:
            basics.init()  # joins the next round first (basics.init -> join_round)
            return
        except worker_rendezvous.RendezvousError:
            raise
        except RuntimeError as e:  # HorovodInternalError is one
            sys.stderr.write(
                f"hvd_torch.elastic: round {worker_rendezvous.current_round()} "
                f"failed to start ({e}); joining the next one\n"
            )
            failed = True
