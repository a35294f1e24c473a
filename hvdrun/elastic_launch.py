"""hvdrun's elastic mode: the ElasticDriver with workers on the discovered hosts.

    hvdrun --min-np 2 --max-np 4 --host-discovery-script ./hosts.sh python train.py

Enabled by any of --min-np, --max-np, --host-discovery-script (horovodrun's rule).
Workers for this machine's names (localhost, its hostname) run here; workers for
other hosts start over ssh (ssh.py), as they are discovered, and are stopped when
their host goes away.  Output lines are prefixed with the worker's id,
`[w3]<stdout>:`, since ranks change from round to round.
"""

from __future__ import annotations

import dataclasses
import os
import signal
import socket
import threading

from . import config
from .args import UsageError, non_negative_int, positive_float, positive_int
from .discovery import DiscoveryError, FixedHosts, HostDiscoveryScript, parse_hosts
from .elastic_driver import ElasticDriver
from .env import forwarded_env
from .hosts import is_local_host
from .network import NetworkError, interface_address, route_source_address
from .output import note
from .processes import Processes, close_stdin, signal_group
from .ssh import SshSettings, remote_command
from .store import (
    KVStoreClient,
    KVStoreServer,
    StoreError,
    StoreLimits,
    make_secret,
    secret_to_hex,
)

__all__ = ["ElasticOptions", "HostLauncher", "parse_elastic_options", "run_elastic"]

_DEFAULT_ELASTIC_TIMEOUT = 600.0  # horovodrun's default
_ELASTIC_ONLY = {
    "slots_per_host": "--slots-per-host",
    "reset_limit": "--reset-limit",
    "elastic_timeout": "--elastic-timeout",
}


@dataclasses.dataclass
class ElasticOptions:
    min_np: int
    max_np: int | None = None
    discovery_script: str | None = None
    hosts: dict[str, int] | None = None  # fixed hosts when there is no script
    slots_per_host: int | None = None
    reset_limit: int | None = None
    elastic_timeout: float = _DEFAULT_ELASTIC_TIMEOUT


def parse_elastic_options(values: dict[str, str], num_proc: int | None) -> ElasticOptions | None:
    """ElasticOptions from launch.parse_args's option values; None when the job is
    not elastic.  Raises UsageError."""
    if not {"min_np", "max_np", "discovery_script"} & values.keys():
        for key, flag in _ELASTIC_ONLY.items():
            if key in values:
                raise UsageError(
                    f"{flag} is for elastic jobs (give --min-np, --max-np or "
                    "--host-discovery-script)"
                )
        return None
    opts = ElasticOptions(min_np=0)
    if "min_np" in values:
        opts.min_np = positive_int("--min-np", values["min_np"])
    elif num_proc is not None:
        opts.min_np = num_proc
    else:
        raise UsageError("elastic mode needs --min-np (or -np)")
    if "max_np" in values:
        opts.max_np = positive_int("--max-np", values["max_np"])
        if opts.max_np < opts.min_np:
            raise UsageError(f"--max-np {opts.max_np} is less than --min-np {opts.min_np}")
    if num_proc is not None and (
        num_proc < opts.min_np or (opts.max_np is not None and num_proc > opts.max_np)
    ):
        raise UsageError(f"-np {num_proc} is outside [--min-np, --max-np]")
    if "slots_per_host" in values:
        opts.slots_per_host = positive_int("--slots-per-host", values["slots_per_host"])
    if "reset_limit" in values:
        opts.reset_limit = non_negative_int("--reset-limit", values["reset_limit"])
    if "elastic_timeout" in values:
        opts.elastic_timeout = positive_float("--elastic-timeout", values["elastic_timeout"])
    if "discovery_script" in values:
        if "hosts" in values:
            raise UsageError("give either -H/--hosts or --host-discovery-script, not both")
        opts.discovery_script = values["discovery_script"]
    elif "hosts" in values:
        try:
            opts.hosts = parse_hosts(values["hosts"], opts.slots_per_host or 1, separator=",")
        except DiscoveryError as e:
            raise UsageError(f"-H/--hosts: {e}") from None
    else:
        opts.hosts = {"localhost": opts.max_np or num_proc or opts.min_np}
    return opts


class _Worker:
    """A worker process here, or the ssh client of a worker on another host."""

    def __init__(self, proc):
        self._proc = proc

    def poll(self) -> int | None:
        return self._proc.poll()

    def kill(self) -> None:
        # A remote worker's wrapper stops it when the ssh channel closes (ssh.py).
        close_stdin(self._proc)
        signal_group(self._proc, signal.SIGKILL)  # its own group: its children too


