"""Static multi-host hvdrun over real ssh into network-namespace hosts.

Each test makes its hosts (netns_hosts.py: a namespace, an address, an sshd each),
runs `hvdrun -H ...` from this machine, and tears the hosts down, also on failure.
Skipped where namespaces cannot be made (not root).
"""

import json
import os
import secrets
import signal
import time

import pytest

from multihost_harness import ROOT, cluster, finish, hvdrun, rank_lines, rank_reports, spawn
from multihost_harness import launcher_env as _env

# A rank that reports where it runs and what the engine says about it.
TOPOLOGY = """
import json, os, socket, torch, hvd_torch as hvd
from hvdrun.network import route_source_address
hvd.init()
total = hvd.allreduce(torch.tensor([float(hvd.rank() + 1)]), op=hvd.Sum).item()
hosts = hvd.allgather_object(route_source_address(os.environ["HOROVOD_GLOO_RENDEZVOUS_ADDR"]))
print(json.dumps(dict(rank=hvd.rank(), size=hvd.size(), local_rank=hvd.local_rank(),
    local_size=hvd.local_size(), cross_rank=hvd.cross_rank(), cross_size=hvd.cross_size(),
    total=total, hosts=hosts, cwd=os.getcwd(), extra=os.environ.get("MH_EXTRA"))))
"""


