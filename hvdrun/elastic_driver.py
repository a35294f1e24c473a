"""ElasticDriver: starts, replaces and regroups the workers of an elastic job.

The driver knows nothing about how a worker process is started or where: it is given
a discovery callable (() -> {host: slots}) and a launcher (start(worker_id, host, env)
-> handle with poll() and kill()).  hvdrun's elastic mode plugs in local processes
(elastic_launch.py); a Ray executor can plug in actors.  Workers and driver talk only
through the job's KVStoreServer.

Store protocol (key names in elastic_keys.py; docs/elastic.md has the sequence diagram)
---------------------------------------------------------------------------------------
Membership changes in *rounds*.  A round is a set of workers with ranks 0..n-1 and its
own engine rendezvous scope "r<round>" (HVD_TORCH_RENDEZVOUS_SCOPE), so keys of
different rounds never mix.

  driver  elastic/round = "0"                          before starting any worker
  driver  elastic/rounds/<R>/open, then elastic/round = R   round R is open
  worker  elastic/rounds/<R>/join/<wid> = JSON JoinOffer    "I am ready for round R"
  driver  elastic/rounds/<R>/assign/<wid> = JSON Assignment   once every member joined
  worker  elastic/rounds/<R>/reset/<wid>                "a collective of round R failed"
  driver  elastic/leave/<wid>                           "leave the job" (host removed)
  driver  elastic/stop = JSON {success, reason}         the job is over

A worker joins the newest open round newer than the last one it was assigned in; if
the round is superseded while it waits, it joins the newer one.  Training workers
learn that a new round is open at their next commit: rank 0 reads elastic/round and
broadcasts it (one 8-byte broadcast per commit), so every rank raises
HostsUpdatedInterrupt at the same commit.  A failed collective needs no notice: every
survivor sees HorovodInternalError, posts a reset key and joins the next round.

The driver opens a new round when a member of the training round exits with an
error, when a worker posts a reset key, when discovery offers slots it may use
(up to --max-np), or when a host with workers disappears or is blacklisted.  It
assigns ranks once every member of the round has joined: survivors first, ordered by
their previous rank, so rank 0 (the source of state.sync()) is always a worker that
holds the committed state whenever one survives.

Bounds (the driver never waits without one): the wait for --min-np usable slots and
the wait for the last workers after a success end after elastic_timeout seconds; a
round's join phase after elastic_timeout too, but never before start_timeout, so that
a new worker has time to start; workers give up waiting for an assignment after their
own timeout (ENV_TIMEOUT, a little longer, so that the driver reports first).
Workers that do not join in time are killed and count as failures of their host.

Threading: run() owns the driver and runs on one thread; request_stop() may be
called from any thread or a signal handler.
"""

from __future__ import annotations

import collections
import dataclasses
import signal
import time
from collections.abc import Callable, Mapping
from typing import Protocol

from . import elastic_keys as keys
from .store import StoreError

__all__ = ["DriverError", "ElasticDriver", "WorkerHandle", "WorkerLauncher"]

# A worker waits this much longer than the driver for an assignment, so that when
# the driver gives up the workers hear why (elastic/stop) instead of timing out.
WORKER_TIMEOUT_SLACK = 30.0
# At the end of a successful job, workers still waiting for a round get this long
# to see elastic/stop and exit before they are killed.  After a failure, training
# workers would not look at elastic/stop, so they get only a moment.
_STOP_GRACE = 5.0
_FAILURE_GRACE = 1.0


class WorkerHandle(Protocol):
    def poll(self) -> int | None:
        """None while running, else the exit code (negative: killed by that signal)."""

    def kill(self) -> None:
        """Stops the worker now (and whatever it started)."""


