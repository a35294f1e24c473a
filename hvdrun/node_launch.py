"""Per-node launch: a scheduler (Slurm, Kubernetes, a shell loop) starts one hvdrun on
each node, and the nodes rendezvous with each other (torchrun's flags):

    hvdrun --nnodes 2 --node-rank 0 --nproc-per-node 2 --rdzv-endpoint node0:29400 python train.py
    hvdrun --nnodes 2 --node-rank 1 --nproc-per-node 2 --rdzv-endpoint node0:29400 python train.py

Node 0 serves the job's store on the endpoint's port, on the endpoint's address (or
--network-interface's, or HVD_TORCH_STORE_BIND's); every node connects to it,
checks in, starts its nproc-per-node ranks (ranks node_rank * P .. node_rank * P +
P - 1) and supervises them.  The job's secret cannot be made up by one node, since
the others must know it before they can talk to node 0: it comes from
HVD_TORCH_SECRET (hex) or --rdzv-secret-file, which the job script creates once
and hands to every node (docs/multihost.md).  Under srun, the SLURM_* variables
give --nnodes, --node-rank and --rdzv-endpoint (slurm.py).

Store keys (prefix hvdrun/):
  master_port     decimal                torch.distributed's MASTER_PORT: a port free on
                                         node 0, set before node 0 checks in
  nodes/<r>       "<nproc> <hostname>"   node r checked in
  failed/<r>      "<order> why"          a rank of node r failed; every node stops its
                                         ranks (order: how likely it is the cause)
  done/<r>        exit code              node r's ranks are over; node 0 keeps the
                                         store up until every node has said so
"""

from __future__ import annotations

import dataclasses
import errno
import os
import signal
import socket
import threading
import time

from . import config
from .args import UsageError, non_negative_int, positive_int
from .env import rank_env
from .network import NetworkError, free_port, interface_address
from .output import RankFiles, note
from .processes import Processes
from .slurm import node_defaults
from .store import KVStoreClient, KVStoreServer, StoreError, StoreLimits
from .store_protocol import job_secret_from_hex
from .supervise import RankInfo, supervise

__all__ = ["NodeOptions", "parse_node_options", "run_node"]

SECRET_ENV = config.SECRET
BIND_ENV = config.STORE_BIND  # where node 0's store listens, if not the endpoint
_NODE_KEYS = ("nnodes", "node_rank", "nproc_per_node", "rdzv_endpoint", "rdzv_secret_file")
_DONE_WAIT = 60.0  # how long node 0 keeps the store up for nodes still finishing
_CAUSE_WAIT = 1.0  # how long a failed node waits to hear of failures elsewhere
_FAILED = "hvdrun/failed/"
_MASTER_PORT = "hvdrun/master_port"


@dataclasses.dataclass
class NodeOptions:
    nnodes: int
    node_rank: int
    nproc_per_node: int
    host: str  # the rendezvous endpoint
    port: int
    secret: bytes


def parse_node_options(values: dict[str, str], num_proc, environ=None) -> NodeOptions | None:
    """NodeOptions when the command line (or srun, when -np/-H are not given) asks for
    per-node mode, else None; SLURM_* and HVD_TORCH_SECRET from environ (None:
    os.environ).  Raises UsageError."""
    given = {k: values[k] for k in _NODE_KEYS if k in values}
    other_mode = {"hosts", "min_np", "max_np", "discovery_script"} & values.keys()
    if not given and (num_proc is not None or other_mode):
        return None  # under srun, but the user asked for a static or elastic job
    merged = dict(node_defaults(environ))
    merged.update(given)
    if not given and not merged:
        return None
    if num_proc is not None or "hosts" in values:
        raise UsageError("per-node mode (--nnodes, ...) takes no -np/-H: use --nproc-per-node")
    for key, flag in (("nnodes", "--nnodes"), ("node_rank", "--node-rank"),
                      ("rdzv_endpoint", "--rdzv-endpoint")):  # fmt: skip
        if key not in merged:
            raise UsageError(f"per-node mode needs {flag} (or run it under srun)")
    nnodes = positive_int("--nnodes", merged["nnodes"])
    node_rank = non_negative_int("--node-rank", merged["node_rank"])
    if node_rank >= nnodes:
        raise UsageError(f"--node-rank {node_rank} is outside [0, --nnodes {nnodes})")
    nproc = positive_int("--nproc-per-node", merged.get("nproc_per_node", "1"))
    host, colon, port = merged["rdzv_endpoint"].rpartition(":")
    if not colon or not host:
        raise UsageError(f"--rdzv-endpoint must be HOST:PORT, got {merged['rdzv_endpoint']!r}")
    return NodeOptions(
        nnodes, node_rank, nproc, host, positive_int("--rdzv-endpoint port", port),
        _secret(merged.get("rdzv_secret_file"), environ),
    )  # fmt: skip


