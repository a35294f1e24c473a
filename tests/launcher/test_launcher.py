"""Starting ranks: the hvdrun launcher and the run_ranks test harness."""

import json
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

import dist_harness

RankFailure, run_ranks = dist_harness.RankFailure, dist_harness.run_ranks


# Rank processes of the harness tests below import this module to find their
# function, so it imports nothing from hvd_torch at module level: once
# hvd_torch/__init__ loads torch, that would cost every rank seconds.
@pytest.fixture(scope="module")
def launch():
    from hvdrun import launch

    return launch


def _launcher_env(**extra):
    return dict(os.environ, PYTHONPATH=str(ROOT), **extra)


def _hvdrun(*args, timeout=30, extra_env=None):
    return subprocess.run(
        [sys.executable, "-m", "hvdrun", *args],
        check=False,
        cwd=ROOT,
        env=_launcher_env(**(extra_env or {})),
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"  # a zombie is dead
    except FileNotFoundError:
        return False


def _wait_dead(pids, within: float) -> list[int]:
    deadline = time.monotonic() + within
    while time.monotonic() < deadline:
        alive = [p for p in pids if _alive(p)]
        if not alive:
            return []
        time.sleep(0.05)
    return [p for p in pids if _alive(p)]


# ---------------------------------------------------------------- hvdrun


def test_ranks_get_env_and_prefixed_output():
    child = textwrap.dedent(
        """
        import json, os, sys
        keys = [k for k in os.environ if k.startswith("HOROVOD_")] + ["PYTHONUNBUFFERED"]
        print(json.dumps({k: os.environ[k] for k in keys}))
        print("to stderr", os.environ["HOROVOD_RANK"], file=sys.stderr)
        """
    )
    run = _hvdrun("-np", "3", sys.executable, "-c", child)
    assert run.returncode == 0, run.stderr
    envs = {}
    for line in run.stdout.splitlines():
        prefix, _, rest = line.partition("<stdout>:")
        envs[int(prefix.strip("[]"))] = json.loads(rest)
    assert sorted(envs) == [0, 1, 2]
    secrets = {e["HOROVOD_SECRET_KEY"] for e in envs.values()}
    ports = {e["HOROVOD_GLOO_RENDEZVOUS_PORT"] for e in envs.values()}
    assert len(secrets) == 1 and len(next(iter(secrets))) == 64
    assert len(ports) == 1
    for rank, env in envs.items():
        assert env["HOROVOD_RANK"] == env["HOROVOD_LOCAL_RANK"] == str(rank)
        assert env["HOROVOD_SIZE"] == env["HOROVOD_LOCAL_SIZE"] == "3"
        assert env["HOROVOD_CROSS_RANK"] == "0" and env["HOROVOD_CROSS_SIZE"] == "1"
        assert env["HOROVOD_GLOO_RENDEZVOUS_ADDR"] == "127.0.0.1"
        assert env["HOROVOD_CONTROLLER"] == env["HOROVOD_CPU_OPERATIONS"] == "gloo"
        assert env["HOROVOD_HOSTNAME"]
        assert env["PYTHONUNBUFFERED"] == "1"
        assert "HOROVOD_GLOO_TIMEOUT_SECONDS" not in env
        assert "HOROVOD_START_TIMEOUT" not in env
    assert sorted(run.stderr.splitlines()) == [f"[{r}]<stderr>:to stderr {r}" for r in range(3)]


def test_sigterm_to_launcher_is_forwarded(tmp_path):
    # Written under another name, then renamed: the test waits for the file to exist,
    # and must never read it half-written (an empty pid failed once in CI).
    child = (
        f"import os, time; p = r'{tmp_path}/r' + os.environ['HOROVOD_RANK']; "
        "open(p + '.tmp', 'w').write(str(os.getpid())); os.replace(p + '.tmp', p); "
        "time.sleep(60)"
    )
    proc = subprocess.Popen(
        [sys.executable, "-m", "hvdrun", "-np", "2", sys.executable, "-c", child],
        cwd=ROOT, env=_launcher_env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    try:
        deadline = time.monotonic() + 20
        while not all((tmp_path / f"r{r}").exists() for r in range(2)):
            assert time.monotonic() < deadline, "ranks never started"
            time.sleep(0.05)
        pids = [int((tmp_path / f"r{r}").read_text()) for r in range(2)]
        proc.send_signal(signal.SIGTERM)
        _, err = proc.communicate(timeout=10)
    finally:
        proc.kill()
        proc.wait()
    assert proc.returncode == 128 + signal.SIGTERM, err
    assert "SIGTERM" in err
    assert _wait_dead(pids, within=5) == []


# The tests below call launch.main() in-process (it reads sys.stdout per line, so
# capsys sees the ranks' output): a launcher interpreter per test costs seconds
# once hvd_torch's __init__ imports torch.


def test_options_reach_ranks(monkeypatch, capsys, launch):
    child = (
        "import os; e = os.environ; "
        "print(e['HOROVOD_START_TIMEOUT'], e['HOROVOD_GLOO_TIMEOUT_SECONDS'])"
    )
    monkeypatch.setenv("HOROVOD_GLOO_TIMEOUT_SECONDS", "17")
    code = launch.main(
        ["--gloo", "-H", "localhost:2", "--start-timeout", "45", "--verbose",
         "--num-proc=2", sys.executable, "-c", child]
    )  # fmt: skip
    out, err = capsys.readouterr()
    assert code == 0, err
    assert sorted(out.splitlines()) == ["[0]<stdout>:45 17", "[1]<stdout>:45 17"]
    assert "store listening on 127.0.0.1:" in err
    assert err.count(f"{sys.executable} -c") == 2


def test_failing_rank_stops_the_others(tmp_path, capsys, launch):
    # Rank 0 starts a grandchild; rank 1 fails; ranks 0 and 2 would sleep for a minute.
    child = textwrap.dedent(
        f"""
        import os, subprocess, sys, time
        rank = int(os.environ["HOROVOD_RANK"])
        if rank == 0:
            g = subprocess.Popen(["sleep", "60"])
            open(r"{tmp_path}/grandchild", "w").write(str(g.pid))
        open(r"{tmp_path}/rank%d" % rank, "w").write(str(os.getpid()))
        if rank == 1:
            time.sleep(0.5)
            print("rank 1 giving up", flush=True)
            sys.exit(7)
        time.sleep(60)
        """
    )
    start = time.monotonic()
    code = launch.main(["-np", "3", sys.executable, "-c", child])
    assert time.monotonic() - start < 15
    out, err = capsys.readouterr()
    assert code == 7, err
    assert "[1]<stdout>:rank 1 giving up" in out
    summary = err.strip().splitlines()[-1]
    assert "rank 1 exited with code 7" in summary
    pids = [int((tmp_path / name).read_text()) for name in ("rank0", "rank2", "grandchild")]
    assert _wait_dead(pids, within=5) == []


def test_rank_killed_by_signal_gives_128_plus_signal(capsys, launch):
    child = (
        "import os, signal\n"
        "if os.environ['HOROVOD_RANK'] == '1': os.kill(os.getpid(), signal.SIGKILL)"
    )
    assert launch.main(["-np", "2", sys.executable, "-c", child]) == 128 + signal.SIGKILL
    assert "rank 1 was killed by signal 9 (SIGKILL)" in capsys.readouterr().err


def test_command_not_found(capsys, launch):
    assert launch.main(["-np", "2", "/nonexistent/command"]) == 127
    assert "cannot start rank 0" in capsys.readouterr().err


@pytest.mark.parametrize(
    "flags",
    [
        ["--mpi"], ["--blacklist-cooldown-range", "10", "100"],
        ["--tcp"], ["--prefix-output-with-timestamp"], ["--cycle-time-ms", "5"],
        ["--config-file", "c.yaml"],
        ["--jsm"], ["--mpi-args=-x FOO"], ["--disable-cache"], ["--fusion-threshold-mb", "32"],
    ],
)  # fmt: skip
def test_unsupported_flags_are_refused(flags, capsys, launch):
    assert launch.main(["-np", "2", *flags, "python", "x.py"]) == 2
    err = capsys.readouterr().err
    assert f"{flags[0].partition('=')[0]} is not supported yet" in err


@pytest.mark.parametrize(
    "argv, message",
    [
        (["python", "x.py"], "-np/--num-proc is required"),
        (["-np", "2"], "no command"),
        (["-np", "0", "python"], "positive integer"),
        (["-np", "two", "python"], "positive integer"),
        (["-np"], "-np needs a value"),
        (["-np", "2", "--bogus", "python"], "unknown option --bogus"),
        (["-np", "2", "-H", "node7:1,node7:1", "python"], "host 'node7' is listed twice"),
        (["-np", "2", "-H", "localhost:2", "--hostfile", "h", "python"], "not both"),
        (["-np", "2", "--hostfile", "/nonexistent/h", "python"], "--hostfile /nonexistent/h"),
        (["-np", "2", "--network-interface", "eth0,eth1", "python"], "give one interface"),
        (["-np", "2", "--ssh-port", "x", "python"], "--ssh-port must be"),
        (["-np", "2", "--nnodes", "2", "python"], "per-node mode (--nnodes, ...) takes no -np"),
        (["-np", "4", "-H", "localhost:2", "python"], "needs 4 slots"),
        (["-np", "2", "--start-timeout", "-1", "python"], "--start-timeout must be"),
    ],
)
def test_usage_errors(argv, message, capsys, launch):
    assert launch.main(argv) == 2
    assert message in capsys.readouterr().err


def test_parse_args_keeps_command_flags(launch):
    opts = launch.parse_args(
        ["-np", "2", "-H", "127.0.0.1:1,localhost:1", "python", "train.py", "--mpi", "-np", "9"]
    )
    assert opts.num_proc == 2
    assert opts.command == ["python", "train.py", "--mpi", "-np", "9"]
    assert launch.parse_args(["-np", "1", "--", "-weird-command"]).command == ["-weird-command"]
    assert launch.parse_args(["--help"]) is None


# ---------------------------------------------------------------- dist_harness
# The functions below run inside rank processes; they use only the store client.


def _store():
    from hvdrun.store import KVStoreClient, secret_from_hex

    return KVStoreClient(
        os.environ["HOROVOD_GLOO_RENDEZVOUS_ADDR"],
        int(os.environ["HOROVOD_GLOO_RENDEZVOUS_PORT"]),
        secret_from_hex(os.environ["HOROVOD_SECRET_KEY"]),
    )


def _rendezvous(tag):
    rank, size = int(os.environ["HOROVOD_RANK"]), int(os.environ["HOROVOD_SIZE"])
    with _store() as store:
        store.set(f"rank/{rank}", str(rank * rank))
        missing = store.wait([f"rank/{r}" for r in range(size)], timeout=20)
        assert missing == [], missing
        squares = [int(store.get(f"rank/{r}")) for r in range(size)]
    return {
        "rank": rank,
        "size": size,
        "tag": tag,
        "squares": squares,
        "env": os.environ.get("EXTRA"),
    }


def _raise_while_peer_waits():
    # Rank 1 raises; rank 0 waits for it for a minute, as a real collective would.
    if os.environ["HOROVOD_RANK"] == "1":
        raise ValueError("rank 1 refuses")
    with _store() as store:
        store.wait(["never"], timeout=60)


def _exit_3_on_rank_0():
    if os.environ["HOROVOD_RANK"] == "0":
        print("about to exit", flush=True)
        os._exit(3)
    return "fine"


def _all_raise():
    raise RuntimeError(f"bad shape on rank {os.environ['HOROVOD_RANK']}")


def _hang_on_rank_1():
    if os.environ["HOROVOD_RANK"] == "1":
        print("hanging", flush=True)
        time.sleep(600)
    return "fine"


@pytest.mark.parametrize("nranks", [1, 2, 3])
def test_harness_runs_ranks(nranks):
    results = run_ranks(_rendezvous, nranks, args=("t",), env={"EXTRA": "x"}, timeout=60)
    squares = [r * r for r in range(nranks)]
    assert results == [
        {"rank": r, "size": nranks, "tag": "t", "squares": squares, "env": "x"}
        for r in range(nranks)
    ]


def test_harness_reports_raising_rank_and_stops_its_peer(monkeypatch):
    monkeypatch.setattr(dist_harness, "_FAILURE_GRACE", 1.0)
    start = time.monotonic()
    with pytest.raises(AssertionError) as info:
        run_ranks(_raise_while_peer_waits, 2, timeout=60)
    assert time.monotonic() - start < 30  # the peer is killed after a grace, not at timeout
    text = str(info.value)
    assert "2 of 2 ranks failed" in text
    assert "rank 1: ValueError: rank 1 refuses (exit code 1)" in text
    assert "Traceback" in text and "_raise_while_peer_waits" in text
    assert "rank 0: RankKilled: killed by the harness; fn was still running" in text


def test_harness_reports_crashed_rank():
    with pytest.raises(AssertionError) as info:
        run_ranks(_exit_3_on_rank_0, 2, timeout=60)
    text = str(info.value)
    assert "1 of 2 ranks failed" in text
    assert "rank 0: RankDied: exited before returning (exit code 3)" in text
    assert "about to exit" in text


def test_harness_expect_fail_returns_outcomes():
    outcomes = run_ranks(_all_raise, 2, timeout=60, expect_fail=True)
    assert all(isinstance(o, RankFailure) for o in outcomes)
    assert [o.exc_type for o in outcomes] == ["RuntimeError", "RuntimeError"]
    assert [o.message for o in outcomes] == ["bad shape on rank 0", "bad shape on rank 1"]
    assert all(o.exitcode == 1 and "Traceback" in o.traceback for o in outcomes)


def test_harness_timeout_kills_hung_rank():
    start = time.monotonic()
    with pytest.raises(TimeoutError) as info:
        run_ranks(_hang_on_rank_1, 2, timeout=5)
    assert time.monotonic() - start < 15
    error, text = info.value, str(info.value)
    assert "hanging" in text
    # Rank 0 returns at once, unless a loaded machine kept it importing past the
    # timeout; either way the report must say so.
    if error.running == [1]:
        assert "ranks [1] were still running" in text and "rank 0: returned 'fine'" in text
    else:
        assert error.running == [0, 1] and "ranks [0, 1] were still running" in text


def test_harness_refuses_unimportable_functions():
    with pytest.raises(ValueError, match="module-level"):
        run_ranks(lambda: 1, 1)


def test_the_old_entry_still_runs_hvdrun():
    # `python -m hvd_torch.runner`, the launcher's old home, for scripts that use it.
    proc = subprocess.run([sys.executable, "-m", "hvd_torch.runner", "--help"], check=False,
                          cwd=ROOT, env=_launcher_env(), capture_output=True, text=True,
                          timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert "-np" in proc.stdout and "hvdrun" in proc.stdout, proc.stdout
