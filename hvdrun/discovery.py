"""Host discovery for elastic jobs: which hosts may run workers, and how many each.

A discovery is a callable returning {host: slots}.  HostDiscoveryScript runs
horovodrun's --host-discovery-script, which prints one `host` or `host:slots` line per
available host; FixedHosts serves a list given once (-H).
"""

from __future__ import annotations

import subprocess

from .hosts import checked_host_name

__all__ = ["DiscoveryError", "FixedHosts", "HostDiscoveryScript", "parse_hosts"]


class DiscoveryError(RuntimeError):
    """The script failed or printed something that is not a host list."""


def parse_hosts(text: str, slots_per_host: int | None, separator: str = "\n") -> dict[str, int]:
    """{host: slots} from `host[:slots]` entries; blank entries and # comments are
    skipped.  An entry without slots gets slots_per_host (an error when None)."""
    hosts: dict[str, int] = {}
    for raw in text.split(separator):
        entry = raw.split("#", 1)[0].strip()
        if not entry:
            continue
        host, colon, slots_text = entry.partition(":")
        host = host.strip()
        if not colon:
            if slots_per_host is None:
                raise DiscoveryError(
                    f"host {host!r} has no slot count (print host:slots, or pass --slots-per-host)"
                )
            slots = slots_per_host
        else:
            try:
                slots = int(slots_text)
            except ValueError:
                slots = -1
            if slots < 0:
                raise DiscoveryError(f"bad slot count in {entry!r}")
        if not host:
            raise DiscoveryError(f"no host name in {entry!r}")
        hosts[checked_host_name(host, "host discovery", DiscoveryError)] = slots
    return hosts


class HostDiscoveryScript:
    """Runs the script (through the shell, as horovodrun does) and parses its output."""

    def __init__(self, script: str, slots_per_host: int | None = None, timeout: float = 30.0):
        self.script = script
        self.slots_per_host = slots_per_host
        self.timeout = timeout

    def __call__(self) -> dict[str, int]:
        try:
            proc = subprocess.run(
                self.script,
                shell=True,
                capture_output=True,
                text=True,
                check=False,
                timeout=self.timeout,
                stdin=subprocess.DEVNULL,
            )
        except subprocess.TimeoutExpired:
            raise DiscoveryError(f"{self.script} did not finish within {self.timeout:g}s") from None
        if proc.returncode != 0:
            raise DiscoveryError(
                f"{self.script} exited with code {proc.returncode}: {proc.stderr.strip()[-500:]}"
            )
        return parse_hosts(proc.stdout, self.slots_per_host)


class FixedHosts:
    def __init__(self, hosts: dict[str, int]):
        self.hosts = dict(hosts)

    def __call__(self) -> dict[str, int]:
        return dict(self.hosts)
