"""Per-node launch: one hvdrun per namespace host, as Slurm or Kubernetes would start
them, rendezvousing through node 0's store (hvdrun/node_launch.py).

The "scheduler" here is `ip netns exec <host> hvdrun ...`, once per host.  Skipped
where namespaces cannot be made (not root); the argument checks run everywhere.
"""

import json
import os
import secrets
import signal
import time

import pytest

from multihost_harness import cluster, finish, launcher_env, rank_lines, spawn

TOPOLOGY = """
import json, os, torch, hvd_torch as hvd
from hvdrun.network import route_source_address
hvd.init()
total = hvd.allreduce(torch.tensor([float(hvd.rank() + 1)]), op=hvd.Sum).item()
hosts = hvd.allgather_object(route_source_address(os.environ["HOROVOD_GLOO_RENDEZVOUS_ADDR"]))
print(json.dumps(dict(rank=hvd.rank(), size=hvd.size(), local_rank=hvd.local_rank(),
    cross_rank=hvd.cross_rank(), cross_size=hvd.cross_size(), total=total, hosts=hosts)))
"""


def _nodes(hosts, per_node_args, command, extra_env=None, timeout=240):
    """Starts one hvdrun per host (per_node_args(i) gives node i's flags); returns
    the Runs, node 0 first."""
    secret = secrets.token_hex(32)
    procs = []
    started = time.monotonic()
    try:
        for i, name in enumerate(hosts.names):
            env = launcher_env(HVD_TORCH_SECRET=secret, **(extra_env(i) if extra_env else {}))
            procs.append(spawn(["hvdrun", *per_node_args(i), *command], env,
                               netns=hosts.namespace(name)))  # fmt: skip
        return [finish(p, timeout, started) for p in procs]
    finally:
        for p in procs:
            if p.poll() is None:
                os.killpg(p.pid, signal.SIGKILL)
                p.wait()


def _flags(hosts, port=29411):
    endpoint = f"{hosts.address(hosts.names[0])}:{port}"
    return lambda i: ["--nnodes", str(len(hosts.names)), "--node-rank", str(i),
                      "--nproc-per-node", "2", "--rdzv-endpoint", endpoint]  # fmt: skip


def test_two_nodes_train_digits_to_identical_weights(tmp_path):
    with cluster(tmp_path, ["a", "b"]) as hosts:
        runs = _nodes(hosts, _flags(hosts),
                      ["python", "examples/digits_allreduce.py", "--epochs", "8"])  # fmt: skip
    for run in runs:
        assert run.code == 0, run
    lines = rank_lines(runs[0].out, 0)
    assert any("all 4 ranks hold identical weights" in line for line in lines), runs[0]
    accuracy = float(lines[-2].split("test accuracy")[1].split("%")[0])
    assert accuracy > 85, runs[0]
    # Node 1 ran ranks 2 and 3 (their errors would show there), node 0 ranks 0 and 1.
    assert "[2]<" not in runs[0].out and "[0]<" not in runs[1].out


def _check_topology(hosts, runs):
    a, b = hosts.address("a"), hosts.address("b")
    for node, run in enumerate(runs):
        assert run.code == 0, run
        for rank in (2 * node, 2 * node + 1):
            (line,) = rank_lines(run.out, rank)
            rep = json.loads(line)
            assert rep["size"] == 4 and rep["local_rank"] == rank % 2
            assert (rep["cross_rank"], rep["cross_size"]) == (node, 2)
            assert rep["total"] == 10 and rep["hosts"] == [a, a, b, b]


def test_two_nodes_topology(tmp_path):
    with cluster(tmp_path, ["a", "b"]) as hosts:
        runs = _nodes(hosts, _flags(hosts, 29412), ["python", "-c", TOPOLOGY], timeout=120)
        _check_topology(hosts, runs)


def test_under_simulated_slurm_no_flags_but_nproc(tmp_path):
    # What srun gives each task of `srun --nodes 2 --ntasks-per-node 1 hvdrun ...`.
    job_id = 4242

    def slurm_env(i):
        return {
            "SLURM_JOB_ID": str(job_id), "SLURM_PROCID": str(i), "SLURM_NODEID": str(i),
            "SLURM_JOB_NUM_NODES": "2", "SLURM_JOB_NODELIST": "10.213.7.[2-3]",
            "SLURM_NTASKS_PER_NODE": "1",
        }  # fmt: skip

    with cluster(tmp_path, ["a", "b"]) as hosts:
        runs = _nodes(hosts, lambda i: ["--nproc-per-node", "2", "--verbose"],
                      ["python", "-c", TOPOLOGY], extra_env=slurm_env, timeout=120)  # fmt: skip
        _check_topology(hosts, runs)
        port = 29400 + job_id % 1000
        assert f"node 0: store listening on {hosts.address('a')}:{port}" in runs[0].err, runs[0]


