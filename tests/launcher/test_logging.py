"""Log levels (HOROVOD_LOG_LEVEL, hvdrun --log-level) for the engine's C++ lines and
the hvd_torch Python logger, HOROVOD_LOG_HIDE_TIME, and hvdrun --output-filename's
per-rank files, on real 2- and 3-rank jobs."""

import os
import re
import sys
import textwrap
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
from hvdrun_job import run_hvdrun  # noqa: E402

# Each rank: init, one allreduce checked against its expected sum, shutdown.
# STALL_RANK (if set) submits its allreduce 3 s late, so rank 0's stall check fires.
RANK_SCRIPT = textwrap.dedent("""
    import os, sys, time
    import torch
    import hvd_torch as hvd
    hvd.init()
    if str(hvd.rank()) == os.environ.get("STALL_RANK"):
        time.sleep(3)
    out = hvd.allreduce(torch.ones(3) * (hvd.rank() + 1), op=hvd.Sum, name="logged")
    n = hvd.size()
    assert torch.equal(out, torch.full((3,), n * (n + 1) / 2.0)), out
    print(f"rank {hvd.rank()} sum {out[0].item():g}", flush=True)
    print(f"rank {hvd.rank()} says hello on stderr", file=sys.stderr, flush=True)
    hvd.shutdown()
""")
STAMP = r"\d{4}-\d\d-\d\d \d\d:\d\d:\d\d\.\d{6}"


def _env(**extra):
    env = {k: v for k, v in os.environ.items() if not k.startswith("HOROVOD_LOG")}
    env.update(PYTHONPATH=str(ROOT), **extra)
    return env


def _job(np, *flags, env=None, timeout=90):
    code, out, err = run_hvdrun(["-np", str(np), *flags, sys.executable, "-c", RANK_SCRIPT],
                                env=env or _env(), cwd=ROOT, timeout=timeout)
    assert code == 0, out + err
    n = np * (np + 1) // 2
    for rank in range(np):
        assert f"[{rank}]<stdout>:rank {rank} sum {n}" in out, out
    return out, err


def test_default_level_is_warning_and_quiet():
    _, err = _job(2)
    assert not re.search(r"\[(\S+: )?[TDI] \S+\.(cc|py):\d+\]", err), err


def test_debug_level_shows_engine_and_python_lines_without_time():
    _, err = _job(2, "--log-level", "DEBUG", "--log-without-timestamp")
    for rank in (0, 1):
        # The engine's C++ line and the hvd_torch logger's lines, one format.
        assert re.search(rf"\[{rank}\]<stderr>:\[D engine\.cc:\d+\] rank {rank} of 2: engine "
                         r"connected", err), err
        assert re.search(rf"\[{rank}\]<stderr>:\[I basics\.py:\d+\] rank {rank} of 2 "
                         r"initialised \(local rank \d of 2, host 0 of 1\)", err), err
        assert re.search(rf"\[{rank}\]<stderr>:\[D basics\.py:\d+\] rank {rank}: shutting down",
                         err), err
    assert "[T engine.cc" not in err, err  # trace is below debug


def test_trace_level_through_the_environment_with_time():
    _, err = _job(2, env=_env(HOROVOD_LOG_LEVEL="trace"))
    # Every rank runs the one response of the allreduce named 'logged'.
    for rank in (0, 1):
        assert re.search(rf"\[{rank}\]<stderr>:\[{STAMP}: T engine\.cc:\d+\] rank {rank}: run 1 "
                         r"op\(s\) of process set 0, first 'logged'", err), err


@pytest.mark.parametrize("level,shown", [("warning", True), ("error", False)])
def test_stall_warning_follows_the_level(level, shown):
    env = _env(STALL_RANK="1", HOROVOD_STALL_CHECK_TIME_SECONDS="1")
    _, err = _job(2, "--log-level", level, env=env)
    stall = re.search(rf"\[0\]<stderr>:\[{STAMP}: W engine\.cc:\d+\] stall: ranks are waiting "
                      r"for collectives other ranks have not submitted "
                      r"\(HOROVOD_STALL_CHECK_TIME_SECONDS=1\):", err)
    assert bool(stall) == shown, err
    if shown:
        assert re.search(r"'logged' waited \d+ s for ranks \[?1", err), err


def test_unknown_level_is_refused():
    code, out, err = run_hvdrun(["-np", "2", "--log-level", "loud", "true"], env=_env(),
                                cwd=ROOT, timeout=30)
    assert code == 2 and "--log-level must be one of trace, debug, info, warning, error, fatal, "\
        "got 'loud'" in err, err
    code, out, err = run_hvdrun(["-np", "1", sys.executable, "-c", RANK_SCRIPT],
                                env=_env(HOROVOD_LOG_LEVEL="loud"), cwd=ROOT, timeout=60)
    assert code != 0, out + err
    assert "ValueError" in err and "HOROVOD_LOG_LEVEL='loud': not one of debug, error, fatal, " \
        "info, trace, warning" in err, err


def test_output_filename_writes_each_ranks_streams(tmp_path):
    logs = tmp_path / "logs"
    out, err = _job(3, "--output-filename", str(logs))
    assert sorted(p.name for p in logs.iterdir()) == ["rank.0", "rank.1", "rank.2"]
    for rank in range(3):
        stdout = (logs / f"rank.{rank}" / "stdout").read_text()
        stderr = (logs / f"rank.{rank}" / "stderr").read_text()
        assert stdout == f"rank {rank} sum 6\n", stdout  # as the rank wrote it, unprefixed
        assert f"rank {rank} says hello on stderr\n" in stderr, stderr
        assert f"[{rank}]<stderr>:rank {rank} says hello on stderr" in err  # terminal too


def test_output_filename_pads_ranks_like_horovodrun(tmp_path):
    from hvdrun.output import RankFiles

    assert RankFiles(str(tmp_path / "a"), 12).path(3, "stdout").endswith("rank.03/stdout")
    assert RankFiles(str(tmp_path / "b"), 10).path(9, "stderr").endswith("rank.9/stderr")
    assert RankFiles(str(tmp_path / "c"), 101).path(7, "stdout").endswith("rank.007/stdout")


def test_output_filename_never_writes_through_a_planted_link(tmp_path):
    """A link planted in a shared output folder must not make the job overwrite the
    file it points to (issue #44): hvdrun refuses before the rank starts."""
    victim = tmp_path / "victim"
    victim.write_text("precious\n")
    logs = tmp_path / "logs"
    (logs / "rank.1").mkdir(parents=True)
    (logs / "rank.1" / "stdout").symlink_to(victim)
    code, out, err = run_hvdrun(["-np", "2", "--output-filename", str(logs), sys.executable,
                                 "-c", RANK_SCRIPT], env=_env(), cwd=ROOT, timeout=90)
    assert code != 0 and f"{logs}/rank.1/stdout is a symbolic link" in err, out + err
    assert victim.read_text() == "precious\n"
