"""Run a function on N rank processes: the fixture every multi-rank test uses.

    from dist_harness import run_ranks        # tests/harness is on sys.path (conftest)

    def _allreduce_ones(n):                   # module level, so a child can import it
        import hvd_torch as hvd
        hvd.init()
        ...
        return result

    def test_allreduce():
        assert run_ranks(_allreduce_ones, 3, args=(8,)) == [expected] * 3

Each rank is a warm worker of a rank pool (tests/harness/rank_pool.py: it imported torch
and hvd_torch once and runs one test after another, each init()..shutdown()) or,
with fresh=True or an import-time variable in env, a new interpreter.  Either way
it runs with the rank environment from hvdrun.env against a store
served in the test process, in its own process group.  fn and its arguments travel by
pickle, so fn is found by module and name; the child gets the test process's
sys.path so it imports fn's module the way pytest did.

Results come back through one file per rank, written only after fn returns, so
"returned", "raised" and "died" are told apart.  Every rank's output is captured
to a file and echoed after the run (pytest shows it for a failing test); a
failure report carries the tail of the failing rank's output.

This file is also the child's entry point: `python dist_harness.py JOB RESULT`.
It imports nothing from hvd_torch at module level, so a child pays only for what
fn imports.
"""

from __future__ import annotations

import dataclasses
import os
import pickle
import shutil
import signal
import subprocess
import sys
import tempfile
import time

import rank_pool

__all__ = ["RankFailure", "attempt", "launch_once", "leaked_shm_segments", "rank_env",
           "run_ranks", "shm_segments"]

# After one rank fails (and expect_fail is off) the others get this long to
# finish before being killed: they are usually stuck waiting for the dead rank.
_FAILURE_GRACE = 5.0
_OUTPUT_TAIL_LINES = 30


@dataclasses.dataclass
class RankFailure:
    """What one rank did instead of returning."""

    rank: int
    exc_type: str  # the exception's class name, or "RankDied" / "RankKilled"
    message: str
    traceback: str  # "" when the rank never reached fn's result
    exitcode: int | None  # negative: killed by that signal; None: never exited
    output: str = ""  # the tail of the rank's stdout and stderr

    def __str__(self) -> str:
        text = f"rank {self.rank}: {self.exc_type}: {self.message} (exit code {self.exitcode})"
        if self.traceback:
            text += "\n" + self.traceback.rstrip()
        if self.output:
            text += "\n  output tail:\n" + _indent(self.output.rstrip())
        return text


def attempt(fn):
    """(exception class name or None, message, seconds) of calling fn: how a rank
    reports a call that should raise, for the test process to inspect."""
    start = time.monotonic()
    try:
        fn()
        return None, "", time.monotonic() - start
    except Exception as e:  # noqa: BLE001  (the test inspects it)
        return type(e).__name__, str(e), time.monotonic() - start


def init_refusal():
    """A rank function: what hvd.init() raised on this rank ("Class: message"), or
    None after a clean init and shutdown (a setting init must refuse, by name)."""
    import hvd_torch as hvd

    try:
        hvd.init()
    except Exception as e:  # noqa: BLE001  (the message is the point)
        return f"{type(e).__name__}: {e}"
    hvd.shutdown()
    return None


def shm_segments() -> set[str]:
    """hvd-torch's names in /dev/shm now."""
    return {f for f in os.listdir("/dev/shm") if f.startswith("hvd_torch.")}


def leaked_shm_segments(before: set[str], settle: float = 10.0) -> list[str]:
    """The names new since `before` that are still there after up to `settle` seconds.

    A name lives only while a set is being set up (csrc/core/shm_segment.h), so one
    that stays is a leak; one that goes was another test's set-up running beside
    this one under xdist, which a plain before/after comparison took for a leak."""
    new = shm_segments() - before
    deadline = time.monotonic() + settle
    while new and time.monotonic() < deadline:
        time.sleep(0.02)
        new &= shm_segments()
    return sorted(new)


def rank_env(rank: int, size: int, store, base=None) -> dict[str, str]:
    """The environment for one rank talking to a started KVStoreServer `store`."""
    from hvdrun.env import rank_env as runner_rank_env

    return runner_rank_env(rank, size, store.host, store.port, store.secret, base=base)