FAIL_ON_RANK_3 = """
import os, sys, time, torch, hvd_torch as hvd
hvd.init()
hvd.allreduce(torch.ones(3))
if hvd.rank() == 3:
    sys.exit(3)
deadline = time.monotonic() + 120
while time.monotonic() < deadline:
    hvd.allreduce(torch.ones(3))
    time.sleep(0.01)
"""


def test_a_failing_rank_stops_every_node_naming_it(tmp_path):
    with cluster(tmp_path, ["a", "b"]) as hosts:
        runs = _nodes(hosts, _flags(hosts, 29413), ["python", "-c", FAIL_ON_RANK_3], timeout=90)
        host_b = runs[1]
        assert host_b.code != 0, host_b
        assert "rank 3 on host vm exited with code 3" in host_b.err.replace(
            os.uname().nodename, "vm"), host_b
        # Node 0's ranks lose their peer and fail too; node 0 names the cause on node 1.
        assert runs[0].code != 0, runs[0]
        assert "the failure started on node 1: rank 3 on host" in runs[0].err, runs[0]
        deadline = time.monotonic() + 10
        while (hosts.pids("a") or hosts.pids("b")) and time.monotonic() < deadline:
            time.sleep(0.1)
        assert hosts.pids("a") == [] and hosts.pids("b") == []


def test_missing_node_is_named_within_the_start_timeout(tmp_path):
    with cluster(tmp_path, ["a", "b"]) as hosts:
        endpoint = f"{hosts.address('a')}:29414"
        env = launcher_env(HVD_TORCH_SECRET=secrets.token_hex(32))
        proc = spawn(["hvdrun", "--nnodes", "2", "--node-rank", "0", "--nproc-per-node", "1",
                      "--rdzv-endpoint", endpoint, "--start-timeout", "3", "python", "-c", "1"],
                     env, netns=hosts.namespace("a"))  # fmt: skip
        run = finish(proc, 30)
        assert run.code == 1 and run.seconds < 10, run
        assert "node(s) 1 did not check in" in run.err, run


@pytest.mark.parametrize(
    "argv, env, message",
    [
        (["--nnodes", "2", "--node-rank", "0", "--rdzv-endpoint", "h:1"], {},
         "needs the job's secret"),
        (["--nnodes", "2", "--node-rank", "2", "--rdzv-endpoint", "h:1"],
         {"HVD_TORCH_SECRET": "ab" * 16}, "--node-rank 2 is outside"),
        (["--nnodes", "2", "--node-rank", "0"], {"HVD_TORCH_SECRET": "ab" * 16},
         "needs --rdzv-endpoint"),
        (["--nnodes", "2", "--node-rank", "0", "--rdzv-endpoint", "h:1"],
         {"HVD_TORCH_SECRET": "xyz"}, "must be hex digits"),
        (["--nnodes", "2", "--node-rank", "0", "--rdzv-endpoint", "h"],
         {"HVD_TORCH_SECRET": "ab" * 16}, "HOST:PORT"),
    ],
)  # fmt: skip
def test_per_node_usage_errors(argv, env, message, capsys):
    from hvdrun.launch import UsageError, parse_args

    base = {k: v for k, v in os.environ.items() if not k.startswith(("SLURM_", "HVD_TORCH_"))}
    with pytest.raises(UsageError, match=message.replace("(", r"\(").replace(")", r"\)")):
        parse_args([*argv, "python", "x.py"], environ=dict(base, **env))


def test_secret_file(tmp_path):
    from hvdrun.launch import parse_args

    secret = secrets.token_hex(32)
    (tmp_path / "s").write_text(secret + "\n")
    opts = parse_args(["--nnodes", "1", "--node-rank", "0", "--rdzv-endpoint", "h:7",
                       "--rdzv-secret-file", str(tmp_path / "s"), "python", "x.py"], environ={})  # fmt: skip
    assert opts.node.secret.hex() == secret and opts.node.port == 7
