"""Warm rank pools: N worker processes that run many multi-rank test functions in turn.

A fresh rank costs an interpreter start and an `import torch` (seconds on two
cores); most multi-rank tests run for less than that.  A pool keeps N workers
alive for the whole pytest session.  Each job is one test function: the worker
takes the rank environment of that job (against the test's own store), runs
fn, then shuts hvd_torch down and puts the process back as it found it
(environment, working directory, signal handlers, torch defaults).  So every
pooled test is also a test that `init()` ... `shutdown()` ... `init()` is clean.

    pool = get_pool(3)
    outcomes, killed, timed_out = pool.run(job_path, envs, workdir, timeout, stop_on_failure)

A job that leaves a worker dead, hung, killed or unclean (hvd_torch still
initialised, a thread still running) costs the pool: it is closed and the next
job starts fresh workers.  dist_harness.run_ranks decides what goes to a pool.

Workers are forked from a fork server (multiprocessing's "forkserver") that
imported torch (and torch._dynamo) and hvd_torch once for this test process,
so a worker, first or replacement, starts in milliseconds instead of an
interpreter start and an `import torch` (1.5 s of CPU each, 1.1 s more for
torch._dynamo; a fresh-clone run forks 70).  The server
imports and never runs an op: no engine, no OpenMP pool, nothing a fork could
copy half-made.  A forked worker is as fresh as an exec'd one for a job: it
starts its own session (killpg reaches what fn starts), and a job's variables
replace its whole environment.
"""

from __future__ import annotations

import atexit
import multiprocessing
import multiprocessing.connection
import os
import pickle
import signal
import sys
import threading
import time
import traceback

# Variables that hvd_torch or the engine read once per process (at import or on
# first use), not at init(): a job that sets one needs fresh processes.
#   HOROVOD_LOG_LEVEL, HOROVOD_LOG_HIDE_TIME: the engine's logger (csrc/core/log.cc)
#   HVD_TORCH_OUTPUT_CACHE_MB: the host output pool's cap (csrc/torch/host_output.cc)
#   HVD_TORCH_GPU_TESTS_ON: read when a GPU test module is imported
IMPORT_TIME_VARS = frozenset(
    {"HOROVOD_LOG_LEVEL", "HOROVOD_LOG_HIDE_TIME", "HVD_TORCH_OUTPUT_CACHE_MB",
     "HVD_TORCH_GPU_TESTS_ON"})

_POOLS: dict[int, "RankPool"] = {}
# How many jobs pools have run and how many pools were started, for the pool's
# own tests and the session summary.
stats = {"jobs": 0, "pools_started": 0}


def poolable(env) -> bool:
    """Whether a job with these extra variables can run on warm workers."""
    if os.environ.get("HVD_TORCH_TEST_POOL", "1") == "0":
        return False
    return not (set(env or {}) & IMPORT_TIME_VARS)


def get_pool(nranks: int) -> "RankPool":
    pool = _POOLS.get(nranks)
    if pool is None or not pool.alive():
        if pool is not None:
            pool.close()
        pool = _POOLS[nranks] = RankPool(nranks)
    return pool


def close_all() -> None:
    for pool in list(_POOLS.values()):
        pool.close()
    _POOLS.clear()


atexit.register(close_all)


# How long new workers may take to start (the fork server's imports, the
# first time, on a loaded machine).
_START_TIMEOUT = 180.0
# What the fork server imports once: what every worker would import first.
# torch._dynamo: torch imports it (1.1 s of CPU) the first time a process
# builds an optimizer (torch._disable_dynamo wraps Optimizer methods), which
# most training jobs do. pytest and dist_harness: every test module that a
# job's function comes from imports them (0.2 s).
_PRELOAD = ["torch", "torch._dynamo", "hvd_torch", "pytest", "dist_harness", "rank_pool"]
# The environment the fork server starts with: the session's, not that of the
# test that happens to start the first pool (it may have set variables that
# torch or hvd_torch read at import).
_SESSION_ENVIRON = dict(os.environ)


def _fork_context():
    from multiprocessing import forkserver

    context = multiprocessing.get_context("forkserver")
    context.set_forkserver_preload(_PRELOAD)
    # Only what differs is swapped (usually nothing): other threads of this
    # process (a Ray driver's) may read the environment meanwhile.
    changed = {k: os.environ.get(k) for k in set(os.environ) | set(_SESSION_ENVIRON)
               if os.environ.get(k) != _SESSION_ENVIRON.get(k)}
    _set_environ({k: _SESSION_ENVIRON.get(k) for k in changed})
    try:
        forkserver.ensure_running()  # a no-op while it runs
    finally:
        _set_environ(changed)
    return context


def _set_environ(values: dict) -> None:
    """Sets each variable to its value, or unsets it where the value is None."""
    for key, value in values.items():
        if value is None:
            os.environ.pop(key, None)
        else:
            os.environ[key] = value