def run_ranks(fn, nranks, args=(), kwargs=None, timeout=60, env=None, expect_fail=False,
              fresh=False):
    """Runs fn(*args, **kwargs) on nranks rank processes and returns the results
    in rank order.

    The ranks are warm workers of a rank pool (tests/harness/rank_pool.py) unless fresh
    is set or env sets a variable read at import: a test that needs new
    processes (a kill it expects to see in the exit code, a custom launcher)
    says fresh=True.  Either way each rank runs with its own rank environment
    against a store served here.
    env: extra variables for every rank, applied after the rank environment.
    If a rank raises or dies, raises AssertionError describing every rank (ranks
    still running _FAILURE_GRACE seconds after the first failure are killed and
    reported too).  With expect_fail=True, every rank runs to its end and per-rank
    outcomes are returned instead: fn's value, or a RankFailure.  If ranks are
    still running after timeout seconds, kills all of them and raises
    TimeoutError naming them (also in its .running; .outcomes has every rank's).
    """
    from hvdrun.store import KVStoreServer

    _check_importable(fn)
    name = f"{fn.__module__}.{fn.__qualname__}"
    workdir = tempfile.mkdtemp(prefix="hvd-ranks-")
    job = os.path.join(workdir, "job.pkl")
    logs = [_log_path(workdir, rank) for rank in range(nranks)]
    results = [_result_path(workdir, rank) for rank in range(nranks)]
    pooled = not fresh and rank_pool.poolable(env)
    try:
        with KVStoreServer("127.0.0.1", 0) as store:
            envs = []
            for rank in range(nranks):
                rank_vars = rank_env(rank, nranks, store)
                rank_vars.update(env or {})
                envs.append(rank_vars)
            with open(job, "wb") as f:
                # Separate pickles: the child must extend sys.path before it can unpickle fn.
                pickle.dump([p for p in sys.path if p], f)
                pickle.dump(envs, f)
                pickle.dump((fn, tuple(args), dict(kwargs or {})), f)
            if pooled:
                codes, killed, timed_out = rank_pool.get_pool(nranks).run(
                    job, results, logs, timeout, stop_on_failure=not expect_fail)
            else:
                codes, killed, timed_out = _run_fresh(job, envs, results, logs, timeout,
                                                      stop_on_failure=not expect_fail)
        outcomes = [
            _outcome(workdir, rank, codes[rank], rank in killed) for rank in range(nranks)
        ]
        _echo_output(workdir, nranks)
        if timed_out:
            error = TimeoutError(_timeout_report(name, timeout, killed, outcomes))
            error.running, error.outcomes = killed, outcomes  # for tests that inspect them
            raise error
        if expect_fail:
            return outcomes
        failures = [o for o in outcomes if isinstance(o, RankFailure)]
        if failures:
            raise AssertionError(_failure_report(name, nranks, failures))
        return outcomes
    finally:
        shutil.rmtree(workdir, ignore_errors=True)


# ---------------------------------------------------------------- parent side


def _check_importable(fn) -> None:
    qualname = getattr(fn, "__qualname__", "")
    module = getattr(fn, "__module__", None)
    if not callable(fn) or "<" in qualname or module in (None, "__main__"):
        raise ValueError(
            f"run_ranks needs a module-level function that a fresh interpreter can "
            f"import; got {fn!r} (module {module!r}, name {qualname!r})"
        )


def _run_fresh(job, envs, results, logs, timeout, stop_on_failure):
    """Runs the job on new processes, one per rank; returns (exit codes, ranks
    killed by us, whether that was the timeout)."""
    procs: list[subprocess.Popen] = []
    try:
        for rank, rank_vars in enumerate(envs):
            with open(logs[rank], "wb") as log:
                procs.append(
                    subprocess.Popen(
                        [sys.executable, os.path.abspath(__file__), job, results[rank]],
                        env=rank_vars,
                        stdin=subprocess.DEVNULL,
                        stdout=log,
                        stderr=subprocess.STDOUT,
                        start_new_session=True,  # so killpg reaches fn's children too
                    )
                )
        killed, timed_out = _wait(procs, timeout, stop_on_failure)
        return [p.returncode for p in procs], killed, timed_out
    finally:
        # Also reached on KeyboardInterrupt and on a failed start: nothing outlives us.
        _kill(procs)


def _wait(procs, timeout: float, stop_on_failure: bool) -> tuple[list[int], bool]:
    """Waits for every rank.  Returns (ranks killed by us, whether that was the
    timeout).  With stop_on_failure, once a rank fails the others get a grace
    period and are then killed: they count as failed, not as timed out."""
    deadline = time.monotonic() + timeout
    after_failure = False
    while True:
        codes = [p.poll() for p in procs]
        running = [r for r, c in enumerate(codes) if c is None]
        if not running:
            return [], False
        if stop_on_failure and not after_failure and any(c not in (None, 0) for c in codes):
            after_failure = True
            deadline = min(deadline, time.monotonic() + _FAILURE_GRACE)
        if time.monotonic() >= deadline:
            _kill(procs)
            return running, not after_failure
        time.sleep(0.02)