class WorkerLauncher(Protocol):
    def start(self, worker_id: str, host: str, env: Mapping[str, str]) -> WorkerHandle:
        """Starts one worker for host's slot; env holds the variables the driver sets.
        Raises OSError when the worker cannot be started at all."""

    def engine_host(self, host: str) -> str:
        """The hostname the engine of host's workers uses (HOROVOD_HOSTNAME).  Workers
        with equal engine hosts share a machine: they get local ranks and talk over
        loopback.  A launcher that runs every "host" locally returns one name for all."""


class DriverError(Exception):
    """The job cannot go on; run() prints it and returns 1."""


@dataclasses.dataclass(eq=False)
class _Worker:
    id: str
    host: str
    seq: int
    handle: WorkerHandle
    code: int | None = None  # exit code, once exited
    rank: int | None = None  # rank in the last round it was assigned in
    round: int = 0  # the last round it was assigned in (0: never)
    leaving: bool = False  # asked to leave, or killed by us: its exit is no failure

    @property
    def alive(self) -> bool:
        return self.code is None


@dataclasses.dataclass
class _Plan:
    keep: list[_Worker]
    leave: list[_Worker]
    new_hosts: list[str]


def describe_exit(code: int) -> str:
    if code < 0:
        try:
            return f"was killed by signal {-code} ({signal.Signals(-code).name})"
        except ValueError:
            return f"was killed by signal {-code}"
    return f"exited with code {code}"


