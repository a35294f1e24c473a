"""An hvdrun process under test, watched line by line: its output is collected
with each line's arrival time, a test waits for a line by predicate, and the
`EVENT <kind> key=value ... t=<time>` lines of tests/harness/elastic_job.py are parsed.
Shared by the elastic tests on one machine (test_elastic_faults.py) and across
namespace hosts (test_multihost_elastic.py)."""

from __future__ import annotations

import os
import signal
import subprocess
import threading
import time


class HvdrunJob:
    def __init__(self, cmd, env, cwd, hosts_file=None, wait_timeout=60.0, finish_timeout=120.0):
        """cmd starts in its own session (kill() ends the whole job). hosts_file:
        what the job's --host-discovery-script prints (set_hosts writes it)."""
        self.hosts_file = hosts_file
        self.wait_timeout = wait_timeout
        self.finish_timeout = finish_timeout
        self.lines: list[tuple[float, str]] = []
        self._cond = threading.Condition()
        self.proc = subprocess.Popen(
            cmd, cwd=cwd, env=env, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT, text=True, start_new_session=True,
        )  # fmt: skip
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def set_hosts(self, text: str) -> None:
        tmp = self.hosts_file.with_suffix(".tmp")
        tmp.write_text(text)
        os.replace(tmp, self.hosts_file)  # the driver never reads half a file

    def _read(self):
        for line in self.proc.stdout:
            with self._cond:
                self.lines.append((time.time(), line.rstrip("\n")))
                self._cond.notify_all()

    def wait_for(self, predicate, timeout=None):
        """The first line satisfying predicate, waiting for it if needed."""
        timeout = self.wait_timeout if timeout is None else timeout
        deadline = time.monotonic() + timeout
        with self._cond:
            seen = 0
            while True:
                for _, line in self.lines[seen:]:
                    if predicate(line):
                        return line
                seen = len(self.lines)
                remaining = deadline - time.monotonic()
                if remaining <= 0 or self.proc.poll() is not None and seen == len(self.lines):
                    raise AssertionError(f"no matching line within {timeout}s:\n{self.output}")
                self._cond.wait(min(remaining, 0.2))

    def finish(self, timeout=None) -> int:
        timeout = self.finish_timeout if timeout is None else timeout
        try:
            code = self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            self.kill()
            raise AssertionError(f"hvdrun still running after {timeout}s:\n{self.output}")
        self._reader.join(10)
        return code

    def kill(self):
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait()

    @property
    def output(self) -> str:
        return "\n".join(line for _, line in self.lines)

    def events(self, kind, after=0.0):
        """(the event's own time, fields) of every `EVENT kind` line that arrived
        after `after`."""
        out = []
        for t, line in self.lines:
            _, _, rest = line.partition("EVENT ")
            if t >= after and rest.startswith(kind + " "):
                fields = dict(f.split("=", 1) for f in rest.split(" ")[1:])
                out.append((float(fields["t"]), fields))
        return out


def run_hvdrun(args, env=None, cwd=None, timeout=90.0, merge_stderr=False):
    """`python -m hvdrun args...` to the end; returns (exit code, stdout, stderr)
    (stderr None with merge_stderr: then stdout has both, in order).

    On a timeout hvdrun gets SIGTERM, which it forwards to its ranks (each in its
    own session), then SIGKILL 10 s later; the test fails naming the output."""
    import sys

    proc = subprocess.Popen([sys.executable, "-m", "hvdrun", *args], cwd=cwd, env=env,
                            stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT if merge_stderr else subprocess.PIPE,
                            text=True)
    try:
        out, err = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        proc.send_signal(signal.SIGTERM)
        try:
            out, err = proc.communicate(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
            out, err = proc.communicate()
        raise AssertionError(f"hvdrun {' '.join(args)}: no exit within {timeout}s\n{out}\n{err}")
    return proc.returncode, out, err


def run_hvdrun_nodes(args, env, cwd, timeout, nnodes=2):
    """One `hvdrun --nnodes NNODES --node-rank I --nproc-per-node 1` per node on this
    machine (as srun starts them), each to the end; returns (exit codes, outputs,
    the rendezvous port). Every process still running at the end is killed."""
    import sys

    from torchrun_job import free_port

    rdzv_port = free_port()
    nodes = [subprocess.Popen(
        [sys.executable, "-m", "hvdrun", "--nnodes", str(nnodes), "--node-rank", str(node),
         "--nproc-per-node", "1", "--rdzv-endpoint", f"127.0.0.1:{rdzv_port}", *map(str, args)],
        env=env, cwd=cwd, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT, text=True) for node in range(nnodes)]  # fmt: skip
    try:
        outs = [p.communicate(timeout=timeout)[0] for p in nodes]
    finally:
        for p in nodes:
            if p.poll() is None:
                p.kill()
                p.communicate()
    return [p.returncode for p in nodes], outs, rdzv_port
