"""hvdrun: start the ranks of a job, horovodrun-style (gloo mode).

    hvdrun -np 4 python train.py                                   this machine
    hvdrun -np 4 -H server1:2,server2:2 python train.py            over ssh (static_launch.py)
    hvdrun --nnodes 2 --node-rank 0 --nproc-per-node 2 \\
           --rdzv-endpoint server1:29400 python train.py            one per node (node_launch.py)
    hvdrun --min-np 2 --host-discovery-script ./hosts.sh python train.py
                                                           elastic (elastic_launch.py)

This module parses the command line and hands the job to the launcher of its mode.
Standard library only (the package does not import torch): hvdrun starts on a machine
without torch, and in a second instead of the several torch's import takes.

horovodrun flags we do not implement are refused, never ignored: a silently ignored
--fusion-threshold-mb would run a different job from the one the user asked for.
"""

from __future__ import annotations

import dataclasses
import re
import subprocess
import sys

from . import config
from .args import ENGINE_FLAGS, ENGINE_VALUED, UsageError, engine_env, positive_float, positive_int
from .elastic_launch import parse_elastic_options, run_elastic
from .hosts import parse_host_list, parse_hostfile, place_ranks
from .node_launch import parse_node_options, run_node
from .output import PROG
from .ssh import SshSettings
from .static_launch import StaticJob, run_static

__all__ = ["Options", "UsageError", "main", "parse_args"]

USAGE = f"""\
usage: {PROG} -np N [-H HOSTS | --hostfile F] [options] command [args...]
       {PROG} --nnodes N --node-rank R --nproc-per-node P --rdzv-endpoint HOST:PORT command ...
       {PROG} [-np N] --min-np N [--max-np N] [--host-discovery-script S | -H HOSTS] command ...

  -np, --num-proc N       number of ranks
  -H, --hosts HOSTS       host:slots list, e.g. server1:2,server2:2 (default localhost:N);
                          ranks fill hosts in order; other hosts are reached over ssh
  --hostfile F            hosts from a file, one `host slots=N` line each (also -hostfile)
  -p, --ssh-port PORT     ssh port of the remote hosts
  -i, --ssh-identity-file F  ssh private key for the remote hosts
  --ssh-known-hosts-file F  the known_hosts file ssh checks and records host keys in
                          (default ssh's own; HVD_TORCH_SSH_STRICT sets the check)
  --network-interface IF  the NIC for the store, the control plane and Gloo
                          (also HOROVOD_GLOO_IFACE; the same name on every host);
                          --network-interfaces is the same, with one name
  -x, --env NAME[=VALUE]  set NAME for every rank, or forward this machine's NAME even
                          where the deny list keeps it (remote ranks get this shell's
                          environment less HOSTNAME, HOME, SSH_*, ...); repeatable
  --gloo                  accepted for horovodrun compatibility (always gloo)
  --verbose               print the store address and each rank's command
  --output-filename DIR   also write each rank's output to DIR/rank.N/stdout and stderr
  --log-level LEVEL       HOROVOD_LOG_LEVEL for the ranks: trace, debug, info, warning,
                          error or fatal (the engine's and the hvd_torch logger's level)
  --log-without-timestamp log lines without the time (HOROVOD_LOG_HIDE_TIME=1;
                          --log-hide-timestamp is the same; --log-with-timestamp undoes it)
  -cb, --check-build      print what hvd-torch was built with and check the installation
                          (python -m hvd_torch.doctor), then exit
  --start-timeout S       seconds ranks may take to rendezvous, and the bound on the
                          ssh reachability check (HOROVOD_START_TIMEOUT; default 30)
  -h, --help              show this help

timeline and autotune (docs/toolbox.md):
  --timeline-filename F   rank 0 writes a Chrome-trace timeline to F (HOROVOD_TIMELINE)
  --timeline-mark-cycles  mark each batch of dispatched responses (HOROVOD_TIMELINE_MARK_CYCLES)
  --autotune              tune the fusion and inline thresholds online (HOROVOD_AUTOTUNE)
  --autotune-log-file F   CSV of the autotuner's trials (HOROVOD_AUTOTUNE_LOG)
  --autotune-warmup-samples N, --autotune-steps-per-sample N,
  --autotune-bayes-opt-max-samples N (most trials),
  --autotune-gaussian-process-noise X (accepted, unused): HOROVOD_AUTOTUNE_* as named

hierarchical collectives across hosts (docs/compat.md, "Environment variables"):
  --hierarchical-allreduce, --no-hierarchical-allreduce,
  --hierarchical-allgather, --no-hierarchical-allgather
                          HOROVOD_HIERARCHICAL_ALLREDUCE / _ALLGATHER = 1 / 0 for the
                          ranks (default on where a host has 2+ of a set's ranks)

per-node mode (a scheduler starts one hvdrun per node; docs/multihost.md):
  --nnodes N              number of nodes (default: SLURM_JOB_NUM_NODES under srun)
  --node-rank R           this node's index, 0..N-1 (default: SLURM_NODEID)
  --nproc-per-node P      ranks on each node (default 1)
  --rdzv-endpoint H:PORT  where node 0 serves the store (default under srun: the first
                          node of SLURM_JOB_NODELIST, port 29400 + SLURM_JOB_ID % 1000)
  --rdzv-secret-file F    file holding the job's secret (hex); else HVD_TORCH_SECRET

elastic mode (any of --min-np, --max-np, --host-discovery-script; docs/elastic.md):
  --min-np N              fewest workers to train with (default: -np; also --min-num-proc)
  --max-np N              most workers to train with (default: every slot; also
                          --max-num-proc)
  --host-discovery-script S  command printing one host[:slots] line per available
                          host, run every second (default: the -H list, or
                          localhost with -np slots); hosts other than this machine
                          get their workers over ssh
  --slots-per-host N      slots of a discovered host printed without :slots (also --slots)
  --reset-limit N         end the job when a (N+1)-th reset would be needed
  --elastic-timeout S     longest wait for --min-np slots or for workers to join
                          a round (default 600)
"""

