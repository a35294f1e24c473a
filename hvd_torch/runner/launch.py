"""hvdrun: start N local ranks of a command, horovodrun-style (gloo mode).

    hvdrun -np 4 python train.py --lr 0.1

The launcher serves the rendezvous store on 127.0.0.1 with a fresh secret, starts
each rank in its own process group with the environment from env.py, prefixes
every output line with `[rank]<stdout>:` / `[rank]<stderr>:`, and supervises:
the first rank to fail takes the others down, and its exit code becomes ours.

horovodrun flags we do not implement are refused, never ignored: a silently
ignored --hostfile or --fusion-threshold-mb would run a different job from the
one the user asked for.
"""

from __future__ import annotations

import dataclasses
import os
import signal
import socket
import subprocess
import sys
import threading
import time

from .env import rank_env
from .store import KVStoreServer, make_secret

__all__ = ["main"]

PROG = "hvdrun"
USAGE = f"""\
usage: {PROG} -np N [-H localhost:N] [--gloo] [--verbose] [--start-timeout S] command [args...]
       {PROG} [-np N] --min-np N [--max-np N] [--host-discovery-script S | -H HOSTS]
              [--slots-per-host N] [--reset-limit N] [--elastic-timeout S] command [args...]

  -np, --num-proc N       number of ranks to start on this machine
  -H, --hosts HOSTS       host:slots list; only this machine is supported
                          (localhost, 127.0.0.1 or its hostname)
  --gloo                  accepted for horovodrun compatibility (always gloo)
  --verbose               print the store address and each rank's command
  --start-timeout S       seconds ranks may take to rendezvous
                          (passed to ranks as HOROVOD_START_TIMEOUT)
  -h, --help              show this help

elastic mode (any of --min-np, --max-np, --host-discovery-script; docs/elastic.md):
  --min-np N              fewest workers to train with (default: -np)
  --max-np N              most workers to train with (default: every slot)
  --host-discovery-script S  command printing one host[:slots] line per available
                          host, run every second (default: the -H list, or
                          localhost with -np slots)
  --slots-per-host N      slots of a discovered host printed without :slots
  --reset-limit N         end the job when a (N+1)-th reset would be needed
  --elastic-timeout S     longest wait for --min-np slots or for workers to join
                          a round (default 600)
  Every worker runs on this machine: discovered host names are slot labels
  (no ssh launching yet).
"""

# horovodrun flags that we know and do not implement yet.
_UNSUPPORTED = {
    "--mpi", "--jsm", "--mpi-args", "-hostfile", "--hostfile", "-p", "--ssh-port",
    "-i", "--ssh-identity-file", "--network-interface", "--network-interfaces",
    "--blacklist-cooldown-range", "--tcp",
    "--timeline-filename", "--timeline-mark-cycles", "--output-filename",
    "--log-level", "--log-with-timestamp", "--log-without-timestamp",
    "--log-hide-timestamp", "--prefix-output-with-timestamp", "--config-file",
    "--disable-cache", "--fusion-threshold-mb", "--cycle-time-ms",
    "--cache-capacity", "--hierarchical-allreduce", "--no-hierarchical-allreduce",
    "--hierarchical-allgather", "--no-hierarchical-allgather", "--autotune",
    "--autotune-log-file", "--autotune-warmup-samples",
    "--autotune-steps-per-sample", "--autotune-bayes-opt-max-samples",
    "--autotune-gaussian-process-noise", "--no-stall-check",
    "--stall-check-warning-time-seconds", "--stall-check-shutdown-time-seconds",
    "--mpi-threads-disable", "--num-nccl-streams", "--thread-affinity",
    "--gloo-timeout-seconds", "--nics", "--binding-args", "--check-build", "-cb",
    "--version", "-v",
}  # fmt: skip

# Supported options: those taking a value (by Options field), and plain flags.
_VALUED = {
    "-np": "num_proc",
    "--num-proc": "num_proc",
    "-H": "hosts",
    "--hosts": "hosts",
    "--start-timeout": "start_timeout",
    # elastic mode (parsed in elastic_launch.py)
    "--min-np": "min_np",
    "--min-num-proc": "min_np",
    "--max-np": "max_np",
    "--max-num-proc": "max_np",
    "--host-discovery-script": "discovery_script",
    "--slots-per-host": "slots_per_host",
    "--slots": "slots_per_host",
    "--reset-limit": "reset_limit",
    "--elastic-timeout": "elastic_timeout",
}
_FLAGS = {"--gloo", "--verbose"}  # --gloo: we always are

