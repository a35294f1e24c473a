"""Watching a fixed set of ranks until they all succeed or one fails.

Shared by the static launcher (local and ssh ranks) and the per-node launcher.  The
first failure ends the job: every other rank is stopped and the failure is reported
naming the rank and its host.  When several ranks are found failed in the same poll
(a killed rank takes its peers down within milliseconds), the one that was killed,
or else the lowest rank, is named as the cause.
"""

from __future__ import annotations

import signal
import time
from collections.abc import Callable

from .output import note
from .processes import POLL_SECONDS, Processes, exit_code
from .ssh import SSH_FAILED

__all__ = ["RankInfo", "describe_rank_exit", "supervise"]


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


def _looks_killed(info: RankInfo, code: int) -> bool:
    return code < 0 or (info.remote and code > 128)


def supervise(
    procs: Processes,
    ranks: list[RankInfo],
    received: list[int],
    external_failure: Callable[[], str | None] | None = None,
) -> tuple[int, str | None]:
    """(exit code, failure message or None).  procs.procs[i] runs ranks[i].
    external_failure, polled about every 0.5 s, returns why the job must end
    when something outside these ranks failed (another node)."""
    next_external = time.monotonic()
    while True:
        if received:
            signum = received[0]
            note(f"received {signal.Signals(signum).name}, stopping all ranks")
            procs.stop(signum=signum)
            return 128 + signum, None
        codes = [p.poll() for p in procs.procs]
        failed = [(ranks[i], c) for i, c in enumerate(codes) if c not in (None, 0)]
        if failed:
            killed = [(info, c) for info, c in failed if _looks_killed(info, c)]
            info, code = (killed or failed)[0]
            others = sum(1 for c in codes if c is None)
            procs.stop()
            procs.drain()
            message = f"{describe_rank_exit(info, code)}; stopped the {others} rank(s) still running"
            note(message)
            return exit_code(code), message
        if all(c == 0 for c in codes):
            return 0, None
        if external_failure is not None and time.monotonic() >= next_external:
            next_external = time.monotonic() + 0.5
            why = external_failure()
            if why is not None:
                procs.stop()
                procs.drain()
                note(f"{why}; stopped this node's {sum(1 for c in codes if c is None)} rank(s)")
                return 1, why
        time.sleep(POLL_SECONDS)
