"""Which hosts a static job runs on, and where each rank goes.

    -H server1:2,server2:2          horovodrun's host list
    --hostfile hosts.txt            one `host slots=N` line per host (# comments)

Ranks fill hosts in the order given, each host's slots before the next host's, so
ranks on one host are contiguous: local_rank counts within a host, cross_rank is
the host's index among the hosts that got ranks.
"""

from __future__ import annotations

import dataclasses
import re
import socket

from .args import UsageError, positive_int

__all__ = [
    "Placement", "checked_host_name", "is_local_host", "parse_host_list", "parse_hostfile",
    "place_ranks",
]  # fmt: skip

# What a host may be called where it reaches ssh's command line: a DNS name or
# label, or an IPv4 address. Nothing that starts with '-' (ssh would take it for
# an option: `-oProxyCommand=...` runs a command), no '@', space, quote or shell
# character. 253 is DNS's longest name.
_HOST_NAME = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.-]{0,252}")


@dataclasses.dataclass(frozen=True)
class Placement:
    rank: int
    size: int
    host: str
    local_rank: int
    local_size: int
    cross_rank: int
    cross_size: int


def parse_host_list(text: str) -> list[tuple[str, int]]:
    """[(host, slots)] from `h1:2,h2:2`; a host without :slots has 1 slot."""
    hosts: list[tuple[str, int]] = []
    for entry in text.split(","):
        entry = entry.strip()
        if not entry:
            continue
        host, colon, slots = entry.rpartition(":") if ":" in entry else (entry, "", "1")
        if not host:
            raise UsageError(f"-H/--hosts: no host name in {entry!r}")
        host = checked_host_name(host, "-H/--hosts", UsageError)
        hosts.append((host, positive_int(f"-H/--hosts slots for {host}", slots)))
    return _merged(hosts, "-H/--hosts")


def parse_hostfile(path: str) -> list[tuple[str, int]]:
    """[(host, slots)] from a horovodrun hostfile: `host slots=N` per line (slots
    defaults to 1), blank lines and # comments skipped."""
    try:
        with open(path, encoding="utf-8") as f:
            lines = f.read().splitlines()
    except OSError as e:
        raise UsageError(f"--hostfile {path}: {e.strerror}") from None
    hosts = []
    for number, raw in enumerate(lines, 1):
        fields = raw.split("#", 1)[0].split()
        if not fields:
            continue
        slots = 1
        for field in fields[1:]:
            key, eq, value = field.partition("=")
            if key != "slots" or not eq:
                raise UsageError(
                    f"--hostfile {path}, line {number}: expected `host slots=N`, "
                    f"got {raw.strip()!r}"
                )
            slots = positive_int(f"--hostfile {path}, line {number}: slots", value)
        hosts.append((checked_host_name(fields[0], f"--hostfile {path}, line {number}",
                                        UsageError), slots))
    if not hosts:
        raise UsageError(f"--hostfile {path} names no host")
    return _merged(hosts, f"--hostfile {path}")


def checked_host_name(host: str, where: str, error: type[Exception] = ValueError) -> str:
    """host, if it is a name ssh can take as a destination and never as an option;
    else error naming where it came from."""
    if not _HOST_NAME.fullmatch(host):
        raise error(
            f"{where}: {host!r} is not a host name (letters, digits, '.', '-' and '_', "
            "not starting with '-'; at most 253 characters)"
        )
    return host


def _merged(hosts: list[tuple[str, int]], where: str) -> list[tuple[str, int]]:
    seen = set()
    for host, _ in hosts:
        if host in seen:
            raise UsageError(f"{where}: host {host!r} is listed twice")
        seen.add(host)
    return hosts


def place_ranks(hosts: list[tuple[str, int]], num_proc: int) -> list[Placement]:
    """num_proc ranks over hosts in order; UsageError when the slots do not suffice.
    Names of this machine (localhost, 127.0.0.1, its hostname) are one host."""
    hosts = _local_names_merged(hosts)
    total = sum(slots for _, slots in hosts)
    if total < num_proc:
        listed = ",".join(f"{h}:{s}" for h, s in hosts)
        raise UsageError(
            f"-np {num_proc} needs {num_proc} slots but the hosts {listed} give {total}")
    counts = []
    left = num_proc
    for host, slots in hosts:
        if left == 0:
            break
        take = min(slots, left)
        counts.append((host, take))
        left -= take
    placements = []
    for cross_rank, (host, count) in enumerate(counts):
        for local_rank in range(count):
            placements.append(
                Placement(
                    rank=len(placements), size=num_proc, host=host, local_rank=local_rank,
                    local_size=count, cross_rank=cross_rank, cross_size=len(counts),
                )  # fmt: skip
            )
    return placements


def _local_names_merged(hosts: list[tuple[str, int]]) -> list[tuple[str, int]]:
    local = sum(slots for host, slots in hosts if is_local_host(host))
    out, placed = [], False
    for host, slots in hosts:
        if not is_local_host(host):
            out.append((host, slots))
        elif not placed:
            out.append(("localhost", local))
            placed = True
    return out


def is_local_host(host: str) -> bool:
    """Whether host means this machine, so its ranks start without ssh."""
    return host in {"localhost", "127.0.0.1", "::1", socket.gethostname(), socket.getfqdn()}