class RankPool:
    """N workers, one per rank, each in its own session (so killpg reaches
    anything fn started).  Used from the test process's main thread only.

    The constructor returns once every worker is ready, so a job's timeout
    counts the job's time only."""

    def __init__(self, nranks: int):
        self.nranks = nranks
        self.procs = []
        self.conns = []
        context = _fork_context()
        for rank in range(nranks):
            ours, theirs = context.Pipe()
            proc = context.Process(target=_worker_main, args=(rank, theirs),
                                   name=f"hvd-rank-pool-{rank}")
            proc.start()
            theirs.close()
            self.procs.append(proc)
            self.conns.append(ours)
        stats["pools_started"] += 1
        _log_record({"pool_started": nranks})
        self._wait_ready()

    def _wait_ready(self) -> None:
        deadline = time.monotonic() + _START_TIMEOUT
        waiting = dict(zip(self.conns, self.procs))
        died = False
        while waiting and not died:
            left = deadline - time.monotonic()
            if left <= 0:
                break
            # A worker's only message is "ready"; its death closes its pipe.
            for conn in multiprocessing.connection.wait(list(waiting), left):
                try:
                    conn.recv()
                    del waiting[conn]
                except EOFError:
                    died = True
        if waiting:
            codes = [p.exitcode for p in waiting.values()]
            self.close()
            raise RuntimeError(f"rank pool of {self.nranks}: worker(s) not ready within "
                               f"{_START_TIMEOUT:g}s or dead while starting (exit codes {codes})")

    def alive(self) -> bool:
        return all(p.exitcode is None for p in self.procs)

    def run(self, job: str, result_paths, log_paths, timeout: float, stop_on_failure: bool):
        """Sends one job to every worker and waits for each to finish it.

        Returns (exit codes, ranks killed by us, whether that was the timeout):
        a worker still alive reports 0 or 1 as a fresh rank would have exited.
        The pool closes itself when a job leaves it unfit for the next one."""
        stats["jobs"] += 1
        for rank, conn in enumerate(self.conns):
            try:
                conn.send((job, result_paths[rank], log_paths[rank]))
            except (BrokenPipeError, OSError):
                pass  # it died between jobs: seen below as a dead worker
        ready = [p + ".ready" for p in result_paths]
        deadline = time.monotonic() + timeout
        after_failure = False
        while True:
            codes = [self._code(rank, ready[rank]) for rank in range(self.nranks)]
            running = [r for r, c in enumerate(codes) if c is None]
            if not running:
                break
            failed = any(c not in (None, 0) for c in codes)
            if stop_on_failure and not after_failure and failed:
                after_failure = True
                deadline = min(deadline, time.monotonic() + _failure_grace())
            if time.monotonic() >= deadline:
                _log_close(self.nranks, codes, [])
                self.close()
                codes = [p.exitcode if r in running else codes[r]
                         for r, p in enumerate(self.procs)]
                return codes, running, not after_failure
            time.sleep(0.005)
        if not self.alive() or not all(_clean(r) for r in ready):
            _log_close(self.nranks, codes, ready)
            self.close()
        return codes, [], False

    def _code(self, rank: int, ready: str):
        code = self.procs[rank].exitcode
        if code is not None:
            return code
        if not os.path.exists(ready):
            return None
        with open(ready) as f:
            return int(f.read().split()[0])

    def close(self) -> None:
        for proc in self.procs:
            if proc.exitcode is None:
                try:
                    os.killpg(proc.pid, signal.SIGKILL)
                except (ProcessLookupError, PermissionError):
                    proc.kill()  # killed before it started its own session
        for proc in self.procs:
            proc.join()
        for conn in self.conns:
            conn.close()
        if _POOLS.get(self.nranks) is self:
            del _POOLS[self.nranks]


def _failure_grace() -> float:
    """dist_harness's, read at each use: a test may monkeypatch it there."""
    from dist_harness import _FAILURE_GRACE

    return _FAILURE_GRACE


def _clean(ready: str) -> bool:
    with open(ready) as f:
        return f.read().split()[1] == "clean"


def _log_close(nranks: int, codes, ready) -> None:
    """Why a pool was closed: each rank's exit code and what made a worker
    unfit. A pool closed for a reason a test did not intend costs nranks new
    workers."""
    unfit = []
    for r in ready:
        if os.path.exists(r):
            with open(r) as f:
                unfit += f.read().split("\t")[1:]
    _log_record({"pool_closed": nranks, "test": os.environ.get("PYTEST_CURRENT_TEST", ""),
                 "codes": codes, "unfit": [u.strip() for u in unfit]})


