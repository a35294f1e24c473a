"""Test hosts made of Linux network namespaces, each with its own address and sshd.

    with NetnsHosts(tmp_path, ["a", "b"]) as cluster:
        cluster.address("a")          # "10.213.7.2", reachable from this machine
        cluster.hvdrun_ssh_args()     # ["--ssh-identity-file", key]

Each host is a namespace `hvdt-<name>` with a veth `hvdt0` (10.213.7.0/24) plugged
into a bridge `hvdt0` in this machine's namespace (10.213.7.1), and optionally a
second network `hvdt1` (10.213.8.0/24) for NIC-selection tests.  The namespaces
share this machine's file system, so a remote rank cds to the same directory and
runs the same .venv python.  An sshd with a host key made here runs inside each
namespace and accepts only a client key made here.

Nothing is routed or forwarded out of the bridges: traffic stays between this
machine and the namespaces.  One cluster exists at a time (a lock file), stale ones
from a killed run are removed first, and close() tears everything down (processes in
the namespaces, sshd, links, namespaces), also when a test fails.

Needs root, iproute2 and openssh-server; skip_unless_available() skips otherwise.
"""

from __future__ import annotations

import fcntl
import os
import shutil
import signal
import subprocess
import time
from pathlib import Path

__all__ = ["NetnsHosts", "skip_reason"]

PREFIX = "hvdt"
NETWORKS = {"hvdt0": "10.213.7", "hvdt1": "10.213.8"}
_LOCK = "/tmp/hvd_torch_netns.lock"
_SSHD = "/usr/sbin/sshd"


def skip_reason() -> str | None:
    """Why namespace hosts cannot be made here, or None."""
    if os.geteuid() != 0:
        return "network namespaces need root"
    for tool in ("ip", "ssh", "ssh-keygen"):
        if shutil.which(tool) is None:
            return f"{tool} is not installed (iproute2, openssh-client)"
    if not os.path.exists(_SSHD):
        return "sshd is not installed (openssh-server)"
    probe = f"{PREFIX}-probe{os.getpid()}"
    made = subprocess.run(["ip", "netns", "add", probe], capture_output=True, text=True)
    if made.returncode != 0:
        return f"cannot create a network namespace: {made.stderr.strip()}"
    subprocess.run(["ip", "netns", "del", probe], capture_output=True)
    return None


def _ip(*args: str, check: bool = True) -> subprocess.CompletedProcess:
    proc = subprocess.run(["ip", *args], capture_output=True, text=True, timeout=30)
    if check and proc.returncode != 0:
        raise RuntimeError(f"ip {' '.join(args)}: {proc.stderr.strip()}")
    return proc