def _secret(path: str | None, environ=None) -> bytes:
    given = config.Launch.from_environment(environ).secret
    if path is not None:
        try:
            with open(path, encoding="ascii") as f:
                text, where = f.read().strip(), f"--rdzv-secret-file {path}"
        except (OSError, UnicodeDecodeError) as e:
            raise UsageError(f"--rdzv-secret-file {path}: {e}") from None
    elif given:
        text, where = given.strip(), SECRET_ENV
    else:
        raise UsageError(
            f"per-node mode needs the job's secret, the same on every node: set {SECRET_ENV} "
            "(e.g. export HVD_TORCH_SECRET=$(openssl rand -hex 32) before srun) or pass "
            "--rdzv-secret-file (docs/multihost.md)"
        )
    try:
        return job_secret_from_hex(text, where)
    except ValueError as e:
        raise UsageError(str(e)) from None


def _report_cause(client: KVStoreClient, node_rank: int, order: int, failure: str) -> None:
    """Posts this node's failure; after a moment, names the likeliest cause among every
    node's failures (see supervise._cause_order) if it was elsewhere.  A rank's death
    fails the ranks of every node within milliseconds, so each node sees failures."""
    client.set(f"{_FAILED}{node_rank}", f"{order} {failure}")
    time.sleep(_CAUSE_WAIT)
    posted = []
    for key in client.list_keys(_FAILED):
        their_order, _, message = client.get(key).decode().partition(" ")
        posted.append((int(their_order), int(key[len(_FAILED):]), message))
    best = min(posted)
    if best[1] != node_rank and best[0] < order:
        note(f"node {node_rank}: the failure started on node {best[1]}: {best[2]}")


def run_node(opts) -> int:
    """Runs launch.Options `opts` (opts.node set) on this node; the exit code."""
    n: NodeOptions = opts.node
    received: list[int] = []
    handlers = {}
    if threading.current_thread() is threading.main_thread():
        for signum in (signal.SIGINT, signal.SIGTERM):
            handlers[signum] = signal.signal(signum, lambda s, _f: received.append(s))
    try:
        files = (RankFiles(opts.output_filename, n.nnodes * n.nproc_per_node)
                 if opts.output_filename else None)
    except OSError as e:
        note(f"error: --output-filename {opts.output_filename}: {e.strerror}")
        return 1
    procs = Processes(files)
    server = None
    try:
        if n.node_rank == 0:
            try:
                server = _serve(n, opts.iface)
            except (StoreError, NetworkError) as e:
                note(f"node 0 ({socket.gethostname()}): {e}")
                return 1
            if opts.verbose:
                note(f"node 0: store listening on {server.address}")
        timeout = opts.start_timeout or 30.0
        try:
            client = KVStoreClient(n.host, n.port, n.secret, connect_timeout=timeout)
        except StoreError as e:
            note(f"node {n.node_rank} ({socket.gethostname()}): cannot join the job: {e}")
            return 1
        with client:
            return _run(opts, n, client, procs, received, timeout)
    finally:
        if any(p.poll() is None for p in procs.procs):
            procs.stop()
        if server is not None:
            server.stop()
        for signum, handler in handlers.items():
            signal.signal(signum, handler)


def _serve(n: NodeOptions, iface: str | None) -> KVStoreServer:
    """Node 0's store on the endpoint's port, on one address: HVD_TORCH_STORE_BIND's if
    set (0.0.0.0 for every address), else --network-interface's, else the endpoint's.
    Never every address unless asked: that would offer the store to every network the
    node is on.  Raises StoreError or NetworkError."""
    limits = StoreLimits.for_job(n.nnodes * n.nproc_per_node)
    address = (config.Store.from_environment().bind or "").strip()
    if not address and iface:
        address = interface_address(iface)
    if address:
        return KVStoreServer(address, n.port, n.secret, limits).start()
    hint = (
        f"is {n.host} this node? Give --network-interface, or set {BIND_ENV}=ADDRESS "
        f"({BIND_ENV}=0.0.0.0 listens on every address)"
    )
    try:
        address = socket.gethostbyname(n.host)
    except OSError as e:
        raise StoreError(f"cannot resolve the endpoint {n.host} here ({e}): {hint}") from None
    try:
        return KVStoreServer(address, n.port, n.secret, limits).start()
    except StoreError as e:
        if getattr(e.__cause__, "errno", None) != errno.EADDRNOTAVAIL:
            raise  # e.g. the port is taken
        raise StoreError(f"{e}: {hint}") from None