# horovodrun flags that we know and do not implement yet.
_UNSUPPORTED = {
    "--mpi", "--jsm", "--mpi-args", "--blacklist-cooldown-range", "--tcp",
    "--prefix-output-with-timestamp", "--config-file",
    "--disable-cache", "--fusion-threshold-mb", "--cycle-time-ms",
    "--cache-capacity", "--no-stall-check",
    "--stall-check-warning-time-seconds", "--stall-check-shutdown-time-seconds",
    "--mpi-threads-disable", "--num-nccl-streams", "--thread-affinity",
    "--gloo-timeout-seconds", "--nics", "--binding-args",
    "--version", "-v",
}  # fmt: skip

# Supported options taking a value, by Options.values key.
_VALUED = {
    "-np": "num_proc",
    "--num-proc": "num_proc",
    "-H": "hosts",
    "--hosts": "hosts",
    "-hostfile": "hostfile",
    "--hostfile": "hostfile",
    "-p": "ssh_port",
    "--ssh-port": "ssh_port",
    "-i": "ssh_identity_file",
    "--ssh-identity-file": "ssh_identity_file",
    "--ssh-known-hosts-file": "ssh_known_hosts_file",
    "--network-interface": "iface",
    "--network-interfaces": "iface",
    "--start-timeout": "start_timeout",
    "--output-filename": "output_filename",
    "--log-level": "log_level",
    # per-node mode (node_launch.py)
    "--nnodes": "nnodes",
    "--node-rank": "node_rank",
    "--nproc-per-node": "nproc_per_node",
    "--rdzv-endpoint": "rdzv_endpoint",
    "--rdzv-secret-file": "rdzv_secret_file",
    # elastic mode (elastic_launch.py)
    "--min-np": "min_np",
    "--min-num-proc": "min_np",
    "--max-np": "max_np",
    "--max-num-proc": "max_np",
    "--host-discovery-script": "discovery_script",
    "--slots-per-host": "slots_per_host",
    "--slots": "slots_per_host",
    "--reset-limit": "reset_limit",
    "--elastic-timeout": "elastic_timeout",
}
_REPEATED = {"-x": "env", "--env": "env"}
_FLAGS = {"--gloo", "--verbose"}  # --gloo: we always are
# Flags that set a variable for every rank.
_ENV_FLAGS = {
    "--log-without-timestamp": ("HOROVOD_LOG_HIDE_TIME", "1"),
    "--log-hide-timestamp": ("HOROVOD_LOG_HIDE_TIME", "1"),
    "--log-with-timestamp": ("HOROVOD_LOG_HIDE_TIME", "0"),
}
# csrc/core/log.h's levels (hvd_torch/log.py has the same list; hvdrun imports no torch).
LOG_LEVELS = ("trace", "debug", "info", "warning", "error", "fatal")


