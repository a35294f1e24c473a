"""The launcher's pieces that need no hosts: hvdrun starting without torch, host
lists and hostfiles, rank placement, Slurm's host lists, what travels to remote
ranks, and the remote wrapper's contract (run for real through sh, no ssh)."""

import json
import os
import shlex
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from hvdrun.args import UsageError
from hvdrun.env import forwarded_env
from hvdrun.hosts import parse_host_list, parse_hostfile, place_ranks
from hvdrun.slurm import expand_hostlist, node_defaults
from hvdrun.launch import parse_args
from hvdrun.ssh import SshSettings, remote_command

ROOT = Path(__file__).resolve().parents[2]


def test_hvdrun_runs_with_torch_and_the_extension_unimportable(tmp_path):
    # A torch package that refuses to load, first on the path: if the launcher (or
    # anything it imports, like hvd_torch/__init__.py) needed torch, this would fail.
    fake = tmp_path / "torch"
    fake.mkdir()
    (fake / "__init__.py").write_text("raise ImportError('torch is not available here')\n")
    env = dict(os.environ, PYTHONPATH=f"{tmp_path}{os.pathsep}{ROOT}")
    started = time.monotonic()
    proc = subprocess.run(
        [sys.executable, "-m", "hvdrun", "-np", "2", sys.executable, "-c",
         "import os; print('rank', os.environ['HOROVOD_RANK'])"],
        cwd=tmp_path, env=env, capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    assert sorted(proc.stdout.splitlines()) == ["[0]<stdout>:rank 0", "[1]<stdout>:rank 1"]
    assert time.monotonic() - started < 10
    check = subprocess.run(
        [sys.executable, "-c", "import hvdrun.launch, sys; "
         "print(sorted(m for m in sys.modules if m.startswith(('torch', 'hvd_torch'))))"],
        env=env, capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert check.stdout.strip() == "[]", check


@pytest.mark.unit
def test_host_list_and_hostfile_parse_alike(tmp_path):
    assert parse_host_list("h1:2, h2:3,h3") == [("h1", 2), ("h2", 3), ("h3", 1)]
    f = tmp_path / "hosts"
    f.write_text("# cluster\nh1 slots=2\n\nh2  slots=3 # big\nh3\n")
    assert parse_hostfile(str(f)) == [("h1", 2), ("h2", 3), ("h3", 1)]
    f.write_text("h1 cores=2\n")
    with pytest.raises(UsageError, match="line 1: expected `host slots=N`"):
        parse_hostfile(str(f))
    f.write_text("h1 slots=0\n")
    with pytest.raises(UsageError, match="positive integer"):
        parse_hostfile(str(f))


@pytest.mark.unit
def test_ranks_fill_hosts_in_order():
    places = place_ranks([("h1", 2), ("h2", 3), ("h3", 4)], 4)
    assert [(p.host, p.local_rank, p.local_size, p.cross_rank, p.cross_size) for p in places] == [
        ("h1", 0, 2, 0, 2), ("h1", 1, 2, 0, 2), ("h2", 0, 2, 1, 2), ("h2", 1, 2, 1, 2)]  # fmt: skip
    # Names of this machine are one host, wherever they appear.
    places = place_ranks([("localhost", 1), ("h1", 1), ("127.0.0.1", 1)], 3)
    assert [(p.host, p.local_size, p.cross_rank) for p in places] == [
        ("localhost", 2, 0), ("localhost", 2, 0), ("h1", 1, 1)]  # fmt: skip
    with pytest.raises(UsageError, match="-np 5 needs 5 slots but the hosts h1:2,h2:2 give 4"):
        place_ranks([("h1", 2), ("h2", 2)], 5)


@pytest.mark.unit
def test_slurm_host_lists():
    assert expand_hostlist("node[01-03,07],gpu5") == ["node01", "node02", "node03", "node07", "gpu5"]
    assert expand_hostlist("a[9-11]-ib") == ["a9-ib", "a10-ib", "a11-ib"]
    assert expand_hostlist("10.213.7.[2-3]") == ["10.213.7.2", "10.213.7.3"]
    with pytest.raises(ValueError):
        expand_hostlist("node[a-b]")
    env = {"SLURM_PROCID": "3", "SLURM_NODEID": "1", "SLURM_JOB_NUM_NODES": "4",
           "SLURM_JOB_NODELIST": "cn[100-103]", "SLURM_JOB_ID": "123456"}  # fmt: skip
    assert node_defaults(env) == {"nnodes": "4", "node_rank": "1",
                                  "rdzv_endpoint": "cn100:29856"}  # fmt: skip
    # The batch script itself (no job step) is not per-node mode.
    assert node_defaults({"SLURM_JOB_ID": "1", "SLURM_JOB_NODELIST": "a"}) == {}


@pytest.mark.unit
def test_what_remote_ranks_get():
    """horovodrun's rule: the launcher's whole environment, less the deny list (this
    machine, this login, this shell), plus -x, which also forwards a denied name."""
    environ = {"PATH": "/venv/bin:/usr/bin", "PYTHONPATH": "/src", "HOROVOD_FUSION_THRESHOLD": "1",
               "HVD_TORCH_INLINE_THRESHOLD": "0", "HOME": "/root", "SECRET_TOKEN": "x",
               "DATA_DIR": "/data", "MY_FLAG": "on", "HOSTNAME": "launcher", "PWD": "/src",
               "OLDPWD": "/", "SHLVL": "2", "_": "/usr/bin/hvdrun", "SSH_AUTH_SOCK": "/tmp/a",
               "SSH_CONNECTION": "1 2 3 4", "DISPLAY": ":0", "BASH_FUNC_f%%": "() { :; }",
               "XDG_SESSION_ID": "3", "HOROVOD_SECRET_KEY": "old", "A-B": "not a name",
               "USER": "me"}  # fmt: skip
    env = forwarded_env(environ, {"MY_FLAG": None, "LR": "0.1", "ABSENT": None,
                                  "DISPLAY": None})  # fmt: skip
    assert env == {"PATH": "/venv/bin:/usr/bin", "PYTHONPATH": "/src",
                   "HOROVOD_FUSION_THRESHOLD": "1", "HVD_TORCH_INLINE_THRESHOLD": "0",
                   "SECRET_TOKEN": "x", "DATA_DIR": "/data", "MY_FLAG": "on", "LR": "0.1",
                   "DISPLAY": ":0"}  # fmt: skip


@pytest.mark.unit
def test_x_refuses_a_name_no_shell_can_export():
    with pytest.raises(UsageError, match="not a variable name"):
        parse_args(["-np", "2", "-x", "A-B=1", "python", "x.py"], {})


def _wrapper(tmp_path, command, env):
    """The wrapper ssh would run, started here through sh with its payload written."""
    argv, payload = remote_command("host", command, env, str(tmp_path), SshSettings())
    script = shlex.split(argv[-1])[2]  # "sh -c '<script>'"
    proc = subprocess.Popen(["sh", "-c", script], stdin=subprocess.PIPE,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE)  # fmt: skip
    proc.stdin.write(payload)
    proc.stdin.flush()
    return argv, proc


def test_remote_wrapper_gets_every_value_on_stdin_and_none_on_its_command_line(tmp_path):
    tricky = {"A": "it's here", "B": "two\nlines\n__hvd_env_end_x\n", "C": "$(touch boom) `x` \\",
              "D": "", "E": "x" * 100_000, "F": "caf\udce9 (not UTF-8)",
              "HOROVOD_SECRET_KEY": "5ec7e7" * 8}  # fmt: skip
    out = tmp_path / "env.json"
    rank = ("import json, os; json.dump({k: os.environ.get(k) for k in 'ABCDEF'} | "
            "{'S': os.environ['HOROVOD_SECRET_KEY'], 'cwd': os.getcwd()}, "
            f"open({str(out)!r}, 'w'))")  # fmt: skip
    argv, proc = _wrapper(tmp_path, [sys.executable, "-c", rank], tricky)
    try:
        assert proc.wait(timeout=30) == 0, proc.communicate()  # the channel stays open
    finally:
        proc.kill()
        proc.communicate()
    got = json.loads(out.read_text())
    assert got == {k: tricky[k] for k in "ABCDEF"} | {"S": tricky["HOROVOD_SECRET_KEY"],
                                                   "cwd": str(tmp_path)}  # fmt: skip
    assert not (tmp_path / "boom").exists()  # values are data, never run
    for value in ("it's here", "two", "5ec7e7", "x" * 100):
        assert all(value not in a for a in argv), argv


def test_remote_wrapper_without_its_environment_exits_125(tmp_path):
    argv, payload = remote_command("host", ["true"], {"A": "1"}, str(tmp_path), SshSettings())
    proc = subprocess.run(["sh", "-c", shlex.split(argv[-1])[2]], input=payload[:-20],
                          capture_output=True, timeout=30)  # fmt: skip
    assert proc.returncode == 125, proc


def test_remote_wrapper_stops_its_rank_when_the_channel_closes(tmp_path):
    """The wrapper ssh runs, run here through sh: it reads its environment from stdin,
    and kills the rank's whole group once stdin closes."""
    pidfile = tmp_path / "pids"
    rank = ("import os, subprocess, time; "
            "child = subprocess.Popen(['sleep', '60']); "
            f"open({str(pidfile)!r}, 'w').write(f'{{os.getpid()}} {{child.pid}} ' "
            "+ os.environ['HOROVOD_SECRET_KEY'] + ' ' + os.environ['A']); time.sleep(60)")  # fmt: skip
    _, proc = _wrapper(tmp_path, [sys.executable, "-c", rank],
                       {"A": "it's here", "HOROVOD_SECRET_KEY": "5ec7e7"})
    try:
        deadline = time.monotonic() + 30
        while not (pidfile.exists() and pidfile.read_text().count(" ") >= 3):
            assert time.monotonic() < deadline and proc.poll() is None, proc.communicate()
            time.sleep(0.05)
        pid, child, secret, value = pidfile.read_text().split(" ", 3)
        assert (secret, value) == ("5ec7e7", "it's here")
        proc.stdin.close()  # what hvdrun does to stop it, or a dropped connection
        assert proc.wait(timeout=10) == 128 + signal.SIGTERM
        for p in (int(pid), int(child)):  # the rank and what it started
            deadline = time.monotonic() + 5
            while os.path.exists(f"/proc/{p}") and time.monotonic() < deadline:
                time.sleep(0.05)
            stat = open(f"/proc/{p}/stat").read() if os.path.exists(f"/proc/{p}") else ""
            assert stat == "" or stat.rsplit(")", 1)[1].split()[0] == "Z", stat
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


@pytest.mark.unit
def test_the_kubernetes_recipe_parses(tmp_path):
    """examples/k8s_digits.yaml: a headless Service and an indexed Job whose pod
    command is a valid per-node hvdrun line for node 0's DNS name."""
    import shlex

    import yaml

    from hvdrun.launch import parse_args

    service, job = yaml.safe_load_all((ROOT / "examples" / "k8s_digits.yaml").read_text())
    assert service["kind"] == "Service" and service["spec"]["clusterIP"] == "None"
    spec = job["spec"]
    assert spec["completionMode"] == "Indexed" and spec["completions"] == spec["parallelism"] == 2
    pod = spec["template"]["spec"]
    assert pod["subdomain"] == service["metadata"]["name"]
    (container,) = pod["containers"]
    line = container["args"][0].replace('"$JOB_COMPLETION_INDEX"', "1")
    argv = shlex.split(line)
    assert argv[:2] == ["exec", ".venv/bin/hvdrun"]
    secret = tmp_path / "secret"
    secret.write_text("ab" * 32)
    argv = [a if a != "/etc/hvd-secret/secret" else str(secret) for a in argv[2:]]
    opts = parse_args(argv, environ={})
    assert (opts.node.nnodes, opts.node.node_rank, opts.node.nproc_per_node) == (2, 1, 2)
    assert (opts.node.host, opts.node.port) == ("hvd-digits-0.hvd-digits", 29400)
    assert opts.command[-3:] == ["examples/digits_allreduce.py", "--epochs", "10"]


@pytest.mark.unit
def test_the_slurm_recipe_parses():
    """examples/slurm_digits.sbatch: its srun line, as each node's hvdrun sees it
    under the job step's SLURM_* variables."""
    import shlex

    from hvdrun.launch import parse_args

    text = (ROOT / "examples" / "slurm_digits.sbatch").read_text().replace("\\\n", " ")
    (line,) = [x for x in text.splitlines() if x.startswith("srun ")]
    argv = shlex.split(line)
    assert argv[:2] == ["srun", "--ntasks-per-node=1"] and argv[2] == "hvdrun"
    env = {"SLURM_PROCID": "1", "SLURM_NODEID": "1", "SLURM_JOB_NUM_NODES": "2",
           "SLURM_JOB_NODELIST": "cn[07-08]", "SLURM_JOB_ID": "5003",
           "HVD_TORCH_SECRET": "cd" * 32}  # fmt: skip
    opts = parse_args(argv[3:], environ=env)
    assert (opts.node.nnodes, opts.node.node_rank, opts.node.nproc_per_node) == (2, 1, 2)
    assert (opts.node.host, opts.node.port) == ("cn07", 29403)
    assert "#SBATCH --nodes=2" in text and "export HVD_TORCH_SECRET" in text


def test_the_ray_driver_loads_neither_torch_nor_hvd_torch(tmp_path):
    # The driver's modules reach the launcher as hvdrun (never through hvd_torch,
    # whose import loads torch and _C): a driver that only
    # schedules actors pays for neither, and works where torch cannot load.
    fake = tmp_path / "torch"
    fake.mkdir()
    (fake / "__init__.py").write_text("raise ImportError('torch is not available here')\n")
    env = dict(os.environ, PYTHONPATH=f"{tmp_path}{os.pathsep}{ROOT}")
    check = subprocess.run(
        [sys.executable, "-c", "import sys, ray_integration.executor, ray_integration.elastic, "
         "ray_integration.elastic_launcher; "
         "print(sorted(m for m in sys.modules if m.startswith(('torch', 'hvd_torch'))))"],
        env=env, capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert check.returncode == 0, check.stderr
    assert check.stdout.strip() == "[]", check


@pytest.mark.unit
def test_elastic_store_binds_what_static_mode_binds():
    """With a remote host the elastic store listens on the one address this machine
    reaches it from, as static mode's does, not on every interface (issue #44);
    only a discovery script with no remote host yet leaves it on 0.0.0.0."""
    from hvdrun.discovery import FixedHosts
    from hvdrun.elastic_launch import _store_bind
    from hvdrun.network import route_source_address

    towards = route_source_address("127.0.0.2")  # a name that is not this machine's
    assert _store_bind(FixedHosts({"127.0.0.2": 2}), None) == (towards, towards)
    assert _store_bind(lambda: {"localhost": 1, "127.0.0.2": 1}, None) == (towards, towards)
    assert _store_bind(FixedHosts({"localhost": 2}), None) == ("127.0.0.1", "127.0.0.1")
    assert _store_bind(lambda: {"localhost": 2}, None) == ("0.0.0.0", "127.0.0.1")
