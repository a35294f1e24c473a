"""Watching a fixed set of ranks until they all succeed or one fails.

Shared by the static launcher (local and ssh ranks) and the per-node launcher.  The
first failure ends the job: every other rank is stopped and the failure is reported
naming the rank and its host.  A killed rank takes its peers down within
milliseconds, so the first exit noticed is not always the cause: the report names
the ranks that failed within half a second of the first, the likeliest cause first
(_cause_order; its exit code becomes hvdrun's).
"""

from __future__ import annotations

import signal
import time
from collections.abc import Callable

from .output import note
from .processes import POLL_SECONDS, Processes, exit_code
from .ssh import SSH_FAILED

__all__ = ["RankInfo", "describe_rank_exit", "supervise"]

_SETTLE_SECONDS = 0.5


class RankInfo:
    """host: named in messages (None in a job on this machine only); remote: started
    over ssh, so exit codes 255 and 128 + N mean what ssh and the shell make them."""

    def __init__(self, rank: int, host: str | None, remote: bool):
        self.rank, self.host, self.remote = rank, host, remote


def describe_rank_exit(info: RankInfo, code: int) -> str:
    who = f"rank {info.rank}" if info.host is None else f"rank {info.rank} on host {info.host}"
    if code < 0:
        try:
            return f"{who} was killed by signal {-code} ({signal.Signals(-code).name})"
        except ValueError:
            return f"{who} was killed by signal {-code}"
    if info.remote and code == SSH_FAILED:
        return f"{who}: ssh failed or lost the connection to {info.host} (exit code 255)"
    if info.remote and code > 128 and _signal_name(code - 128):
        # The remote shell reports a rank killed by signal N as 128 + N.
        return f"{who} was killed by signal {code - 128} ({_signal_name(code - 128)})"
    return f"{who} exited with code {code}"


def _signal_name(signum: int) -> str | None:
    try:
        return signal.Signals(signum).name
    except ValueError:
        return None


def _settle(procs: Processes, ranks: list[RankInfo], failed):
    """The failures seen so far plus those within the next moment, in the order seen.
    A rank's death takes its peers down within milliseconds; waiting a moment lets
    the message list them all, so the cause is among the named even when a peer's
    exit was noticed first."""
    seen = {id(info) for info, _ in failed}
    deadline = time.monotonic() + _SETTLE_SECONDS
    while time.monotonic() < deadline:
        running = False
        for info, proc in zip(ranks, procs.procs):
            code = proc.poll()
            if code is None:
                running = True
            elif code != 0 and id(info) not in seen:
                seen.add(id(info))
                failed.append((info, code))
        if not running:
            break
        time.sleep(POLL_SECONDS)
    return failed


def _cause_order(info: RankInfo, code: int) -> int:
    """Which failure most likely started it (lowest first; ties keep the order seen):
    a rank killed by a signal, then a rank exiting with its own code, then code 1,
    what a rank that lost its peer ends with (an uncaught HorovodInternalError)."""
    if code < 0 or (info.remote and code > 128):
        return 0
    return 1 if code != 1 else 2


def _stop_for(procs: Processes, ranks: list[RankInfo], failed):
    """Stops the ranks still running after `failed` (rank, exit code) pairs; the return
    value of supervise, naming the likeliest cause first."""
    info, code = min(failed, key=lambda f: _cause_order(*f))
    others = sum(1 for p in procs.procs if p.poll() is None)
    procs.stop()
    procs.drain()
    message = describe_rank_exit(info, code)
    also = [describe_rank_exit(i, c) for i, c in failed if i is not info]
    if also:
        message += "; then " + "; ".join(also)
    message += f"; stopped the {others} rank(s) still running"
    note(message)
    return exit_code(code), message, _cause_order(info, code)


def supervise(
    procs: Processes,
    ranks: list[RankInfo],
    received: list[int],
    external_failure: Callable[[], str | None] | None = None,
) -> tuple[int, str | None, int | None]:
    """(exit code, failure message or None, how likely the failure is the cause, 0
    most: see _cause_order; None when no rank here failed).  procs.procs[i] runs ranks[i].
    external_failure, polled about every 0.5 s, returns why the job must end
    when something outside these ranks failed (another node)."""
    next_external = time.monotonic()
    while True:
        if received:
            signum = received[0]
            note(f"received {signal.Signals(signum).name}, stopping all ranks")
            procs.stop(signum=signum)
            return 128 + signum, None, None
        codes = [p.poll() for p in procs.procs]
        failed = [(ranks[i], c) for i, c in enumerate(codes) if c not in (None, 0)]
        if failed:
            return _stop_for(procs, ranks, _settle(procs, ranks, failed))
        if all(c == 0 for c in codes):
            return 0, None, None
        if external_failure is not None and time.monotonic() >= next_external:
            next_external = time.monotonic() + 0.5
            why = external_failure()
            if why is not None:
                # The cause may be a rank here that is still exiting (its interpreter
                # tearing down) while its peers elsewhere already failed: a moment
                # lets it be named as this node's failure, and so as the job's cause.
                failed = _settle(procs, ranks, [])
                if failed:
                    return _stop_for(procs, ranks, failed)
                procs.stop()
                procs.drain()
                note(f"{why}; stopped this node's {sum(1 for c in codes if c is None)} rank(s)")
                return 1, why, None
        time.sleep(POLL_SECONDS)
