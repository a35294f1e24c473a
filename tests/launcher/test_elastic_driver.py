"""ElasticDriver and the worker side of the round protocol, without torch: workers are
threads speaking the store protocol (WorkerRendezvous) under a fake launcher, so the
driver's decisions (ranks, resets, blacklisting, timeouts) are checked in seconds.
Also hvdrun's elastic option parsing and host discovery parsing."""

from __future__ import annotations

import threading
import time

import pytest

from hvdrun import elastic_keys as keys
from hvdrun.discovery import DiscoveryError, HostDiscoveryScript, parse_hosts
from hvdrun.elastic_driver import ElasticDriver
from hvdrun.store import KVStoreClient, KVStoreServer, StoreError


class FakeWorker:
    """A worker thread: joins rounds and 'trains' until a newer round opens (the
    commit check) or the test tells it to finish or fail."""

    def __init__(self, store, worker_id, host, fail_at_start=False):
        self.id, self.host = worker_id, host
        self.assignments: list[keys.Assignment] = []
        self.code = None
        self.finish = threading.Event()
        self.fail = threading.Event()
        if fail_at_start:
            self.code = 5
            return
        self._client = KVStoreClient(store.host, store.port, store.secret)
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self):
        from hvd_torch.elastic.worker_rendezvous import RendezvousError, WorkerRendezvous

        rv = WorkerRendezvous(self._client, self.id, timeout=20)
        try:
            while True:
                self.assignments.append(rv.join())
                while rv.current_round() == rv.round:
                    if self.finish.is_set():
                        self.code = 0
                        return
                    if self.fail.is_set():
                        self.code = -9
                        return
                    time.sleep(0.01)
        except SystemExit as e:
            self.code = e.code or 0
        except RendezvousError:
            self.code = 3
        except StoreError:  # the test is over and its store closed
            self.code = 4

    # the WorkerHandle protocol
    def poll(self):
        return self.code

    def kill(self):
        self.fail.set()
        if self.code is None:
            self._thread.join(5)


class FakeLauncher:
    def __init__(self, store, fail_hosts=()):
        self.store = store
        self.fail_hosts = set(fail_hosts)
        self.workers: list[FakeWorker] = []

    def start(self, worker_id, host, env):
        assert env[keys.ENV_WORKER_ID] == worker_id and env[keys.ENV_HOST] == host
        self.workers.append(FakeWorker(self.store, worker_id, host, host in self.fail_hosts))
        return self.workers[-1]

    def engine_host(self, host):
        return "machine"


@pytest.fixture
def store():
    with KVStoreServer("127.0.0.1", 0) as server:
        yield server


def _start_driver(store, hosts, fail_hosts=(), **kwargs):
    """(driver, launcher, result list, thread, hosts dict the test may change)."""
    client = KVStoreClient(store.host, store.port, store.secret)
    launcher = FakeLauncher(store, fail_hosts)
    logs: list[str] = []
    kwargs.setdefault("discovery_interval", 0.1)
    driver = ElasticDriver(client, lambda: dict(hosts), launcher, log=logs.append, **kwargs)
    result: list[int] = []
    thread = threading.Thread(target=lambda: result.append(driver.run()), daemon=True)
    thread.start()
    return driver, launcher, result, thread, logs


def _wait(predicate, timeout=10.0):
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, "condition not reached"
        time.sleep(0.01)


def _latest(worker):
    return worker.assignments[-1] if worker.assignments else None


def _all_at_round(workers, round_):
    """Every worker has joined round_: each learns of a round on its own thread."""
    return all(_latest(w) is not None and _latest(w).round == round_ for w in workers)