class NetnsHosts:
    def __init__(self, workdir: Path, names: list[str], networks=("hvdt0",), sshd=None,
                 ssh_port: int = 22):  # fmt: skip
        """names: host names ("a", "b", ...); host i gets .2 + i on every network.
        sshd: the names that run an sshd (default all): a host without one
        refuses ssh connections, like a machine whose sshd is down.
        ssh_port: the port every sshd listens on."""
        self.workdir = Path(workdir)
        self.names = list(names)
        self.networks = list(networks)
        self.sshd_hosts = list(names if sshd is None else sshd)
        self.key = self.workdir / "client_key"
        self.ssh_port = ssh_port
        self._sshd: dict[str, subprocess.Popen] = {}
        self._host_keys: dict[str, Path] = {}  # a host's own key, after change_host_key()
        self._lock_file = None

    # ---------------------------------------------------------------- addresses

    def namespace(self, name: str) -> str:
        return f"{PREFIX}-{name}"

    def address(self, name: str, network: str = "hvdt0") -> str:
        return f"{NETWORKS[network]}.{2 + self.names.index(name)}"

    def launcher_address(self, network: str = "hvdt0") -> str:
        return f"{NETWORKS[network]}.1"

    @property
    def known_hosts(self) -> Path:
        """The known_hosts file hvdrun checks these hosts' keys in (each set of hosts
        has new keys, so the user's own file is never touched)."""
        return self.workdir / "known_hosts"

    def hvdrun_ssh_args(self) -> list[str]:
        port = [] if self.ssh_port == 22 else ["--ssh-port", str(self.ssh_port)]
        return ["--ssh-identity-file", str(self.key),
                "--ssh-known-hosts-file", str(self.known_hosts), *port]  # fmt: skip

    def pids(self, name: str) -> list[int]:
        """Processes running in the host's namespace, its sshd excluded."""
        out = _ip("netns", "pids", self.namespace(name), check=False).stdout.split()
        sshd = self._sshd.get(name)
        return [int(p) for p in out if sshd is None or int(p) != sshd.pid]

    # ---------------------------------------------------------------- lifecycle

    def __enter__(self) -> NetnsHosts:
        self._lock_file = open(_LOCK, "w")
        fcntl.flock(self._lock_file, fcntl.LOCK_EX)
        try:
            _remove_stale()
            self._make_networks()
            self._make_keys()
            for name in self.sshd_hosts:
                self._start_sshd(name)
            for name in self.sshd_hosts:
                self._wait_for_ssh(name)
        except BaseException:
            self.close()
            raise
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def close(self) -> None:
        for name in self.names:
            for pid in self.pids(name):
                try:
                    os.kill(pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
        for proc in self._sshd.values():
            if proc.poll() is None:
                proc.kill()
            proc.wait(timeout=10)
        self._sshd.clear()
        _remove_stale()
        if self._lock_file is not None:
            self._lock_file.close()
            self._lock_file = None

    def unplug(self, name: str) -> None:
        """Takes the host off the network, as if its cable were pulled: its end of
        every bridge goes down, packets to and from it are dropped without a reply."""
        for bridge in self.networks:
            _ip("link", "set", f"{bridge}{name}"[:15], "down")

    def stop_sshd(self, name: str) -> None:
        proc = self._sshd.pop(name)
        proc.kill()
        proc.wait(timeout=10)

    def change_host_key(self, name: str) -> None:
        """Restarts the host's sshd with a new host key, as a machine that was
        reinstalled, or one that an impostor answers for, would present."""
        key = self.workdir / f"host_key_{name}_{len(self._host_keys)}"
        _keygen(key)
        self._host_keys[name] = key
        self.stop_sshd(name)
        self._start_sshd(name)
        self._wait_for_ssh(name)

    # ---------------------------------------------------------------- set-up

    def _make_networks(self) -> None:
        for bridge in self.networks:
            _ip("link", "add", bridge, "type", "bridge")
            _ip("addr", "add", f"{NETWORKS[bridge]}.1/24", "dev", bridge)
            _ip("link", "set", bridge, "up")
        for i, name in enumerate(self.names):
            ns = self.namespace(name)
            _ip("netns", "add", ns)
            _ip("-n", ns, "link", "set", "lo", "up")
            for bridge in self.networks:
                outside = f"{bridge}{name}"[:15]  # this machine's end, on the bridge
                inside = f"{outside}x"[:15]
                _ip("link", "add", outside, "type", "veth", "peer", "name", inside)
                _ip("link", "set", outside, "master", bridge)
                _ip("link", "set", outside, "up")
                _ip("link", "set", inside, "netns", ns)
                # The same interface name on every host, as --network-interface expects.
                _ip("-n", ns, "link", "set", inside, "name", bridge)
                _ip("-n", ns, "addr", "add", f"{NETWORKS[bridge]}.{2 + i}/24", "dev", bridge)
                _ip("-n", ns, "link", "set", bridge, "up")

    def _make_keys(self) -> None:
        self.workdir.mkdir(parents=True, exist_ok=True)
        for key in (self.key, self.workdir / "host_key"):
            _keygen(key)
        (self.workdir / "authorized_keys").write_text(
            (self.workdir / "client_key.pub").read_text()
        )
        os.chmod(self.workdir / "authorized_keys", 0o600)

    def _start_sshd(self, name: str) -> None:
        os.makedirs("/run/sshd", exist_ok=True)  # sshd's privilege-separation directory
        config = self.workdir / f"sshd_{name}.conf"
        config.write_text(
            "\n".join([
                f"ListenAddress {self.address(name)}",
                *(f"ListenAddress {self.address(name, n)}" for n in self.networks[1:]),
                f"Port {self.ssh_port}",
                f"HostKey {self._host_keys.get(name, self.workdir / 'host_key')}",
                f"AuthorizedKeysFile {self.workdir / 'authorized_keys'}",
                "PermitRootLogin prohibit-password",
                "PasswordAuthentication no",
                "KbdInteractiveAuthentication no",
                "UsePAM no",
                "StrictModes no",
                f"PidFile {self.workdir / f'sshd_{name}.pid'}",
                "MaxStartups 100:30:200",  # hvdrun connects once per rank, at once
                "MaxSessions 100",
                "LogLevel ERROR",
                "",
            ])  # fmt: skip
        )
        self._sshd[name] = subprocess.Popen(
            ["ip", "netns", "exec", self.namespace(name), _SSHD, "-D", "-e", "-f", str(config)],
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=open(self.workdir / f"sshd_{name}.log", "w"),
        )

    def _wait_for_ssh(self, name: str, timeout: float = 20.0) -> None:
        deadline = time.monotonic() + timeout
        while True:
            probe = subprocess.run(
                ["ssh", "-o", "BatchMode=yes", "-o", "StrictHostKeyChecking=no",
                 "-o", "UserKnownHostsFile=/dev/null", "-o", "LogLevel=ERROR",
                 "-o", "ConnectTimeout=2", "-p", str(self.ssh_port), "-i", str(self.key),
                 self.address(name), "true"],
                stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=10,
            )  # fmt: skip
            if probe.returncode == 0:
                return
            if self._sshd[name].poll() is not None or time.monotonic() > deadline:
                log = (self.workdir / f"sshd_{name}.log").read_text()
                raise RuntimeError(f"sshd in {self.namespace(name)} not answering: "
                                   f"{probe.stderr.strip()} / sshd log: {log}")  # fmt: skip
            time.sleep(0.2)


def _keygen(path: Path) -> None:
    subprocess.run(
        ["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(path)],
        check=True, capture_output=True, timeout=30,
    )  # fmt: skip


def _remove_stale() -> None:
    """Namespaces and links of this harness (their names only) left by any run."""
    for line in _ip("netns", "list", check=False).stdout.splitlines():
        ns = line.split()[0] if line.split() else ""
        if ns.startswith(f"{PREFIX}-"):
            for pid in _ip("netns", "pids", ns, check=False).stdout.split():
                try:
                    os.kill(int(pid), signal.SIGKILL)
                except (ProcessLookupError, ValueError):
                    pass
            _ip("netns", "del", ns, check=False)
    for line in _ip("-o", "link", "show", check=False).stdout.splitlines():
        fields = line.split(":")
        if len(fields) > 1:
            link = fields[1].strip().split("@")[0]
            if link.startswith(PREFIX):
                _ip("link", "del", link, check=False)