@dataclasses.dataclass
class Options:
    num_proc: int | None  # None in elastic and per-node mode
    command: list[str]
    verbose: bool = False
    start_timeout: float | None = None
    elastic: object | None = None  # elastic_launch.ElasticOptions in elastic mode
    node: object | None = None  # node_launch.NodeOptions in per-node mode
    static: StaticJob | None = None  # the job in static mode
    ssh: SshSettings = dataclasses.field(default_factory=SshSettings)
    iface: str | None = None
    extra_env: dict[str, str | None] = dataclasses.field(default_factory=dict)
    output_filename: str | None = None  # --output-filename DIR
    check_build: bool = False  # -cb/--check-build: run the doctor, start no job


def parse_args(argv: list[str], environ=None) -> Options | None:
    """Options, or None when help was asked for; the variables hvdrun reads come from
    environ (None: os.environ; hvdrun/config.py).  Raises UsageError."""
    values: dict[str, str] = {}
    repeated: dict[str, list[str]] = {}
    flags: set[str] = set()
    engine_values: dict[str, str] = {}
    i = 0
    while i < len(argv):
        arg = argv[i]
        if arg == "--":
            i += 1
            break
        if not arg.startswith("-") or arg == "-":
            break  # the command starts here; everything after belongs to it
        name, eq, inline = arg.partition("=")
        if name in ("-h", "--help"):
            return None
        if name in ("-cb", "--check-build"):
            return Options(num_proc=None, command=[], check_build=True)
        if name in _UNSUPPORTED:
            raise UsageError(f"{name} is not supported yet by {PROG}")
        if name in _VALUED or name in _REPEATED or name in ENGINE_VALUED:
            if not eq:
                if i + 1 >= len(argv):
                    raise UsageError(f"{name} needs a value")
                i += 1
                inline = argv[i]
            if name in _VALUED:
                values[_VALUED[name]] = inline
            elif name in ENGINE_VALUED:
                engine_values[name] = inline
            else:
                repeated.setdefault(_REPEATED[name], []).append(inline)
        elif name in _FLAGS or name in ENGINE_FLAGS or name in _ENV_FLAGS:
            if eq:
                raise UsageError(f"{name} takes no value")
            flags.add(name)
        else:
            raise UsageError(f"unknown option {name} (not a horovodrun flag {PROG} supports)")
        i += 1
    command = argv[i:]
    opts = Options(num_proc=None, command=command, verbose="--verbose" in flags)
    if "num_proc" in values:
        opts.num_proc = positive_int("-np/--num-proc", values["num_proc"])
    if "start_timeout" in values:
        opts.start_timeout = positive_float("--start-timeout", values["start_timeout"])
    opts.ssh = SshSettings(
        port=positive_int("--ssh-port", values["ssh_port"]) if "ssh_port" in values else None,
        identity_file=values.get("ssh_identity_file"),
        known_hosts_file=values.get("ssh_known_hosts_file"),
        connect_timeout=min(10.0, opts.start_timeout or 10.0),
    )
    launch = config.Launch.from_environment(environ)
    try:
        launch.host_key_checking()  # refused here, before any host is reached
    except ValueError as e:
        raise UsageError(str(e)) from None
    opts.iface = _interface(values.get("iface") or launch.iface or None)
    for item in repeated.get("env", []):
        key, eq, value = item.partition("=")
        if not key:
            raise UsageError(f"-x needs NAME or NAME=VALUE, got {item!r}")
        if not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", key):
            raise UsageError(f"-x {item!r}: {key!r} is not a variable name a shell can export "
                             "(letters, digits and _, not starting with a digit)")
        opts.extra_env[key] = value if eq else None
    opts.extra_env.update(engine_env(engine_values, flags & set(ENGINE_FLAGS)))
    _log_options(values, flags, opts.extra_env)
    opts.output_filename = values.get("output_filename")
    if "hosts" in values and "hostfile" in values:
        raise UsageError("give either -H/--hosts or --hostfile, not both")
    if "hostfile" in values:
        values["hosts"] = ",".join(f"{h}:{s}" for h, s in parse_hostfile(values["hostfile"]))

    opts.node = parse_node_options(values, opts.num_proc, environ)
    opts.elastic = parse_elastic_options(values, opts.num_proc)
    if opts.node is not None and opts.elastic is not None:
        raise UsageError("per-node flags (--nnodes, ...) and elastic flags cannot be mixed")
    if opts.num_proc is None and opts.elastic is None and opts.node is None:
        raise UsageError("-np/--num-proc is required")
    if not command:
        raise UsageError("no command given to run")
    if opts.output_filename is not None and opts.elastic is not None:
        raise UsageError("--output-filename is not supported in elastic mode yet (a worker's "
                         "rank changes from round to round)")
    if opts.elastic is None and opts.node is None:
        hosts = parse_host_list(values.get("hosts") or f"localhost:{opts.num_proc}")
        opts.static = StaticJob(
            placements=place_ranks(hosts, opts.num_proc), command=command,
            verbose=opts.verbose, start_timeout=opts.start_timeout, ssh=opts.ssh,
            iface=opts.iface, extra_env=opts.extra_env, output_filename=opts.output_filename,
        )  # fmt: skip
    return opts