def test_two_hosts_two_slots_each_collectives_and_layout(tmp_path):
    with cluster(tmp_path, ["a", "b"]) as hosts:
        a, b = hosts.address("a"), hosts.address("b")
        run = hvdrun(
            ["-np", "4", "-H", f"{a}:2,{b}:2", *hosts.hvdrun_ssh_args(), "-x", "MH_EXTRA=forwarded",
             "python", "-c", TOPOLOGY],
        )  # fmt: skip
        assert run.code == 0, run
        reports = rank_reports(run, 4)
        for r, rep in enumerate(reports):
            assert rep["rank"] == r and rep["size"] == 4
            assert (rep["local_rank"], rep["local_size"]) == (r % 2, 2)
            assert (rep["cross_rank"], rep["cross_size"]) == (r // 2, 2)
            assert rep["total"] == 1 + 2 + 3 + 4
            assert rep["hosts"] == [a, a, b, b]  # ranks placed in host order
            assert rep["cwd"] == str(ROOT)  # the launcher's directory, forwarded
            assert rep["extra"] == "forwarded"


def _digest(run):
    (line,) = [x for x in rank_lines(run.out, 0) if "identical weights" in x]
    return line.split("sha256 prefix ")[1].rstrip(")")


def test_two_hosts_train_digits_to_identical_weights(tmp_path):
    args = ["python", "examples/digits_allreduce.py", "--epochs", "8"]
    with cluster(tmp_path, ["a", "b"]) as hosts:
        a, b = hosts.address("a"), hosts.address("b")
        run = hvdrun(["-np", "4", "-H", f"{a}:2,{b}:2", *hosts.hvdrun_ssh_args(), *args],
                     timeout=300)  # fmt: skip
    assert run.code == 0, run
    lines = rank_lines(run.out, 0)
    assert any("all 4 ranks hold identical weights" in line for line in lines), run
    accuracy = float(lines[-2].split("test accuracy")[1].split("%")[0])
    assert accuracy > 85, run
    # The same job on this machine alone ends with the very same weights: placement
    # changes where the bytes travel, not the arithmetic.
    local = hvdrun(["-np", "4", *args], timeout=300)
    assert local.code == 0, local
    assert _digest(run) == _digest(local), (run, local)


def test_hostfile_and_ssh_port(tmp_path):
    with cluster(tmp_path, ["a", "b"], ssh_port=2222) as hosts:
        assert hosts.hvdrun_ssh_args()[-2:] == ["--ssh-port", "2222"]
        a, b = hosts.address("a"), hosts.address("b")
        hostfile = tmp_path / "hostfile"
        hostfile.write_text(f"# two hosts\n{a} slots=1\n\n{b}   slots=3  # the bigger one\n")
        run = hvdrun(["-np", "3", "--hostfile", str(hostfile), *hosts.hvdrun_ssh_args(),
                      "python", "-c", TOPOLOGY])  # fmt: skip
        assert run.code == 0, run
        reports = rank_reports(run, 3)
        assert reports[0]["hosts"] == [a, b, b]
        assert [(rep["local_rank"], rep["local_size"]) for rep in reports] == [
            (0, 1), (0, 2), (1, 2)]  # fmt: skip
        assert [rep["cross_rank"] for rep in reports] == [0, 1, 1]


# Rank 0 reads, from the store, the addresses every rank advertised: the control
# plane's (coordinator) and Gloo's (its full-mesh keys carry raw sockaddrs).
ADDRESSES = """
import json, os, socket, torch, hvd_torch as hvd
from hvdrun.store import KVStoreClient, secret_from_hex
hvd.init()
hvd.allreduce(torch.ones(4))
if hvd.rank() == 0:
    e = os.environ
    c = KVStoreClient(e["HOROVOD_GLOO_RENDEZVOUS_ADDR"], int(e["HOROVOD_GLOO_RENDEZVOUS_PORT"]),
                      secret_from_hex(e["HOROVOD_SECRET_KEY"]))
    keys = c.list_keys("hvd/")
    control = [c.get(k).decode() for k in keys if k.endswith("/control")]
    blobs = [c.get(k) for k in keys if "/data/" in k]
    nets = {n: sum(blob.count(socket.inet_aton(f"{n}.{h}")) for blob in blobs for h in (2, 3))
            for n in ("10.213.7", "10.213.8")}
    print(json.dumps(dict(store=e["HOROVOD_GLOO_RENDEZVOUS_ADDR"], control=control,
                          gloo_keys=len(blobs), nets=nets)))
hvd.barrier()
"""


def test_network_interface_picks_the_nic_for_store_control_and_gloo(tmp_path):
    with cluster(tmp_path, ["a", "b"], networks=("hvdt0", "hvdt1")) as hosts:
        # Named by their first-network addresses; everything else must use hvdt1.
        a, b = hosts.address("a"), hosts.address("b")
        run = hvdrun(["-np", "2", "-H", f"{a}:1,{b}:1", "--network-interface", "hvdt1",
                      *hosts.hvdrun_ssh_args(), "python", "-c", ADDRESSES])  # fmt: skip
        assert run.code == 0, run
        (line,) = rank_lines(run.out, 0)
        report = json.loads(line)
        assert report["store"] == hosts.launcher_address("hvdt1")
        assert [c.rsplit(":", 1)[0] for c in report["control"]] == [hosts.address("a", "hvdt1")]
        assert report["gloo_keys"] >= 1
        assert report["nets"]["10.213.8"] >= 1 and report["nets"]["10.213.7"] == 0, report

        # The same through HOROVOD_GLOO_IFACE, and a name that is not there.
        run = hvdrun(["-np", "2", "-H", f"{a}:1,{b}:1", *hosts.hvdrun_ssh_args(),
                      "python", "-c", "print(1)"],
                     env=_env(HOROVOD_GLOO_IFACE="nosuchnic0"))  # fmt: skip
        assert run.code == 1, run
        assert "network interface 'nosuchnic0'" in run.err, run


def test_unreachable_host_fails_fast_naming_it(tmp_path):
    # Host c exists and answers on the network, but no sshd runs there.
    with cluster(tmp_path, ["a", "b", "c"], sshd=["a", "b"]) as hosts:
        a, c = hosts.address("a"), hosts.address("c")
        run = hvdrun(["-np", "3", "-H", f"{a}:1,{c}:2", *hosts.hvdrun_ssh_args(),
                      "python", "-c", "print('started')"], timeout=60)  # fmt: skip
        assert run.code == 1, run
        assert run.seconds < 10, run
        assert f"cannot reach host {c} over ssh" in run.err, run
        assert "Connection refused" in run.err, run
        assert "rank(s) 1, 2 would run on unreachable hosts" in run.err, run
        assert "started" not in run.out  # nothing was launched anywhere
        assert hosts.pids("a") == []


# Every rank writes its pid, then trains "forever" (bounded: 2 minutes).
FOREVER = """
import os, time, torch, hvd_torch as hvd
hvd.init()
open(os.path.join(os.environ["MH_PIDS"], str(hvd.rank())), "w").write(str(os.getpid()))
deadline = time.monotonic() + 120
while time.monotonic() < deadline:
    hvd.allreduce(torch.ones(1000))
    time.sleep(0.01)
"""


def test_killed_remote_rank_ends_the_job_in_seconds_and_leaves_nothing(tmp_path):
    pids_dir = tmp_path / "pids"
    pids_dir.mkdir()
    with cluster(tmp_path, ["a", "b"]) as hosts:
        a, b = hosts.address("a"), hosts.address("b")
        proc = spawn(["hvdrun", "-np", "4", "-H", f"{a}:2,{b}:2", *hosts.hvdrun_ssh_args(), "-x", "MH_PIDS",
                      "python", "-c", FOREVER], env=_env(MH_PIDS=str(pids_dir)))  # fmt: skip
        try:
            deadline = time.monotonic() + 90
            while len(os.listdir(pids_dir)) < 4 and time.monotonic() < deadline:
                assert proc.poll() is None, finish(proc, 10)
                time.sleep(0.1)
            assert len(os.listdir(pids_dir)) == 4, "ranks did not start in 90s"
            time.sleep(0.5)  # let a few collectives run
            victim = int((pids_dir / "3").read_text())
            assert victim in hosts.pids("b")  # rank 3 really runs on host b
            _assert_secret_on_no_command_line(victim)
            killed_at = time.monotonic()
            os.kill(victim, signal.SIGKILL)
        except BaseException:
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGKILL)
            raise
        run = finish(proc, 60, started=killed_at)
        assert run.code == 128 + signal.SIGKILL, run
        assert run.seconds < 5, run
        summary = run.err.strip().splitlines()[-1]
        assert f"rank 3 on host {b} was killed by signal 9 (SIGKILL)" in summary, run
        # Nothing is left behind on either host: the remote wrappers stop their ranks.
        deadline = time.monotonic() + 10
        while (hosts.pids("a") or hosts.pids("b")) and time.monotonic() < deadline:
            time.sleep(0.1)
        assert hosts.pids("a") == [] and hosts.pids("b") == []
        print(f"kill -> hvdrun exit: {run.seconds:.2f}s; hosts empty "
              f"{time.monotonic() - killed_at:.2f}s after the kill")


