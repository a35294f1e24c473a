"""torchrun under test, and the reports of tests/harness/plain_ddp.py: shared by
the launcher tests (test_torchrun.py) and the integrations tier."""

from __future__ import annotations

import json
import os
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


def run_torchrun(*args, nproc: int = 2, timeout: float = 150, env=None):
    """`python -m torch.distributed.run --nproc-per-node NPROC ...` to the end;
    returns (exit code, output with stderr merged)."""
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", str(nproc),
           "--master-addr", "127.0.0.1", "--master-port", str(free_port()), *map(str, args)]
    try:
        done = subprocess.run(cmd, env=env or launch_env(), cwd=ROOT, stdin=subprocess.DEVNULL,
                              stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                              timeout=timeout)
    except subprocess.TimeoutExpired as e:
        raise AssertionError(f"torchrun {args}: no exit within {timeout}s\n{e.output}") from None
    return done.returncode, done.stdout


def ddp_reports(out: str, size: int) -> dict:
    """Each rank's plain_ddp report, by rank, once every rank is checked to have trained to
    the same weights and summed rank + 1 over all ranks."""
    reports = {}
    for line in out.splitlines():
        _, found, text = line.partition("plain_ddp ")
        if found:
            report = json.loads(text)
            reports[report["rank"]] = report
    assert sorted(reports) == list(range(size)), out
    for report in reports.values():
        assert report["size"] == size and report["sum"] == size * (size + 1) / 2, report
        assert len(set(report["digests"])) == 1, report
    return reports
