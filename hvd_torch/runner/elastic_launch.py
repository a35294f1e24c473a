"""hvdrun's elastic mode: the ElasticDriver with workers as local processes.

    hvdrun --min-np 2 --max-np 4 --host-discovery-script ./hosts.sh python train.py

Enabled by any of --min-np, --max-np, --host-discovery-script (horovodrun's rule).
Every worker runs on this machine, whatever host discovery names: hvdrun has no ssh
launching yet, so host names are labels that group slots (for slot counts and
blacklisting), and the engine sees a single machine.  Output lines are prefixed with
the worker's id, `[w3]<stdout>:`, since ranks change from round to round.
"""

from __future__ import annotations

import dataclasses
import os
import signal
import socket
import threading

from .discovery import FixedHosts, HostDiscoveryScript, parse_hosts
from .elastic_driver import ElasticDriver
from .store import KVStoreClient, KVStoreServer, make_secret, secret_to_hex

__all__ = ["ElasticOptions", "LocalLauncher", "parse_elastic_options", "run_elastic"]

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
    not elastic.  Raises launch.UsageError."""
    from .discovery import DiscoveryError
    from .launch import UsageError, _positive_float, _positive_int

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
        opts.min_np = _positive_int("--min-np", values["min_np"])
    elif num_proc is not None:
        opts.min_np = num_proc
    else:
        raise UsageError("elastic mode needs --min-np (or -np)")
    if "max_np" in values:
        opts.max_np = _positive_int("--max-np", values["max_np"])
        if opts.max_np < opts.min_np:
            raise UsageError(f"--max-np {opts.max_np} is less than --min-np {opts.min_np}")
    if num_proc is not None and (
        num_proc < opts.min_np or (opts.max_np is not None and num_proc > opts.max_np)
    ):
        raise UsageError(f"-np {num_proc} is outside [--min-np, --max-np]")
    if "slots_per_host" in values:
        opts.slots_per_host = _positive_int("--slots-per-host", values["slots_per_host"])
    if "reset_limit" in values:
        text = values["reset_limit"]
        if not text.isdigit():
            raise UsageError(f"--reset-limit must be a non-negative integer, got {text!r}")
        opts.reset_limit = int(text)
    if "elastic_timeout" in values:
        opts.elastic_timeout = _positive_float("--elastic-timeout", values["elastic_timeout"])
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


class _LocalWorker:
    def __init__(self, proc):
        self._proc = proc

    def poll(self) -> int | None:
        return self._proc.poll()

    def kill(self) -> None:
        try:
            os.killpg(self._proc.pid, signal.SIGKILL)  # its own group: its children too
        except (ProcessLookupError, PermissionError):
            pass


class LocalLauncher:
    """Starts workers as processes of this machine, with prefixed output (launch.py's
    pumps).  Called from the driver's thread only."""

    def __init__(self, command: list[str], note):
        from .launch import _Ranks

        self._command = command
        self._ranks = _Ranks()
        self._note = note
        self._local = {"localhost", "127.0.0.1", socket.gethostname(), socket.getfqdn()}
        self._labels_noted: set[str] = set()

    def start(self, worker_id: str, host: str, env) -> _LocalWorker:
        if host not in self._local and host not in self._labels_noted:
            self._labels_noted.add(host)
            self._note(
                f"host {host!r} is not this machine; without ssh launching its workers run here"
            )
        full = dict(os.environ)
        full.update(env)
        self._ranks.start(worker_id, self._command, full)
        return _LocalWorker(self._ranks.procs[-1])

    def engine_host(self, host: str) -> str:
        return socket.gethostname()

    def stop(self) -> None:
        if any(p.poll() is None for p in self._ranks.procs):
            self._ranks.stop()
        self._ranks.drain()


def run_elastic(opts) -> int:
    """Runs launch.Options `opts` (with opts.elastic set) to its end; the exit code."""
    from .launch import _note

    e: ElasticOptions = opts.elastic
    if e.discovery_script is not None:
        discovery = HostDiscoveryScript(e.discovery_script, e.slots_per_host)
    else:
        discovery = FixedHosts(e.hosts)
    secret = make_secret()
    launcher = LocalLauncher(opts.command, _note)
    handlers = {}
    try:
        with KVStoreServer("127.0.0.1", 0, secret) as store:
            if opts.verbose:
                _note(f"store listening on {store.address}")
            worker_env = {
                "HOROVOD_GLOO_RENDEZVOUS_ADDR": store.host,
                "HOROVOD_GLOO_RENDEZVOUS_PORT": str(store.port),
                "HOROVOD_SECRET_KEY": secret_to_hex(secret),
                "HOROVOD_CONTROLLER": "gloo",
                "HOROVOD_CPU_OPERATIONS": "gloo",
                "PYTHONUNBUFFERED": "1",  # see env.py
            }
            if opts.start_timeout is not None:
                worker_env["HOROVOD_START_TIMEOUT"] = f"{opts.start_timeout:g}"
            with KVStoreClient(store.host, store.port, secret) as client:
                driver = ElasticDriver(
                    client, discovery, launcher,
                    min_np=e.min_np, max_np=e.max_np, reset_limit=e.reset_limit,
                    elastic_timeout=e.elastic_timeout,
                    start_timeout=opts.start_timeout or 30.0, worker_env=worker_env, log=_note,
                )  # fmt: skip
                if threading.current_thread() is threading.main_thread():
                    for signum in (signal.SIGINT, signal.SIGTERM):
                        handlers[signum] = signal.signal(
                            signum, lambda s, _f: driver.request_stop(s)
                        )
                return driver.run()
    finally:
        launcher.stop()
        for signum, handler in handlers.items():
            signal.signal(signum, handler)