class HostLauncher:
    """Starts workers on the hosts discovery names: this machine's as local processes,
    the others over ssh, with prefixed output.  Called from the driver's thread only.

    Remote workers reach the store at the address this machine uses towards their
    host.  Local workers in a job that also has remote hosts must advertise an
    address the remote ones reach: they use --network-interface's, or the address
    towards the first remote host discovery named at the start."""

    def __init__(self, command: list[str], ssh: SshSettings, iface: str | None,
                 local_store_host: str, extra_env):  # fmt: skip
        self._command = command
        self._ssh = ssh
        self._iface = iface
        self._local_store_host = local_store_host
        self._extra_env = dict(extra_env)
        self._procs = Processes()

    def start(self, worker_id: str, host: str, env) -> _Worker:
        if _runs_here(host):
            full = dict(os.environ)
            full.update({k: v for k, v in self._extra_env.items() if v is not None})
            full.update(env)
            full["HOROVOD_GLOO_RENDEZVOUS_ADDR"] = self._local_store_host
            return _Worker(self._procs.start(worker_id, self._command, full))
        try:
            store_host = (interface_address(self._iface) if self._iface
                          else route_source_address(host))
        except NetworkError as e:
            raise OSError(str(e)) from None
        full = forwarded_env(os.environ, self._extra_env)
        full.update(env)
        full["HOROVOD_GLOO_RENDEZVOUS_ADDR"] = store_host
        argv, stdin = remote_command(host, self._command, full, os.getcwd(), self._ssh)
        return _Worker(self._procs.start(worker_id, argv, dict(os.environ), stdin=stdin))

    def engine_host(self, host: str) -> str:
        return socket.gethostname() if _runs_here(host) else host

    def stop(self) -> None:
        if any(p.poll() is None for p in self._procs.procs):
            self._procs.stop()
        self._procs.drain()


def _runs_here(host: str) -> bool:
    """Whether host's workers start on this machine.  HVD_TORCH_ELASTIC_LOCAL=1 makes
    every discovered host a label for this machine (slot counts and blacklisting
    work as usual; no ssh): for trying elastic behaviour on one machine."""
    return config.Launch.from_environment().local_labels or is_local_host(host)


def _store_bind(discovery, iface: str | None) -> tuple[str, str]:
    """(address the store listens on, address local workers reach it at)."""
    if iface:
        address = interface_address(iface)
        return address, address
    try:
        first = dict(discovery())
    except Exception:  # noqa: BLE001  (the driver reports discovery failures itself)
        first = {}
    remote = [h for h in first if not _runs_here(h)]
    if not remote and isinstance(discovery, FixedHosts):
        return "127.0.0.1", "127.0.0.1"  # -H names every host there will be
    if not remote:
        # Listen everywhere: a discovery script may add remote hosts later, on a
        # route not known yet (--network-interface names it instead).
        return "0.0.0.0", "127.0.0.1"
    # As static mode: the address this machine reaches the first remote host from.
    address = route_source_address(remote[0])
    return address, address


def run_elastic(opts) -> int:
    """Runs launch.Options `opts` (with opts.elastic set) to its end; the exit code."""
    e: ElasticOptions = opts.elastic
    if e.discovery_script is not None:
        discovery = HostDiscoveryScript(e.discovery_script, e.slots_per_host)
    else:
        discovery = FixedHosts(e.hosts)
    secret = make_secret()
    try:
        bind, local_store_host = _store_bind(discovery, opts.iface)
        store = KVStoreServer(bind, 0, secret, StoreLimits.for_job(e.max_np)).start()
    except (NetworkError, StoreError) as err:
        note(f"error: {err}")
        return 1
    handlers = {}
    launcher = None
    try:
        with store:
            launcher = HostLauncher(
                opts.command, opts.ssh, opts.iface, local_store_host, opts.extra_env
            )
            if opts.verbose:
                note(f"store listening on {store.address}")
            worker_env = {
                "HOROVOD_GLOO_RENDEZVOUS_ADDR": local_store_host,
                "HOROVOD_GLOO_RENDEZVOUS_PORT": str(store.port),
                "HOROVOD_SECRET_KEY": secret_to_hex(secret),
                "HOROVOD_CONTROLLER": "gloo",
                "HOROVOD_CPU_OPERATIONS": "gloo",
                "PYTHONUNBUFFERED": "1",  # see env.py
            }
            if opts.start_timeout is not None:
                worker_env["HOROVOD_START_TIMEOUT"] = f"{opts.start_timeout:g}"
            if opts.iface:
                worker_env["HOROVOD_GLOO_IFACE"] = opts.iface
            with KVStoreClient(local_store_host, store.port, secret) as client:
                driver = ElasticDriver(
                    client, discovery, launcher,
                    min_np=e.min_np, max_np=e.max_np, reset_limit=e.reset_limit,
                    elastic_timeout=e.elastic_timeout,
                    start_timeout=opts.start_timeout or 30.0, worker_env=worker_env, log=note,
                )  # fmt: skip
                if threading.current_thread() is threading.main_thread():
                    for signum in (signal.SIGINT, signal.SIGTERM):
                        handlers[signum] = signal.signal(
                            signum, lambda s, _f: driver.request_stop(s)
                        )
                return driver.run()
    finally:
        if launcher is not None:
            launcher.stop()
        for signum, handler in handlers.items():
            signal.signal(signum, handler)