def _run(opts, n: NodeOptions, client: KVStoreClient, procs, received, timeout: float) -> int:
    hostname = socket.gethostname()
    if n.node_rank == 0:
        # torch.distributed's env:// rendezvous: rank 0 (on node 0) serves a TCPStore on
        # a port free there, published before node 0 checks in, so every node that
        # sees node 0's check-in finds it.  The other nodes reach node 0 at the
        # endpoint's address, which is therefore MASTER_ADDR.
        client.set(_MASTER_PORT, str(free_port()))
    client.set(f"hvdrun/nodes/{n.node_rank}", f"{n.nproc_per_node} {hostname}")
    keys = [f"hvdrun/nodes/{r}" for r in range(n.nnodes)]
    missing = client.wait(keys, timeout=timeout)
    if missing:
        nodes = ", ".join(k.rsplit("/", 1)[1] for k in missing)
        note(
            f"node {n.node_rank} ({hostname}): node(s) {nodes} did not check in at "
            f"{n.host}:{n.port} within {timeout:g}s (--start-timeout)"
        )
        return 1
    for r in range(n.nnodes):
        nproc, _, host = client.get(f"hvdrun/nodes/{r}").decode().partition(" ")
        if int(nproc) != n.nproc_per_node:
            note(
                f"node {r} ({host}) runs --nproc-per-node {nproc} but node {n.node_rank} "
                f"({hostname}) runs {n.nproc_per_node}: every node must run the same number"
            )
            return 1
    size = n.nnodes * n.nproc_per_node
    master_port = int(client.get(_MASTER_PORT))
    infos = []
    for local_rank in range(n.nproc_per_node):
        rank = n.node_rank * n.nproc_per_node + local_rank
        env = rank_env(
            rank, size, n.host, n.port, n.secret, local_rank=local_rank,
            local_size=n.nproc_per_node, cross_rank=n.node_rank, cross_size=n.nnodes,
            hostname=hostname, start_timeout=opts.start_timeout,
            master_addr=n.host, master_port=master_port,
            base={**os.environ, **{k: v for k, v in opts.extra_env.items() if v is not None}},
        )  # fmt: skip
        if opts.iface:
            env["HOROVOD_GLOO_IFACE"] = opts.iface
        # -x, --autotune, ...
        env.update({k: v for k, v in opts.extra_env.items() if v is not None})
        infos.append(RankInfo(rank, hostname, remote=False))
        try:
            procs.start(rank, opts.command, env)
        except OSError as e:
            note(f"cannot start rank {rank} on host {hostname}: {opts.command[0]}: {e.strerror}")
            client.set(f"{_FAILED}{n.node_rank}",
                       f"1 rank {rank} on host {hostname} could not start")
            return 127

    def other_node_failed() -> str | None:
        try:
            failed = client.list_keys(_FAILED)
            if failed:
                return "another node failed: " + client.get(failed[0]).decode().partition(" ")[2]
        except StoreError as e:
            return f"lost the job's store at {n.host}:{n.port} (node 0 gone?): {e}"
        return None

    code, failure, order = supervise(procs, infos, received, other_node_failed)
    procs.drain()
    try:
        if order is not None:
            _report_cause(client, n.node_rank, order, f"{failure} (node {n.node_rank}, {hostname})")
        client.set(f"hvdrun/done/{n.node_rank}", str(code))
        if n.node_rank == 0:
            done = [f"hvdrun/done/{r}" for r in range(n.nnodes)]
            late = client.wait(done, timeout=_DONE_WAIT)
            if late and code == 0:
                nodes = ", ".join(k.rsplit("/", 1)[1] for k in late)
                note(f"node(s) {nodes} did not finish within {_DONE_WAIT:g}s of node 0")
                return 1
    except StoreError:
        pass  # node 0 is gone; our own ranks' outcome is the answer
    return code
