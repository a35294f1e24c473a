"""The processes a launcher starts (ranks, or the ssh clients of remote ranks),
their prefixed output, and how to stop them.

Every process gets its own process group, so that stopping it also stops whatever
it forked.  A remote rank's process here is its ssh client, started with a stdin
pipe: the remote wrapper (ssh.py) stops the rank when that pipe closes, so closing
stdin is how a remote rank is asked to stop, and a dead launcher or connection
stops it too.

Threading: start/stop/signal_all from one thread; the pumps are daemon threads.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import threading
import time

from .output import STREAM_LOCKS, RankFiles

__all__ = [
    "GRACE_SECONDS", "POLL_SECONDS", "Processes", "close_stdin", "exit_code", "signal_group",
]  # fmt: skip

GRACE_SECONDS = 3.0  # SIGTERM -> SIGKILL
POLL_SECONDS = 0.05


class Processes:
    """The running processes, in start order, and their output pumps."""

    def __init__(self, files: RankFiles | None = None):
        """files: --output-filename's per-rank files (labels are then ranks)."""
        self.procs: list[subprocess.Popen] = []
        self._pumps: list[threading.Thread] = []
        self._files = files

    def start(self, label, command: list[str], env: dict[str, str], stdin: bytes | None = None):
        """Starts command; its output lines are prefixed with `[label]<stream>:`.
        stdin: bytes written to a stdin pipe that then stays open until stop() (ssh
        clients); None: no stdin.  Raises OSError when the command cannot be executed
        or its --output-filename files cannot be made (before anything starts)."""
        copies = {s: self._files.open(label, s) if self._files is not None else None
                  for s in ("stdout", "stderr")}  # fmt: skip
        proc = subprocess.Popen(
            command,
            env=env,
            stdin=subprocess.DEVNULL if stdin is None else subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            start_new_session=True,
        )
        self.procs.append(proc)
        if stdin is not None:
            try:
                proc.stdin.write(stdin)
                proc.stdin.flush()
            except BrokenPipeError:
                pass  # it died at once; its exit code tells why
        for stream, pipe in (("stdout", proc.stdout), ("stderr", proc.stderr)):
            pump = threading.Thread(
                target=_pump, args=(label, stream, pipe, copies[stream]), name=f"hvdrun-{label}-{stream}",
                daemon=True,
            )  # fmt: skip
            pump.start()
            self._pumps.append(pump)
        return proc

    def signal_all(self, signum: int) -> None:
        for proc in self.procs:
            signal_group(proc, signum)

    def stop(self, grace: float = GRACE_SECONDS, signum: int = signal.SIGTERM) -> None:
        """signum to every process group, SIGKILL to those still alive after grace."""
        for proc in self.procs:
            close_stdin(proc)
        self.signal_all(signum)
        deadline = time.monotonic() + grace
        while time.monotonic() < deadline and any(p.poll() is None for p in self.procs):
            time.sleep(POLL_SECONDS)
        if any(p.poll() is None for p in self.procs):
            self.signal_all(signal.SIGKILL)
        for proc in self.procs:
            proc.wait()

    def drain(self, timeout: float = 2.0) -> None:
        # A rank's orphaned child may hold a pipe open forever; don't wait on it.
        deadline = time.monotonic() + timeout
        for pump in self._pumps:
            pump.join(max(0.0, deadline - time.monotonic()))


def signal_group(proc: subprocess.Popen, signum: int) -> None:
    try:
        os.killpg(proc.pid, signum)
    except (ProcessLookupError, PermissionError):
        pass  # that group is already gone


def close_stdin(proc: subprocess.Popen) -> None:
    if proc.stdin is not None and not proc.stdin.closed:
        try:
            proc.stdin.close()
        except OSError:
            pass


def _pump(label, stream: str, pipe, copy=None) -> None:
    """Copies pipe's lines to our stream, prefixed, and to `copy` (a binary file
    of --output-filename, closed here) as they are."""
    prefix = f"[{label}]<{stream}>:"
    with pipe, copy if copy is not None else contextlib.nullcontext():
        for raw in iter(pipe.readline, b""):
            if copy is not None:
                try:
                    copy.write(raw)
                    copy.flush()
                except OSError:
                    pass  # a full disk must not stop the rank: the terminal still gets it
            line = raw.decode("utf-8", errors="replace")
            if not line.endswith("\n"):
                line += "\n"
            out = getattr(sys, stream)  # looked up per line: tests swap it
            with STREAM_LOCKS[stream]:
                try:
                    out.write(prefix + line)
                    out.flush()
                except (OSError, ValueError):
                    # Our own stdout is gone (`hvdrun ... | head`) or cannot encode
                    # the line: keep draining, or the rank would block on a full pipe.
                    pass


def exit_code(code: int) -> int:
    """A Popen return code as a shell exit status: -9 becomes 137."""
    return 128 - code if code < 0 else code
