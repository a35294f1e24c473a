"""Which address the launcher's rendezvous store listens on.

On one machine the store stays on 127.0.0.1.  When ranks run on other hosts it
must listen where they can reach it: on --network-interface's address, or else on
the address this machine uses to reach the first remote host (the source address
of the kernel's route to it, so no DNS entry for this machine is needed).  The
ranks pick their own addresses the same way (csrc/core/address.cc).
"""

from __future__ import annotations

import fcntl
import socket
import struct

__all__ = [
    "NetworkError", "free_port", "interface_address", "reachable_address", "route_source_address",
    "store_address",
]  # fmt: skip

_SIOCGIFADDR = 0x8915  # linux/sockios.h


class NetworkError(RuntimeError):
    """No usable address: a missing interface, or no route to a host."""


def interface_address(iface: str) -> str:
    """The IPv4 address of a network interface of this machine."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        try:
            packed = fcntl.ioctl(s.fileno(), _SIOCGIFADDR, struct.pack("256s", iface.encode()[:15]))
        except OSError as e:
            known = ", ".join(name for _, name in socket.if_nameindex())
            raise NetworkError(
                f"network interface {iface!r} has no IPv4 address on {socket.gethostname()} "
                f"({e.strerror}; interfaces here: {known})"
            ) from None
    return socket.inet_ntoa(packed[20:24])


def route_source_address(host: str, port: int = 22) -> str:
    """The local address the kernel would send from to reach host.  connect() on a
    UDP socket sends nothing; it only picks the route."""
    try:
        target = socket.getaddrinfo(host, port, socket.AF_INET, socket.SOCK_DGRAM)[0][4]
    except socket.gaierror as e:
        raise NetworkError(f"cannot resolve host {host!r}: {e.strerror}") from None
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        try:
            s.connect(target)
        except OSError as e:
            raise NetworkError(f"no route to host {host!r} ({target[0]}): {e.strerror}") from None
        return s.getsockname()[0]


def reachable_address(store_host: str, store_port: int, iface: str | None) -> str:
    """This machine's address as the job's other ranks reach it, chosen as the engine
    chooses its own (csrc/core/address.cc): iface's (HOROVOD_GLOO_IFACE), else the
    source address of the route to the job's store (127.0.0.1 when the store is on
    loopback), else the hostname."""
    if iface:
        return interface_address(iface)
    try:
        return route_source_address(store_host, store_port)
    except NetworkError:
        return socket.gethostname()


def free_port() -> int:
    """A TCP port free on this machine now: torch.distributed's MASTER_PORT, which rank
    0's TCPStore binds moments later (another process may take it in between, as with
    torchrun's own choice of port)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("", 0))
        return s.getsockname()[1]


def store_address(remote_hosts: list[str], iface: str | None) -> str:
    """Where the store listens: loopback when every rank is local."""
    if iface:
        return interface_address(iface)
    if not remote_hosts:
        return "127.0.0.1"
    return route_source_address(remote_hosts[0])