class ElasticDriver:
    """Runs one elastic job to its end; see the module docstring for the protocol.

    client: a KVStoreClient of the job's store.  worker_env: variables every worker
    needs besides the driver's own (the store's address and secret, ...).
    """

    def __init__(
        self,
        client,
        discovery: Callable[[], Mapping[str, int]],
        launcher: WorkerLauncher,
        *,
        min_np: int,
        max_np: int | None = None,
        reset_limit: int | None = None,
        elastic_timeout: float = 600.0,
        worker_env: Mapping[str, str] | None = None,
        discovery_interval: float = 1.0,
        start_timeout: float = 30.0,
        blacklist_after: int = 3,
        poll_interval: float = 0.05,
        log: Callable[[str], None] = print,
    ):
        if min_np < 1 or (max_np is not None and max_np < min_np):
            raise ValueError(f"need 1 <= min_np <= max_np, got {min_np}, {max_np}")
        self._client = client
        self._discovery = discovery
        self._launcher = launcher
        self._min_np = min_np
        self._max_np = max_np
        self._reset_limit = reset_limit
        self._timeout = elastic_timeout
        self._worker_env = dict(worker_env or {})
        self._discovery_interval = discovery_interval
        self._start_timeout = start_timeout
        self._blacklist_after = blacklist_after
        self._poll = poll_interval
        self._log = log

        self._workers: list[_Worker] = []
        self._hosts: dict[str, int] = {}
        self._next_discovery = 0.0
        self._failures: collections.Counter[str] = collections.Counter()
        self._blacklist: set[str] = set()
        self._round = 0  # the newest open round
        self._joining = False  # the newest round waits for its members
        self._members: list[_Worker] = []  # the newest round's members
        self._join_deadline = 0.0
        self._training: list[_Worker] = []  # the last assigned round's ranks, in order
        self._trained_round = 0
        self._broken = False  # the training round lost a member; it needs a new round
        self._resets = 0
        self._below_min_since: float | None = None
        self._finished_at: float | None = None  # when a training worker exited 0
        self._stop_signal: int | None = None
        self._stop_posted = False
        self._last_failure = ""

    # ------------------------------------------------------------ public

    @property
    def resets(self) -> int:
        return self._resets

    def request_stop(self, signum: int = signal.SIGTERM) -> None:
        self._stop_signal = signum

    def run(self) -> int:
        """0 when the last round's workers all exited 0; otherwise an error code."""
        success, reason, code = False, "", 1
        try:
            code = self._run()
            success = code == 0
            reason = "training finished" if success else "a worker failed"
        except DriverError as e:
            reason = str(e)
            self._log(f"error: {reason}")
        except StoreError as e:
            reason = f"lost the rendezvous store: {e}"
            self._log(f"error: {reason}")
        finally:
            self._shut_down(success, reason or "the driver stopped")
        return code

    # ------------------------------------------------------------ main loop

    def _run(self) -> int:
        self._client.set(keys.ROUND, "0")
        self._wait_for_slots()
        self._open_round(self._plan(), "start")
        while True:
            if self._stop_signal is not None:
                self._log(
                    f"received {signal.Signals(self._stop_signal).name}, stopping all workers"
                )
                return 128 + self._stop_signal
            self._reap()
            code = self._outcome()
            if code is not None:
                return code
            if self._finished_at is None:
                if self._joining:
                    self._advance_join()
                else:
                    self._maybe_open_round()
            time.sleep(self._poll)

    def _wait_for_slots(self) -> None:
        start = time.monotonic()
        while True:
            self._rediscover()
            usable = self._usable_slots()
            if usable >= self._min_np:
                return
            if time.monotonic() - start > self._timeout:
                raise DriverError(
                    f"discovery found {usable} usable slot(s), fewer than --min-np "
                    f"{self._min_np}, for {self._timeout:g}s (--elastic-timeout)"
                )
            if self._stop_signal is not None:
                raise DriverError("stopped while waiting for slots")
            time.sleep(min(self._discovery_interval, self._timeout))

    # ------------------------------------------------------------ workers

    def _start(self, host: str) -> _Worker:
        seq = len(self._workers) + 1
        worker_id = f"w{seq}"
        env = dict(self._worker_env)
        env.update({
            keys.ENV_WORKER_ID: worker_id,
            keys.ENV_HOST: host,
            keys.ENV_TIMEOUT: f"{max(self._timeout, self._start_timeout) + WORKER_TIMEOUT_SLACK:g}",
            "HOROVOD_HOSTNAME": self._launcher.engine_host(host),
            "HOROVOD_ELASTIC": "1",  # Horovod's marker: scripts may test it
        })  # fmt: skip
        try:
            handle = self._launcher.start(worker_id, host, env)
        except OSError as e:
            raise DriverError(f"cannot start a worker on {host}: {e}") from e
        worker = _Worker(worker_id, host, seq, handle)
        self._workers.append(worker)
        return worker

    def _kill(self, worker: _Worker) -> None:
        worker.leaving = True
        worker.handle.kill()

    def _reap(self) -> None:
        """Collects exits: failures count against their host and may break the round."""
        for w in self._workers:
            if not w.alive:
                continue
            code = w.handle.poll()
            if code is None:
                continue
            w.code = code
            if w.leaving:
                continue
            in_training = w in self._training and w.round == self._trained_round
            if code == 0:
                if in_training and self._finished_at is None:
                    self._log(f"worker {w.id} (rank {w.rank}) finished training")
                    self._finished_at = time.monotonic()
                continue
            self._record_failure(w, describe_exit(code))
            if in_training and not self._joining:
                self._broken = True

    def _record_failure(self, w: _Worker, what: str) -> None:
        self._last_failure = f"worker {w.id} on {w.host} {what}"
        self._log(self._last_failure)
        self._failures[w.host] += 1
        if self._failures[w.host] >= self._blacklist_after and w.host not in self._blacklist:
            self._blacklist.add(w.host)
            self._log(f"blacklisted host {w.host}: {self._failures[w.host]} of its workers failed")

    def _outcome(self) -> int | None:
        """The job's exit code once it is over, else None."""
        if self._finished_at is None:
            return None
        trained = [w for w in self._training if not w.leaving]
        if all(not w.alive for w in trained):
            failed = [w for w in trained if w.code != 0]
            if failed:
                w = failed[0]
                self._log(
                    f"worker {w.id} (rank {w.rank}) {describe_exit(w.code)} after "
                    "another finished training"
                )
                return 128 - w.code if w.code < 0 else w.code
            return 0
        if not self._stop_posted:
            # Workers waiting for a round that will never come leave quietly.
            self._client.set(keys.STOP, keys.encode_stop(True, "training finished"))
            self._stop_posted = True
        if time.monotonic() - self._finished_at > self._timeout:
            alive = ", ".join(w.id for w in trained if w.alive)
            raise DriverError(
                f"workers {alive} still running {self._timeout:g}s after "
                "another finished training (--elastic-timeout)"
            )
        return None

    # ------------------------------------------------------------ rounds

    def _rediscover(self) -> None:
        now = time.monotonic()
        try:
            hosts = dict(self._discovery())
        except Exception as e:  # noqa: BLE001  (a failing script must not end the job)
            self._log(f"host discovery failed, keeping the last known hosts: {e}")
            hosts = self._hosts
        if hosts != self._hosts and self._hosts:
            self._log("hosts: " + (", ".join(f"{h}:{n}" for h, n in hosts.items()) or "none"))
        self._hosts = hosts
        self._next_discovery = now + self._discovery_interval

    def _slots(self) -> dict[str, int]:
        return {h: n for h, n in self._hosts.items() if h not in self._blacklist and n > 0}

    def _usable_slots(self) -> int:
        total = sum(self._slots().values())
        return total if self._max_np is None else min(total, self._max_np)

    def _plan(self) -> _Plan:
        """Who stays, who leaves, and where new workers start, for the current hosts."""
        slots = self._slots()
        used: collections.Counter[str] = collections.Counter()
        keep, leave = [], []
        for w in sorted((w for w in self._workers if w.alive and not w.leaving), key=_seniority):
            room = self._max_np is None or len(keep) < self._max_np
            if room and used[w.host] < slots.get(w.host, 0):
                keep.append(w)
                used[w.host] += 1
            else:
                leave.append(w)
        new_hosts = []
        for host, n in slots.items():
            for _ in range(n - used[host]):
                if self._max_np is not None and len(keep) + len(new_hosts) >= self._max_np:
                    break
                new_hosts.append(host)
        return _Plan(keep, leave, new_hosts)

    def _maybe_open_round(self) -> None:
        if time.monotonic() >= self._next_discovery:
            self._rediscover()
        if not self._reasons()[0]:
            self._below_min_since = None
            return
        # Something changed: ask discovery again right before deciding, so that a
        # host removed a moment ago does not get a replacement worker.
        self._rediscover()
        reasons, plan = self._reasons()
        if not reasons:
            return
        usable = len(plan.keep) + len(plan.new_hosts)
        if usable < self._min_np:
            now = time.monotonic()
            if self._below_min_since is None:
                self._below_min_since = now
                self._log(
                    f"only {usable} usable slot(s), fewer than --min-np {self._min_np}; "
                    f"waiting up to {self._timeout:g}s"
                )
            elif now - self._below_min_since > self._timeout:
                raise DriverError(
                    f"fewer than --min-np {self._min_np} usable slots for {self._timeout:g}s "
                    f"(--elastic-timeout); last failure: {self._last_failure or 'none'}"
                )
            return
        self._below_min_since = None
        self._open_round(plan, "; ".join(reasons))

    def _reasons(self) -> tuple[list[str], _Plan]:
        """Why the training round must end (empty: it need not), and the next plan."""
        reasons = []
        if self._broken:
            reasons.append(self._last_failure or "a worker failed")
        reported = self._client.list_keys(keys.reset_prefix(self._trained_round))
        if reported:
            reasons.append(f"{len(reported)} worker(s) reported a failed collective")
        plan = self._plan()
        if plan.leave:
            reasons.append(f"{len(plan.leave)} worker(s) lost their slot")
        if plan.new_hosts:
            reasons.append(f"{len(plan.new_hosts)} slot(s) to fill")
        return reasons, plan

    def _open_round(self, plan: _Plan, why: str) -> None:
        if self._round > 0:
            if self._reset_limit is not None and self._resets >= self._reset_limit:
                raise DriverError(
                    f"reached --reset-limit {self._reset_limit} resets; the next one was "
                    f"needed because: {why} (last failure: {self._last_failure or 'none'})"
                )
            self._resets += 1
        round_ = self._round + 1
        for w in plan.leave:
            w.leaving = True
            self._client.set(keys.leave_key(w.id), why)
        members = plan.keep + [self._start(host) for host in plan.new_hosts]
        self._round = round_
        self._members = members
        self._joining = True
        self._broken = False
        # New workers get the start timeout to import and reach hvd.init(), however
        # short the elastic timeout is.
        self._join_deadline = time.monotonic() + max(self._timeout, self._start_timeout)
        self._client.set(keys.open_key(round_), why)
        self._client.set(keys.ROUND, str(round_))
        self._log(f"round {round_} ({why}): waiting for {len(members)} worker(s) to join")

    def _advance_join(self) -> None:
        round_ = self._round
        members = [w for w in self._members if w.alive and not w.leaving]
        prefix = keys.join_prefix(round_)
        joined = {k[len(prefix) :] for k in self._client.list_keys(prefix)}
        waiting = [w for w in members if w.id not in joined]
        if waiting and time.monotonic() < self._join_deadline:
            return
        for w in waiting:
            self._record_failure(w, f"did not join round {round_} in time; stopping it")
            self._kill(w)
        ready = [w for w in members if w.id in joined]
        self._joining = False
        if len(ready) < self._min_np:
            self._log(
                f"round {round_}: {len(ready)} worker(s) joined, fewer than --min-np {self._min_np}"
            )
            self._broken = True
            self._training = []
            return
        self._assign(round_, ready)

    def _assign(self, round_: int, ready: list[_Worker]) -> None:
        ready = sorted(ready, key=_seniority)
        # Ranks are contiguous per machine, machines in order of their most senior
        # worker: rank 0 stays with the most senior survivor.
        machines: dict[str, list[_Worker]] = {}
        for w in ready:
            machines.setdefault(self._launcher.engine_host(w.host), []).append(w)
        ordered = [w for group in machines.values() for w in group]
        rank_of = {w.id: r for r, w in enumerate(ordered)}
        master = keys.decode_join(self._client.get(keys.join_key(round_, ordered[0].id)))
        for cross_rank, (machine, group) in enumerate(machines.items()):
            for local_rank, w in enumerate(group):
                a = keys.Assignment(
                    round=round_, rank=rank_of[w.id], size=len(ordered),
                    local_rank=local_rank, local_size=len(group),
                    cross_rank=cross_rank, cross_size=len(machines), hostname=machine,
                    master_addr=master.master_addr, master_port=master.master_port,
                )  # fmt: skip
                self._client.set(keys.assign_key(round_, w.id), keys.encode_assignment(a))
        for w in ordered:
            w.rank, w.round = rank_of[w.id], round_
        self._training = ordered
        self._trained_round = round_
        self._log(
            f"round {round_}: {len(ordered)} worker(s): "
            + ", ".join(f"{w.id}@{w.host}=rank {w.rank}" for w in ordered)
        )

    # ------------------------------------------------------------ the end

    def _shut_down(self, success: bool, reason: str) -> None:
        try:
            self._client.set(keys.STOP, keys.encode_stop(success, reason))
        except StoreError:
            pass  # the store is gone: workers find out from their own connections
        deadline = time.monotonic() + (_STOP_GRACE if success else _FAILURE_GRACE)
        while time.monotonic() < deadline and any(w.handle.poll() is None for w in self._workers):
            time.sleep(self._poll)
        for w in self._workers:
            if w.handle.poll() is None:
                w.handle.kill()


def _seniority(w: _Worker):
    """Workers that hold committed state first (latest round, lowest rank), then by age."""
    if w.rank is None:
        return (1, 0, 0, w.seq)
    return (0, -w.round, w.rank, w.seq)