def _kill(procs) -> None:
    for proc in procs:
        if proc.poll() is None:
            try:
                os.killpg(proc.pid, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                pass
    for proc in procs:
        proc.wait()


def _outcome(workdir: str, rank: int, exitcode: int, killed_by_us: bool):
    output = _tail(_log_path(workdir, rank))
    try:
        with open(_result_path(workdir, rank), "rb") as f:
            result = pickle.load(f)
    except FileNotFoundError:
        result = None
    except Exception as e:  # noqa: BLE001 (e.g. the value's class cannot be imported here)
        return RankFailure(
            rank, type(e).__name__, f"cannot unpickle the result: {e}", "", exitcode, output
        )
    if killed_by_us:
        state = "had returned" if result and result[0] == "ok" else "was still running"
        return RankFailure(
            rank, "RankKilled", f"killed by the harness; fn {state}", "", exitcode, output
        )
    if result is None:
        if exitcode is not None and exitcode < 0:
            kind, what = "RankKilled", f"killed by signal {-exitcode} ({_signal_name(-exitcode)})"
        else:
            kind, what = "RankDied", "exited before returning"
        return RankFailure(rank, kind, what, "", exitcode, output)
    if result[0] == "ok":
        if exitcode == 0:
            return result[1]
        return RankFailure(
            rank, "RankDied", f"returned, then exited with code {exitcode}", "", exitcode, output
        )
    _, exc_type, message, tb = result
    return RankFailure(rank, exc_type, message, tb, exitcode, output)


def _failure_report(name: str, nranks: int, failures: list[RankFailure]) -> str:
    lines = [f"{len(failures)} of {nranks} ranks failed running {name}:"]
    lines += [f"--- {f}" for f in failures]
    return "\n".join(lines)


def _timeout_report(name: str, timeout: float, stuck: list[int], outcomes) -> str:
    lines = [f"ranks {stuck} were still running {name} after {timeout:g}s and were killed"]
    for rank, outcome in enumerate(outcomes):
        if rank in stuck:
            lines.append(f"--- rank {rank} ({outcome.message}); output tail:")
            lines.append(_indent(outcome.output.rstrip()))
        elif isinstance(outcome, RankFailure):
            lines.append(f"--- {outcome}")
        else:
            lines.append(f"--- rank {rank}: returned {outcome!r}")
    return "\n".join(lines)


def _echo_output(workdir: str, nranks: int) -> None:
    for rank in range(nranks):
        try:
            with open(_log_path(workdir, rank), "rb") as f:
                text = f.read().decode("utf-8", errors="replace")
        except FileNotFoundError:
            continue
        for line in text.splitlines():
            sys.stdout.write(f"[{rank}] {line}\n")
    sys.stdout.flush()


def _tail(path: str) -> str:
    try:
        with open(path, "rb") as f:
            lines = f.read().decode("utf-8", errors="replace").splitlines()
    except FileNotFoundError:
        return ""
    return "\n".join(lines[-_OUTPUT_TAIL_LINES:])


def _indent(text: str) -> str:
    return "\n".join("    " + line for line in text.splitlines())


def _signal_name(signum: int) -> str:
    try:
        return signal.Signals(signum).name
    except ValueError:
        return "unknown signal"


def _log_path(workdir: str, rank: int) -> str:
    return os.path.join(workdir, f"rank{rank}.log")


def _result_path(workdir: str, rank: int) -> str:
    return os.path.join(workdir, f"rank{rank}.result")


# ---------------------------------------------------------------- child side


def _child_main(job: str, result_path: str) -> int:
    code = rank_pool.run_job(job, result_path)
    sys.stdout.flush()
    sys.stderr.flush()
    return code


if __name__ == "__main__":
    sys.exit(_child_main(sys.argv[1], sys.argv[2]))


_LAUNCHES = {}


def launch_once(fn, nranks, **kwargs):
    """run_ranks(fn, nranks, **kwargs) once per (fn, nranks) in this test process.

    A test module checks many things inside one launch per rank count and
    shares its results between its tests; a failed launch fails each of them.
    """
    key = (fn.__module__, fn.__qualname__, nranks)
    if key not in _LAUNCHES:
        try:
            _LAUNCHES[key] = run_ranks(fn, nranks, **kwargs)
        except (AssertionError, TimeoutError) as e:
            _LAUNCHES[key] = e
    if isinstance(_LAUNCHES[key], Exception):
        raise _LAUNCHES[key]
    return _LAUNCHES[key]
