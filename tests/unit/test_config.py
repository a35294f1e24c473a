"""One reader of the environment per layer: hvd_torch/config.py for the Python API,
hvdrun/config.py for the launcher (the engine's is EngineConfig::fromEnvironment).

No other module of either package reads os.environ, each reader lists every
variable its snapshots read with a meaning, and the snapshots parse as the call
sites did before them (docs/architecture.md, "Configuration")."""

from __future__ import annotations

import ast
import dataclasses
import logging
import sys
from pathlib import Path

import pytest

from hvd_torch import config, horovod_env, log
from hvdrun import config as launcher_config
from hvdrun.args import UsageError
from hvdrun.launch import parse_args
from hvdrun.slurm import node_defaults
from hvdrun.ssh import SshSettings
from hvdrun.store import StoreError, StoreLimits

ROOT = Path(__file__).resolve().parents[2]
READERS = {"hvd_torch": ROOT / "hvd_torch" / "config.py", "hvdrun": ROOT / "hvdrun" / "config.py"}
_OS_READS = {"environ", "environb", "getenv", "getenvb"}


def _parents(tree: ast.AST) -> dict[ast.AST, ast.AST]:
    return {child: node for node in ast.walk(tree) for child in ast.iter_child_nodes(node)}


def _not_a_read(node: ast.AST, parents: dict) -> bool:
    """os.environ used other than to read a variable: a write (update, item
    assignment or deletion), or a whole copy for a child process (dict(os.environ),
    {**os.environ, ...}, or hvdrun/env.py's forwarded_env(os.environ, ...))."""
    parent = parents.get(node)
    if isinstance(parent, ast.Attribute) and parent.attr == "update":
        return isinstance(parents.get(parent), ast.Call) and parents[parent].func is parent
    if isinstance(parent, ast.Subscript) and parent.value is node:
        return isinstance(parent.ctx, (ast.Store, ast.Del))
    if isinstance(parent, ast.Call) and isinstance(parent.func, ast.Name):
        if parent.func.id == "dict":
            return parent.args == [node] and not parent.keywords
        if parent.func.id == "forwarded_env":
            return bool(parent.args) and parent.args[0] is node
    if isinstance(parent, ast.Dict):
        return any(k is None and v is node for k, v in zip(parent.keys, parent.values))
    return False


def stray_reads(source: str, where: str) -> list[str]:
    """Every read of the environment in source: os.environ (other than _not_a_read)
    or os.getenv, under any name os is imported as, or environ/getenv imported from os."""
    tree = ast.parse(source)
    parents = _parents(tree)
    aliases = {a.asname or a.name for n in ast.walk(tree) if isinstance(n, ast.Import)
               for a in n.names if a.name == "os"}
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.module == "os":
            found += [(node.lineno, f"{where}:{node.lineno}: from os import {a.name}")
                      for a in node.names if a.name in _OS_READS]
        elif (isinstance(node, ast.Attribute) and node.attr in _OS_READS
              and isinstance(node.value, ast.Name) and node.value.id in aliases):
            if node.attr.startswith("environ") and _not_a_read(node, parents):
                continue
            use = parents.get(node, node)
            if isinstance(use, ast.Attribute) and isinstance(parents.get(use), ast.Call):
                use = parents[use]  # os.environ.get(...): show the call
            text = ast.get_source_segment(source, use)
            found.append((node.lineno, f"{where}:{node.lineno}: {text}"))
    return [text for _, text in sorted(found)]


def test_the_scan_tells_reads_from_writes_and_copies():
    reads = ["os.environ.get('A')", "os.environ['A']", "'A' in os.environ", "os.getenv('A')",
             "env = os.environ", "f(os.environ)", "os.environ.items()"]
    others = ["os.environ.update(x)", "os.environ['A'] = '1'", "del os.environ['A']",
              "dict(os.environ)", "{**os.environ, 'A': '1'}", "forwarded_env(os.environ, x)"]
    for line in reads:
        assert stray_reads(f"import os\n{line}\n", "x.py"), line
    for line in others:
        assert not stray_reads(f"import os\n{line}\n", "x.py"), line
    assert stray_reads("import os as o\no.environ.get('A')\n", "x.py")
    assert stray_reads("from os import environ\n", "x.py")