_GRACE_SECONDS = 3.0  # SIGTERM -> SIGKILL
_POLL_SECONDS = 0.05
# One lock per launcher stream, so rank lines and our own notes never interleave.
_STREAM_LOCKS = {"stdout": threading.Lock(), "stderr": threading.Lock()}


class UsageError(Exception):
    """A command-line mistake; main() prints it and returns 2."""


@dataclasses.dataclass
class Options:
    num_proc: int | None  # None only in elastic mode
    command: list[str]
    verbose: bool = False
    start_timeout: float | None = None
    elastic: object | None = None  # elastic_launch.ElasticOptions in elastic mode


# ---------------------------------------------------------------- arguments


def parse_args(argv: list[str]) -> Options | None:
    """Options, or None when help was asked for.  Raises UsageError."""
    values: dict[str, str] = {}
    flags: set[str] = set()
    i = 0
    while i < len(argv):
        arg = argv[i]
        if arg == "--":
            i += 1
            break
        if not arg.startswith("-") or arg == "-":
            break  # the command starts here; everything after belongs to it
        name, eq, inline = arg.partition("=")
        if name in ("-h", "--help"):
            return None
        if name in _UNSUPPORTED:
            raise UsageError(f"{name} is not supported yet by {PROG}")
        if name in _VALUED:
            if not eq:
                if i + 1 >= len(argv):
                    raise UsageError(f"{name} needs a value")
                i += 1
                inline = argv[i]
            values[_VALUED[name]] = inline
        elif name in _FLAGS:
            if eq:
                raise UsageError(f"{name} takes no value")
            flags.add(name)
        else:
            raise UsageError(f"unknown option {name} (not a horovodrun flag {PROG} supports)")
        i += 1
    from .elastic_launch import parse_elastic_options

    num_proc = None
    if "num_proc" in values:
        num_proc = _positive_int("-np/--num-proc", values["num_proc"])
    elastic = parse_elastic_options(values, num_proc)
    if num_proc is None and elastic is None:
        raise UsageError("-np/--num-proc is required")
    start_timeout = None
    if "start_timeout" in values:
        start_timeout = _positive_float("--start-timeout", values["start_timeout"])
    command = argv[i:]
    if not command:
        raise UsageError("no command given to run")
    if "hosts" in values and elastic is None:
        hosts = values["hosts"]
        slots = _local_slots(hosts)
        if slots < num_proc:
            raise UsageError(f"-np {num_proc} needs {num_proc} slots but -H {hosts} gives {slots}")
    return Options(num_proc, command, "--verbose" in flags, start_timeout, elastic)


def _positive_int(name: str, text: str) -> int:
    try:
        n = int(text)
    except ValueError:
        n = 0
    if n < 1:
        raise UsageError(f"{name} must be a positive integer, got {text!r}")
    return n


def _positive_float(name: str, text: str) -> float:
    try:
        x = float(text)
    except ValueError:
        x = 0.0
    if not x > 0:
        raise UsageError(f"{name} must be a positive number of seconds, got {text!r}")
    return x


def _local_slots(hosts: str) -> int:
    """Total slots in a horovodrun host list, refusing hosts other than this one."""
    local = {"localhost", "127.0.0.1", socket.gethostname(), socket.getfqdn()}
    total = 0
    for entry in hosts.split(","):
        host, _, slots = entry.strip().partition(":")
        if host not in local:
            raise UsageError(
                f"-H/--hosts: remote host {host!r} is not supported yet; "
                f"only this machine ({', '.join(sorted(local))}) may be named"
            )
        total += _positive_int(f"-H/--hosts slots for {host}", slots) if slots else 1
    return total


# ---------------------------------------------------------------- ranks


