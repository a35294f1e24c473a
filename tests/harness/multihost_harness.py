"""Running hvdrun against namespace hosts (netns_hosts.py) from the multi-host tests.

hvdrun runs with the venv's bin first on PATH, so that `python` means the venv's
interpreter on this machine and, through the forwarded PATH, on the remote hosts.
Every run has a deadline; on expiry hvdrun's group gets SIGTERM (which it forwards
to its ranks), then SIGKILL, and the namespace teardown removes whatever is left.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]

import netns_hosts  # noqa: E402

__all__ = ["ROOT", "Run", "cluster", "hvdrun", "rank_lines", "require_netns", "spawn", "finish"]

VENV_BIN = str(Path(sys.executable).parent)


def require_netns() -> None:
    reason = netns_hosts.skip_reason()
    if reason is not None:
        pytest.skip(reason)


def cluster(tmp_path, names, **kwargs) -> netns_hosts.NetnsHosts:
    require_netns()
    return netns_hosts.NetnsHosts(tmp_path / "hosts", names, **kwargs)


def launcher_env(**extra) -> dict[str, str]:
    env = dict(os.environ)
    env["PATH"] = VENV_BIN + os.pathsep + env.get("PATH", "")
    env["PYTHONPATH"] = str(ROOT)
    env.update(extra)
    return env


class Run:
    def __init__(self, code: int, out: str, err: str, seconds: float):
        self.code, self.out, self.err, self.seconds = code, out, err, seconds

    def __repr__(self) -> str:
        return f"exit {self.code} after {self.seconds:.1f}s\n--- stdout\n{self.out}\n--- stderr\n{self.err}"


def spawn(argv: list[str], env=None, netns: str | None = None) -> subprocess.Popen:
    """Starts argv (in namespace netns when given) in its own session."""
    prefix = ["ip", "netns", "exec", netns] if netns else []
    return subprocess.Popen(
        prefix + argv, cwd=ROOT, env=env or launcher_env(), stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True,
    )  # fmt: skip


def finish(proc: subprocess.Popen, timeout: float, started: float | None = None) -> Run:
    started = time.monotonic() if started is None else started
    try:
        out, err = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGTERM)
        try:
            out, err = proc.communicate(timeout=10)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            out, err = proc.communicate()
        raise AssertionError(f"no exit within {timeout}s\n{Run(None, out, err, timeout)}")
    return Run(proc.returncode, out, err, time.monotonic() - started)


def hvdrun(args: list[str], timeout: float = 120, env=None, netns: str | None = None) -> Run:
    started = time.monotonic()
    return finish(spawn(["hvdrun", *args], env, netns), timeout, started)


def rank_lines(out: str, rank) -> list[str]:
    tag = f"[{rank}]<stdout>:"
    return [line[len(tag):] for line in out.splitlines() if line.startswith(tag)]


def rank_reports(run: Run, n: int) -> list[dict]:
    """Each rank's one JSON line of stdout, by rank (a rank with none or several fails)."""
    reports = []
    for r in range(n):
        lines = rank_lines(run.out, r)
        assert len(lines) == 1, (r, run)
        reports.append(json.loads(lines[0]))
    return reports