def _log_record(record: dict) -> None:
    """With HVD_TEST_SCHEDULE set (tests/conftest.py), one line of the run's
    schedule file (scripts/test_schedule.py reads it)."""
    import json

    path = os.environ.get("HVD_TEST_SCHEDULE")
    if path:
        with open(path, "a") as f:
            f.write(json.dumps(record) + "\n")


# ---------------------------------------------------------------- worker side


class _Baseline:
    """What a job may change in the worker, taken once at start and put back after
    every job."""

    def __init__(self):
        import torch

        self.environ = dict(os.environ)
        self.cwd = os.getcwd()
        self.handlers = {s: signal.getsignal(s) for s in (signal.SIGINT, signal.SIGTERM,
                                                          signal.SIGUSR1, signal.SIGHUP)}
        self.threads = torch.get_num_threads()
        self.sys_path = list(sys.path)

    def restore(self) -> list[str]:
        """Puts the process back; returns what could not be (the worker is then unclean)."""
        import torch

        problems = []
        try:
            import hvd_torch

            hvd_torch.shutdown()
            if hvd_torch.is_initialized():
                problems.append("hvd_torch still initialised after shutdown()")
        except Exception as e:  # noqa: BLE001 (an unclean worker, reported, not raised)
            problems.append(f"shutdown raised {type(e).__name__}: {e}")
        os.environ.clear()
        os.environ.update(self.environ)
        os.chdir(self.cwd)
        for sig, handler in self.handlers.items():
            signal.signal(sig, handler)
        torch.set_default_dtype(torch.float32)
        torch.set_grad_enabled(True)
        torch.set_num_threads(self.threads)
        sys.path[:] = self.sys_path
        extra = [t.name for t in threading.enumerate()
                 if t is not threading.main_thread() and t.is_alive()]
        if extra:
            problems.append(f"threads still running: {extra}")
        return problems


def run_job(job: str, result_path: str, rank=None) -> int:
    """Runs one rank's part of a job and writes its outcome to result_path;
    returns the exit code a fresh rank has (0: fn returned, 1: it raised).
    A pool worker (rank given) takes its environment from the job first; a
    fresh rank (dist_harness's child) was started with it."""
    try:
        with open(job, "rb") as f:
            paths = pickle.load(f)
            sys.path[:0] = [p for p in paths if p not in sys.path]
            envs = pickle.load(f)
            if rank is not None:
                os.environ.clear()
                os.environ.update(envs[rank])
            fn, args, kwargs = pickle.load(f)
        outcome = ("ok", fn(*args, **kwargs))
        payload = pickle.dumps(outcome)
    except BaseException as e:  # noqa: BLE001 (SystemExit, KeyboardInterrupt are outcomes too)
        outcome = ("error", type(e).__name__, str(e), traceback.format_exc())
        try:
            payload = pickle.dumps(outcome)
        except Exception:  # noqa: BLE001 (an exception whose message holds unpicklables)
            payload = pickle.dumps(("error", type(e).__name__, str(e), ""))
    # Write-then-rename: the parent never reads half a result.
    tmp = result_path + ".tmp"
    with open(tmp, "wb") as f:
        f.write(payload)
    os.replace(tmp, result_path)
    return 0 if outcome[0] == "ok" else 1


def _redirect_output(path: str) -> None:
    sys.stdout.flush()
    sys.stderr.flush()
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    os.dup2(fd, 1)
    os.dup2(fd, 2)
    os.close(fd)


def _worker_main(rank: int, conn) -> None:
    """A pool worker, forked from the fork server: runs the jobs conn sends
    until the pool closes it."""
    os.setsid()  # killpg(pid) reaches this worker and anything fn starts
    import torch  # noqa: F401  (imported by the fork server already: free)
    import hvd_torch  # noqa: F401

    # torch.compile's progress bars start tqdm's monitor thread, which lives on
    # after the job and so made every compiling test's workers unfit for the next
    # (a new pool each time). The monitor only warns about slow bars: not needed here.
    try:
        import tqdm

        tqdm.tqdm.monitor_interval = 0
    except ImportError:
        pass

    baseline = _Baseline()
    conn.send("ready")
    _redirect_output(os.devnull)
    while True:
        try:
            job, result_path, log_path = conn.recv()
        except EOFError:  # the pool is gone
            return
        _redirect_output(log_path)
        code = run_job(job, result_path, rank)
        problems = baseline.restore()
        for problem in problems:
            print(f"[rank pool] worker unfit for another job: {problem}", file=sys.stderr)
        sys.stdout.flush()
        sys.stderr.flush()
        _redirect_output(os.devnull)
        tmp = result_path + ".ready.tmp"
        with open(tmp, "w") as f:
            # The status, then each problem after a tab (_log_close reads them).
            f.write(f"{code} {'unclean' if problems else 'clean'}"
                    + "".join(f"\t{p}" for p in problems) + "\n")
        os.replace(tmp, result_path + ".ready")