class _Ranks:
    """The running rank processes, their output pumps, and how to stop them."""

    def __init__(self):
        self.procs: list[subprocess.Popen] = []
        self._pumps: list[threading.Thread] = []

    def start(self, rank: int, command: list[str], env: dict[str, str]) -> None:
        """Raises OSError when the command cannot be executed."""
        proc = subprocess.Popen(
            command,
            env=env,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            # Own process group: stopping a rank also stops whatever it forked.
            start_new_session=True,
        )
        self.procs.append(proc)
        for stream, pipe in (("stdout", proc.stdout), ("stderr", proc.stderr)):
            pump = threading.Thread(
                target=self._pump,
                args=(rank, stream, pipe),
                name=f"hvdrun-{rank}-{stream}",
                daemon=True,
            )
            pump.start()
            self._pumps.append(pump)

    def _pump(self, rank: int, stream: str, pipe) -> None:
        prefix = f"[{rank}]<{stream}>:"
        with pipe:
            for raw in iter(pipe.readline, b""):
                line = raw.decode("utf-8", errors="replace")
                if not line.endswith("\n"):
                    line += "\n"
                out = getattr(sys, stream)  # looked up per line: tests swap it
                with _STREAM_LOCKS[stream]:
                    try:
                        out.write(prefix + line)
                        out.flush()
                    except (OSError, ValueError):
                        # Our own stdout is gone (`hvdrun ... | head`) or cannot
                        # encode the line: keep draining, or the rank would block
                        # on a full pipe.
                        pass

    def signal_all(self, signum: int) -> None:
        for proc in self.procs:
            try:
                os.killpg(proc.pid, signum)
            except (ProcessLookupError, PermissionError):
                pass  # that group is already gone

    def stop(self, grace: float = _GRACE_SECONDS, signum: int = signal.SIGTERM) -> None:
        """signum to every rank's group, SIGKILL to those still alive after grace."""
        self.signal_all(signum)
        deadline = time.monotonic() + grace
        while time.monotonic() < deadline and any(p.poll() is None for p in self.procs):
            time.sleep(_POLL_SECONDS)
        if any(p.poll() is None for p in self.procs):
            self.signal_all(signal.SIGKILL)
        for proc in self.procs:
            proc.wait()

    def drain(self, timeout: float = 2.0) -> None:
        # A rank's orphaned child may hold a pipe open forever; don't wait on it.
        deadline = time.monotonic() + timeout
        for pump in self._pumps:
            pump.join(max(0.0, deadline - time.monotonic()))


def _describe(rank: int, code: int) -> str:
    if code < 0:
        try:
            name = signal.Signals(-code).name
        except ValueError:
            name = f"signal {-code}"
        return f"rank {rank} was killed by signal {-code} ({name})"
    return f"rank {rank} exited with code {code}"


def _exit_code(code: int) -> int:
    return 128 - code if code < 0 else code


# ---------------------------------------------------------------- main


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    try:
        opts = parse_args(argv)
    except UsageError as e:
        sys.stderr.write(f"{USAGE.splitlines()[0]}\n{PROG}: error: {e}\n")
        return 2
    if opts is None:
        sys.stdout.write(USAGE)
        return 0
    return _run(opts)


def _run(opts: Options) -> int:
    if opts.elastic is not None:
        from .elastic_launch import run_elastic

        return run_elastic(opts)
    received: list[int] = []

    def on_signal(signum, _frame):
        received.append(signum)

    # Signal handlers can only be installed from the main thread; a launcher
    # embedded in another thread just doesn't forward signals.
    handlers = {}
    if threading.current_thread() is threading.main_thread():
        for signum in (signal.SIGINT, signal.SIGTERM):
            handlers[signum] = signal.signal(signum, on_signal)

    ranks = _Ranks()
    secret = make_secret()
    try:
        with KVStoreServer("127.0.0.1", 0, secret) as store:
            if opts.verbose:
                _note(f"store listening on {store.address}")
            for rank in range(opts.num_proc):
                env = rank_env(
                    rank, opts.num_proc, store.host, store.port, secret,
                    start_timeout=opts.start_timeout,
                )  # fmt: skip
                if opts.verbose:
                    _note(f"rank {rank}: {subprocess.list2cmdline(opts.command)}")
                try:
                    ranks.start(rank, opts.command, env)
                except OSError as e:
                    _note(f"cannot start rank {rank}: {opts.command[0]}: {e.strerror}")
                    return 127  # the shell's code for "command not found"
            code = _supervise(ranks, received)
            ranks.drain()
            return code
    finally:
        # Covers exceptions (and a failed start): no rank outlives the launcher.
        if any(p.poll() is None for p in ranks.procs):
            ranks.stop()
        for signum, handler in handlers.items():
            signal.signal(signum, handler)


def _supervise(ranks: _Ranks, received: list[int]) -> int:
    while True:
        if received:
            signum = received[0]
            _note(f"received {signal.Signals(signum).name}, stopping all ranks")
            ranks.stop(signum=signum)
            return 128 + signum
        codes = [p.poll() for p in ranks.procs]
        failed = [(rank, c) for rank, c in enumerate(codes) if c not in (None, 0)]
        if failed:
            rank, code = failed[0]
            others = sum(1 for c in codes if c is None)
            ranks.stop()
            ranks.drain()
            _note(f"{_describe(rank, code)}; stopped the {others} rank(s) still running")
            return _exit_code(code)
        if all(c == 0 for c in codes):
            return 0
        time.sleep(_POLL_SECONDS)


def _note(message: str) -> None:
    with _STREAM_LOCKS["stderr"]:
        sys.stderr.write(f"{PROG}: {message}\n")
        sys.stderr.flush()