def test_unreachable_host_mid_job_ends_it_in_seconds_naming_it(tmp_path):
    pids_dir = tmp_path / "pids"
    pids_dir.mkdir()
    with cluster(tmp_path, ["a", "b"]) as hosts:
        a, b = hosts.address("a"), hosts.address("b")
        proc = spawn(["hvdrun", "-np", "4", "-H", f"{a}:2,{b}:2", *hosts.hvdrun_ssh_args(),
                      "-x", "MH_PIDS", "python", "-c", FOREVER],
                     env=_env(MH_PIDS=str(pids_dir)))  # fmt: skip
        try:
            deadline = time.monotonic() + 90
            while len(os.listdir(pids_dir)) < 4 and time.monotonic() < deadline:
                assert proc.poll() is None, finish(proc, 10)
                time.sleep(0.1)
            assert len(os.listdir(pids_dir)) == 4, "ranks did not start in 90s"
            cut_at = time.monotonic()
            hosts.unplug("b")
        except BaseException:
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGKILL)
            raise
        run = finish(proc, 60, started=cut_at)
        # ssh's keep-alives (every 2 s, 3 missed) notice first; Gloo would wait 30 s.
        assert run.code == 255, run
        assert run.seconds < 12, run
        assert f"on host {b}: ssh failed or lost the connection to {b}" in run.err, run
        # Host a's ranks are stopped through their live ssh channels.
        deadline = time.monotonic() + 10
        while hosts.pids("a") and time.monotonic() < deadline:
            time.sleep(0.1)
        assert hosts.pids("a") == []
        print(f"host b unplugged -> hvdrun exit: {run.seconds:.2f}s")