@pytest.mark.parametrize("package", sorted(READERS))
def test_only_the_reader_reads_the_environment(package):
    found = []
    for path in sorted((ROOT / package).rglob("*.py")):
        if path != READERS[package]:
            found += stray_reads(path.read_text(), str(path.relative_to(ROOT)))
    assert not found, (
        f"these read the environment outside {READERS[package].relative_to(ROOT)}: take the "
        "value from a snapshot there instead (a new variable is listed in its VARIABLES, "
        "with its meaning):\n  " + "\n  ".join(found))


@pytest.mark.parametrize("reader", [config, launcher_config], ids=["hvd_torch", "hvdrun"])
def test_each_listed_variable_is_read_and_each_read_is_listed(reader):
    snapshots = [c for c in vars(reader).values() if isinstance(c, type)
                 and issubclass(c, launcher_config.Snapshot) and dataclasses.is_dataclass(c)
                 and c.__module__ == reader.__name__]
    assert snapshots
    read = {name for c in snapshots for name in c.variables()}
    assert read == set(reader.VARIABLES), "listed but never read, or read but not listed"
    assert all(meaning.strip() for meaning in reader.VARIABLES.values())


def test_the_launchers_reader_imports_only_the_standard_library():
    tree = ast.parse(READERS["hvdrun"].read_text())
    modules = {a.name for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names}
    modules |= {n.module for n in ast.walk(tree) if isinstance(n, ast.ImportFrom)}
    assert {m.split(".")[0] for m in modules} <= set(sys.stdlib_module_names)


def test_horovod_env_honours_every_horovod_variable_the_python_layer_reads():
    for name, meaning in config.VARIABLES.items():
        if name.startswith("HOROVOD_"):
            assert horovod_env.HONOURED[name] == meaning
    assert config.horovod_variables({"HOROVOD_RANK": "1", "RANK": "1"}) == {"HOROVOD_RANK": "1"}


def test_a_snapshot_reads_the_environment_when_it_is_taken(monkeypatch):
    monkeypatch.setenv("HOROVOD_GPU_OPERATIONS", " gloo ")
    gpu = config.Gpu.from_environment()
    monkeypatch.setenv("HOROVOD_GPU_OPERATIONS", "nccl")
    assert gpu.requested_operations == "GLOO"
    assert config.Gpu.from_environment().requested_operations == "NCCL"
    monkeypatch.delenv("HOROVOD_GPU_OPERATIONS")
    assert config.Gpu.from_environment().operations is None
    # A bad value is refused where it is used, never by from_environment().
    config.Launch.from_environment({"RANK": "one", "MASTER_PORT": "x",
                                    "HOROVOD_START_TIMEOUT": "?"})


def test_torchruns_variables():
    launch = config.Launch.from_environment({"RANK": "1", "WORLD_SIZE": "4"})
    assert launch.torchrun and launch.torchrun_rank_size() == (1, 4)
    assert not config.Launch.from_environment({"RANK": "1", "WORLD_SIZE": "4",
                                               "HOROVOD_RANK": "1"}).torchrun
    assert not config.Launch.from_environment({"RANK": "1", "WORLD_SIZE": "4",
                                               "HVD_TORCH_ELASTIC_WORKER_ID": "w0"}).torchrun
    with pytest.raises(ValueError, match=r"RANK='one' and WORLD_SIZE='4' must be integers"):
        config.Launch.from_environment({"RANK": "one", "WORLD_SIZE": "4"}).torchrun_rank_size()
    with pytest.raises(ValueError, match=r"RANK=4 is not in \[0, WORLD_SIZE=4\)"):
        config.Launch.from_environment({"RANK": "4", "WORLD_SIZE": "4"}).torchrun_rank_size()
    with pytest.raises(ValueError, match=r"MASTER_ADDR/MASTER_PORT are not \('MASTER_PORT'\)"):
        config.Launch.from_environment({"MASTER_ADDR": "h"}).torchrun_master()
    assert config.Launch(master_addr="h", master_port="29500").torchrun_master() == ("h", 29500)
    assert config.Launch().start_timeout_s() == 30.0
    assert config.Launch(start_timeout="12.5").start_timeout_s() == 12.5
    for bad in ("soon", "0", "-3", "nan"):
        with pytest.raises(ValueError, match=rf"HOROVOD_START_TIMEOUT='{bad}': expected a "
                                             "positive number of seconds"):  # fmt: skip
            config.Launch(start_timeout=bad).start_timeout_s()
    assert config.Launch().attempt == "0" and not config.Launch(use_agent_store="1").agent_store

    given = dict(RANK="3", WORLD_SIZE="4", LOCAL_RANK="1", LOCAL_WORLD_SIZE="2", GROUP_RANK="1")
    assert config.Launch.from_environment(given).torchrun_topology(3, 4) == dict(
        local_rank=1, local_size=2, cross_rank=1, cross_size=2)
    assert config.Launch.from_environment(given).torchrun_topology(2, 4) is None  # not this rank