def test_survivor_becomes_rank_0_and_the_slot_is_refilled(store):
    hosts = {"localhost": 3}
    driver, launcher, result, thread, logs = _start_driver(store, hosts, min_np=2)
    _wait(lambda: len(launcher.workers) == 3 and all(w.assignments for w in launcher.workers))
    w1, w2, w3 = launcher.workers
    assert [_latest(w).rank for w in (w1, w2, w3)] == [0, 1, 2]
    w1.fail.set()  # rank 0 dies: w2 must take over rank 0, w4 fills the slot
    _wait(lambda: len(launcher.workers) == 4 and _all_at_round(launcher.workers[1:], 2))
    w4 = launcher.workers[3]
    assert [(_latest(w).rank, _latest(w).size, _latest(w).round) for w in (w2, w3, w4)] == [
        (0, 3, 2), (1, 3, 2), (2, 3, 2)]  # fmt: skip
    assert _latest(w4).local_size == 3 and _latest(w4).hostname == "machine"
    # Every member gets MASTER_ADDR/MASTER_PORT as the round's rank 0 offered them.
    with KVStoreClient(store.host, store.port, store.secret) as client:
        offer = keys.decode_join(client.get(keys.join_key(2, w2.id)))
    assert offer.master_addr == "127.0.0.1" and offer.master_port > 0
    assert {(_latest(w).master_addr, _latest(w).master_port) for w in (w2, w3, w4)} == {
        (offer.master_addr, offer.master_port)}  # fmt: skip
    for w in (w2, w3, w4):
        w.finish.set()
    thread.join(10)
    assert result == [0], logs
    assert driver.resets == 1


def test_reset_limit_ends_the_job(store):
    hosts = {"good": 1, "bad": 1}
    _driver, launcher, result, thread, logs = _start_driver(
        store, hosts, fail_hosts={"bad"}, min_np=1, reset_limit=2, blacklist_after=10
    )
    thread.join(20)
    assert result == [1], logs
    assert any("reached --reset-limit 2 resets" in line for line in logs), logs
    assert sum(w.host == "bad" for w in launcher.workers) == 3  # round 1, then 2 resets
    # The surviving worker was told why, and did not hang.
    _wait(lambda: launcher.workers[0].code is not None)


def test_blacklisted_host_gets_no_more_workers(store):
    hosts = {"good": 1, "bad": 2}
    driver, launcher, result, thread, logs = _start_driver(
        store, hosts, fail_hosts={"bad"}, min_np=1, blacklist_after=3
    )
    _wait(lambda: any("blacklisted host bad" in line for line in logs))
    time.sleep(0.5)  # several discovery periods: nothing more is started
    # Two per round (both slots), and the third failure blacklists the host.
    assert sum(w.host == "bad" for w in launcher.workers) == 4, logs
    good = launcher.workers[0]
    _wait(lambda: _latest(good) is not None and _latest(good).round == driver._round)
    good.finish.set()
    thread.join(10)
    assert result == [0], logs


def test_added_slots_grow_the_job_up_to_max_np(store):
    hosts = {"localhost": 1}
    _driver, launcher, result, thread, logs = _start_driver(store, hosts, min_np=1, max_np=2)
    _wait(lambda: launcher.workers and launcher.workers[0].assignments)
    hosts["localhost"] = 4  # only one more fits under --max-np 2
    _wait(lambda: len(launcher.workers) == 2 and _all_at_round(launcher.workers, 2))
    assert [(_latest(w).rank, _latest(w).size) for w in launcher.workers] == [(0, 2), (1, 2)]
    time.sleep(0.3)
    assert len(launcher.workers) == 2
    for w in launcher.workers:
        w.finish.set()
    thread.join(10)
    assert result == [0], logs


def test_removed_host_asks_its_workers_to_leave(store):
    hosts = {"a": 1, "b": 1}
    _driver, launcher, result, thread, logs = _start_driver(store, hosts, min_np=1)
    _wait(lambda: len(launcher.workers) == 2 and all(w.assignments for w in launcher.workers))
    del hosts["b"]
    wa, wb = launcher.workers
    _wait(lambda: wb.code == 0 and _latest(wa).round == 2)
    assert (_latest(wa).rank, _latest(wa).size) == (0, 1)
    wa.finish.set()
    thread.join(10)
    assert result == [0], logs


