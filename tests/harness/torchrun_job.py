"""torchrun under test, and the reports of tests/harness/plain_ddp.py: shared by
the launcher tests (test_torchrun.py) and the integrations tier."""

from __future__ import annotations

import json
import os
import re
import signal
import socket
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
# tests/harness/plain_ddp.py: init_process_group(backend) with env://, never hvd_torch.
PLAIN_DDP = ROOT / "tests" / "harness" / "plain_ddp.py"


def launch_env(**extra) -> dict:
    """The environment of a launched job: the checkout importable, the venv's tools first."""
    env = dict(os.environ, PYTHONPATH=str(ROOT),
               PATH=os.path.dirname(sys.executable) + os.pathsep + os.environ.get("PATH", ""))
    env.update(extra)
    return env


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def run_in_session(cmd, timeout: float, env=None, cwd=ROOT):
    """cmd in its own session to the end; returns (exit code, output with stderr
    merged). On a timeout the whole session (a launcher and the ranks it started) is
    killed and the test fails with the output."""
    proc = subprocess.Popen([str(c) for c in cmd], env=env or launch_env(), cwd=cwd,
                            stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True, start_new_session=True)
    try:
        out, _ = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        out, _ = proc.communicate()
        raise AssertionError(f"{cmd}: no exit within {timeout}s\n{out}") from None
    return proc.returncode, out


def run_torchrun(*args, nproc: int = 2, timeout: float = 150, env=None):
    """`python -m torch.distributed.run --nproc-per-node NPROC ...` to the end;
    returns (exit code, output with stderr merged)."""
    return run_in_session([sys.executable, "-m", "torch.distributed.run", "--nproc-per-node",
                           nproc, "--master-addr", "127.0.0.1", "--master-port", free_port(),
                           *args], timeout, env)


def ddp_reports(out: str, size: int) -> dict:
    """Each rank's plain_ddp report, by rank, once every rank is checked to have trained to
    the same weights and summed rank + 1 over all ranks."""
    reports = {}
    # Decoded where each report starts, not line by line: the ranks share one pipe,
    # and another process's write may land right after a report, before its newline.
    decoder = json.JSONDecoder()
    for found in re.finditer(r"plain_ddp (?=\{)", out):
        report, _ = decoder.raw_decode(out, found.end())
        reports[report["rank"]] = report
    assert sorted(reports) == list(range(size)), out
    for report in reports.values():
        assert report["size"] == size and report["sum"] == size * (size + 1) / 2, report
        assert len(set(report["digests"])) == 1, report
    return reports