def test_an_elastic_workers_store_and_timeout():
    worker = config.ElasticWorker.from_environment({"HOROVOD_GLOO_RENDEZVOUS_PORT": "7"})
    with pytest.raises(KeyError, match="HOROVOD_GLOO_RENDEZVOUS_ADDR"):
        worker.store()
    assert worker.timeout_s() == 630.0
    worker = config.ElasticWorker(store_addr="h", store_port="7", secret_key="ab", timeout="5")
    assert worker.store() == ("h", 7, "ab") and worker.timeout_s() == 5.0


def test_logging_and_gpu_values():
    assert log.level_from_env({"HOROVOD_LOG_LEVEL": " Debug "}) == logging.DEBUG
    assert log.level_from_env({}) == logging.WARNING
    with pytest.raises(ValueError, match=r"HOROVOD_LOG_LEVEL='loud' is not a log level"):
        log.level_from_env({"HOROVOD_LOG_LEVEL": "loud"})
    assert [config.Logging(hide_time_flag=v).hide_time for v in (None, "", "0", "1")] == [
        False, False, False, True]
    gpu = config.Gpu(visible_devices="3, 1")
    assert [gpu.physical_gpu(d) for d in (0, 1, 2)] == ["3", "1", "2"]


def test_the_launchers_values():
    launch = launcher_config.Launch.from_environment({"HVD_TORCH_SSH_STRICT": " 1 "})
    assert launch.host_key_checking() == "yes"
    assert launcher_config.Launch().host_key_checking() == "accept-new"
    slurm = launcher_config.Slurm.from_environment(
        {"SLURM_PROCID": "0", "SLURM_NODEID": "1", "SLURM_NNODES": "2", "SLURM_JOB_ID": ""})
    assert slurm.in_job_step and slurm.nodes == "2" and slurm.job_number() == 0
    assert node_defaults({"SLURM_NODEID": "1"}) == {}  # the batch script, not a job step

    limits = StoreLimits.for_job(8, {"HVD_TORCH_STORE_AUTH_TIMEOUT": " 2.5 "})
    assert (limits.auth_timeout, limits.max_clients) == (2.5, 4 * 8 + 64)
    with pytest.raises(StoreError, match="HVD_TORCH_STORE_MAX_FRAME must be a positive integer, "
                                         "got 'big'"):
        StoreLimits.for_job(8, {"HVD_TORCH_STORE_MAX_FRAME": "big"})

    node = ["--nnodes", "1", "--node-rank", "0", "--rdzv-endpoint", "h:7", "python"]
    with pytest.raises(UsageError, match="HVD_TORCH_SECRET: the secret must be hex digits"):
        parse_args(node, environ={"HVD_TORCH_SECRET": "zz"})
    opts = parse_args(node, environ={"HVD_TORCH_SECRET": "ab" * 16, "HOROVOD_GLOO_IFACE": "eth1"})
    assert opts.node.secret == b"\xab" * 16 and opts.iface == "eth1"


def test_ssh_reads_strict_host_keys_per_connection(monkeypatch):
    monkeypatch.delenv("HVD_TORCH_SSH_STRICT", raising=False)
    settings = SshSettings()
    assert "StrictHostKeyChecking=accept-new" in settings.base_command("h")
    monkeypatch.setenv("HVD_TORCH_SSH_STRICT", "0")
    assert "StrictHostKeyChecking=no" in settings.base_command("h")