def _log_options(values: dict[str, str], flags: set[str], extra_env: dict) -> None:
    """--log-level and the timestamp flags become variables every rank gets (like -x)."""
    if "log_level" in values:
        level = values["log_level"].strip().lower()
        if level not in LOG_LEVELS:
            raise UsageError(f"--log-level must be one of {', '.join(LOG_LEVELS)}, "
                             f"got {values['log_level']!r}")
        extra_env["HOROVOD_LOG_LEVEL"] = level
    for flag, (name, value) in _ENV_FLAGS.items():
        if flag in flags:
            extra_env[name] = value


def run_check_build() -> int:
    """-cb/--check-build: the doctor (hvd_torch/doctor.py) in a child interpreter, so
    that hvdrun itself never imports torch."""
    try:
        return subprocess.call([sys.executable, "-m", "hvd_torch.doctor"])
    except OSError as e:
        sys.stderr.write(f"{PROG}: cannot run {sys.executable} -m hvd_torch.doctor: {e}\n")
        return 1


def _interface(text: str | None) -> str | None:
    if text is None:
        return None
    if "," in text:
        raise UsageError(
            f"--network-interface {text}: give one interface (the same name on every host)"
        )
    return text


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    try:
        opts = parse_args(argv)
    except UsageError as e:
        sys.stderr.write(f"{USAGE.splitlines()[0]}\n{PROG}: error: {e}\n")
        return 2
    if opts is None:
        sys.stdout.write(USAGE)
        return 0
    if opts.check_build:
        return run_check_build()
    if opts.elastic is not None:
        return run_elastic(opts)
    if opts.node is not None:
        return run_node(opts)
    return run_static(opts.static)