def test_too_few_slots_past_the_elastic_timeout_fails(store):
    hosts = {"localhost": 2}
    _driver, launcher, result, thread, logs = _start_driver(
        store, hosts, min_np=2, elastic_timeout=1.0
    )
    _wait(lambda: len(launcher.workers) == 2 and all(w.assignments for w in launcher.workers))
    hosts["localhost"] = 1
    start = time.monotonic()
    thread.join(10)
    assert result == [1], logs
    assert 1.0 <= time.monotonic() - start < 3.0
    assert any("fewer than --min-np 2 usable slots for 1s" in line for line in logs), logs


def test_initial_wait_for_min_np_slots_is_bounded(store):
    _driver, launcher, result, thread, logs = _start_driver(
        store, {"localhost": 1}, min_np=2, elastic_timeout=0.5
    )
    thread.join(10)
    assert result == [1] and not launcher.workers
    assert any("fewer than --min-np 2" in line for line in logs), logs


def test_waiting_worker_gives_up_after_its_timeout(store):
    from hvd_torch.elastic.worker_rendezvous import RendezvousError, WorkerRendezvous

    with KVStoreClient(store.host, store.port, store.secret) as client:
        client.set(keys.ROUND, "0")
        rv = WorkerRendezvous(client, "w1", timeout=0.5)
        start = time.monotonic()
        with pytest.raises(RendezvousError, match="no round assignment"):
            rv.join()
        assert time.monotonic() - start < 2.0


# ---------------------------------------------------------------- parsing


@pytest.mark.unit
def test_parse_hosts():
    assert parse_hosts("a:2\n\n# comment\nb:1  # trailing\n", None) == {"a": 2, "b": 1}
    assert parse_hosts("a\nb:3", 4) == {"a": 4, "b": 3}
    with pytest.raises(DiscoveryError, match="no slot count"):
        parse_hosts("a", None)
    with pytest.raises(DiscoveryError, match="bad slot count"):
        parse_hosts("a:x", None)


def test_discovery_script_failure_is_reported(tmp_path):
    with pytest.raises(DiscoveryError, match="no slot count"):
        HostDiscoveryScript("echo h1:2; echo h2")()
    assert HostDiscoveryScript("echo h1:2; echo h2", slots_per_host=3)() == {"h1": 2, "h2": 3}
    with pytest.raises(DiscoveryError, match="exited with code 3"):
        HostDiscoveryScript("exit 3")()


@pytest.mark.unit
def test_elastic_options():
    from hvdrun import launch

    opts = launch.parse_args(
        [
            "--min-np",
            "2",
            "--max-np",
            "4",
            "--host-discovery-script",
            "./d.sh",
            "--reset-limit",
            "0",
            "--elastic-timeout",
            "5",
            "python",
            "t.py",
        ]
    )
    e = opts.elastic
    assert (e.min_np, e.max_np, e.discovery_script, e.reset_limit, e.elastic_timeout) == (
        2,
        4,
        "./d.sh",
        0,
        5.0,
    )
    assert opts.num_proc is None and opts.command == ["python", "t.py"]
    # -np alone is static; -np with --max-np is elastic with min = np.
    assert launch.parse_args(["-np", "2", "python"]).elastic is None
    e = launch.parse_args(["-np", "2", "--max-np", "3", "python"]).elastic
    assert (e.min_np, e.max_np, e.hosts) == (2, 3, {"localhost": 3})
    e = launch.parse_args(["--min-np", "1", "-H", "a:2,b", "python"]).elastic
    assert e.hosts == {"a": 2, "b": 1}


@pytest.mark.parametrize(
    "argv, message",
    [
        (["--max-np", "1", "--min-np", "2", "p"], "--max-np 1 is less than --min-np 2"),
        (["--max-np", "2", "p"], "needs --min-np"),
        (["-np", "2", "--reset-limit", "1", "p"], "--reset-limit is for elastic jobs"),
        (["--min-np", "1", "--reset-limit", "-1", "p"], "non-negative integer"),
        (["--min-np", "1", "-H", "a:1", "--host-discovery-script", "d", "p"], "not both"),
        (["-np", "5", "--min-np", "1", "--max-np", "2", "p"], "outside"),
    ],
)
@pytest.mark.unit
def test_elastic_usage_errors(argv, message, capsys):
    from hvdrun import launch

    assert launch.main(argv) == 2
    assert message in capsys.readouterr().err