def test_local_and_remote_ranks_mix(tmp_path):
    # This machine (on the bridge) and one namespace host in one job.
    with cluster(tmp_path, ["a"]) as hosts:
        a = hosts.address("a")
        run = hvdrun(["-np", "3", "-H", f"localhost:1,{a}:2", *hosts.hvdrun_ssh_args(),
                      "python", "-c", TOPOLOGY])  # fmt: skip
        assert run.code == 0, run
        reports = rank_reports(run, 3)
        assert reports[0]["hosts"] == [hosts.launcher_address(), a, a]
        assert reports[2]["total"] == 6
        assert [rep["cross_rank"] for rep in reports] == [0, 1, 1]


def _assert_secret_on_no_command_line(rank_pid):
    """The job's secret reached the remote rank (its environment) without appearing in
    any process's argv, here or on the hosts (one /proc: the hosts share this kernel)."""
    environ = open(f"/proc/{rank_pid}/environ", "rb").read().split(b"\0")
    (secret,) = [v.split(b"=", 1)[1] for v in environ if v.startswith(b"HOROVOD_SECRET_KEY=")]
    assert len(secret) == 64
    for pid in os.listdir("/proc"):
        if pid.isdigit():
            try:
                cmdline = open(f"/proc/{pid}/cmdline", "rb").read()
            except OSError:
                continue  # gone meanwhile
            assert secret not in cmdline, (pid, cmdline)


# A rank that reports the launcher's variables it got, and how many processes on this
# kernel (the launcher's ssh clients, the hosts' sshd and wrappers, every rank) show
# MH_TOKEN's value or the job's secret on their command line, while every rank runs.
ENVIRONMENT = """
import json, os, torch, hvd_torch as hvd
hvd.init()
hvd.allreduce(torch.ones(1), name="all.started")
shown = 0
for pid in filter(str.isdigit, os.listdir("/proc")):
    try:
        cmdline = open(f"/proc/{pid}/cmdline", "rb").read()
    except OSError:
        continue  # gone meanwhile
    shown += any(v.encode() in cmdline
                 for v in (os.environ["MH_TOKEN"], os.environ["HOROVOD_SECRET_KEY"]))
names = ["DATA_DIR", "MH_TOKEN", "MH_LINES", "MH_EXTRA", "DISPLAY", "HOSTNAME", "SSH_AUTH_SOCK",
         "BASH_FUNC_mh%%"]
print(json.dumps(dict(env={k: os.environ.get(k) for k in names}, shown=shown)))
hvd.barrier()
"""


@pytest.mark.parametrize("nranks", [2, 3])
def test_launcher_environment_reaches_remote_ranks_on_stdin_only(tmp_path, nranks):
    """horovodrun's forwarding: the launching shell's variables reach every remote rank,
    except the deny list (this machine, this login, this shell) unless -x names them;
    no value is on any command line (the ssh channel's stdin carries them)."""
    token = secrets.token_hex(16)
    env = _env(DATA_DIR="/data/set 1", MH_TOKEN=token, MH_LINES="one\ntwo 'x'", DISPLAY=":42",
               HOSTNAME="the-launcher", SSH_AUTH_SOCK="/tmp/launcher-agent",
               **{"BASH_FUNC_mh%%": "() { echo mh; }"})  # fmt: skip
    with cluster(tmp_path, ["a", "b"]) as hosts:
        a, b = hosts.address("a"), hosts.address("b")
        run = hvdrun(["-np", str(nranks), "-H", f"{a}:1,{b}:2", *hosts.hvdrun_ssh_args(),
                      "-x", "MH_EXTRA=from -x", "-x", "DISPLAY", "python", "-c", ENVIRONMENT],
                     env=env)  # fmt: skip
        assert run.code == 0, run
        reports = rank_reports(run, nranks)
    for rep in reports:
        got = rep["env"]
        assert (got["DATA_DIR"], got["MH_TOKEN"], got["MH_LINES"]) == (
            "/data/set 1", token, "one\ntwo 'x'")  # fmt: skip
        assert got["MH_EXTRA"] == "from -x"
        assert got["DISPLAY"] == ":42"  # denied, but named by -x
        assert got["HOSTNAME"] != "the-launcher"
        assert got["SSH_AUTH_SOCK"] != "/tmp/launcher-agent"
        assert got["BASH_FUNC_mh%%"] is None
        assert rep["shown"] == 0, rep
