"""A fixed-size job: -np ranks over the -H/--hostfile hosts, remote ones over ssh.

    hvdrun -np 4 -H server1:2,server2:2 python train.py

Ranks on this machine (localhost, its hostname) start as local processes; the others
start over ssh (ssh.py) after a parallel check that every remote host answers.  The
store listens on an address the remote hosts reach (network.py) with a fresh secret,
which remote ranks receive on the ssh channel's stdin, never on a command line.
"""

from __future__ import annotations

import dataclasses
import os
import signal
import socket
import subprocess
import threading

from .env import forwarded_env, horovod_env
from .hosts import Placement, is_local_host
from .network import NetworkError, free_port, store_address
from .output import RankFiles, note
from .processes import Processes
from .ssh import SshSettings, check_reachable, remote_command
from .store import KVStoreServer, StoreError, StoreLimits, make_secret
from .supervise import RankInfo, supervise

__all__ = ["StaticJob", "run_static"]


@dataclasses.dataclass
class StaticJob:
    placements: list[Placement]
    command: list[str]
    verbose: bool = False
    start_timeout: float | None = None
    ssh: SshSettings = dataclasses.field(default_factory=SshSettings)
    iface: str | None = None  # --network-interface / HOROVOD_GLOO_IFACE
    extra_env: dict[str, str | None] = dataclasses.field(default_factory=dict)  # -x
    output_filename: str | None = None  # --output-filename DIR


def run_static(job: StaticJob) -> int:
    received: list[int] = []
    handlers = {}
    # Signal handlers can only be installed from the main thread; a launcher
    # embedded in another thread just doesn't forward signals.
    if threading.current_thread() is threading.main_thread():
        for signum in (signal.SIGINT, signal.SIGTERM):
            handlers[signum] = signal.signal(signum, lambda s, _f: received.append(s))
    try:
        files = RankFiles(job.output_filename, len(job.placements)) if job.output_filename else None
    except OSError as e:
        note(f"error: --output-filename {job.output_filename}: {e.strerror}")
        return 1
    procs = Processes(files)
    try:
        return _run(job, procs, received)
    finally:
        # Covers exceptions (and a failed start): no rank outlives the launcher.
        if any(p.poll() is None for p in procs.procs):
            procs.stop()
        for signum, handler in handlers.items():
            signal.signal(signum, handler)


def _run(job: StaticJob, procs: Processes, received: list[int]) -> int:
    remote_hosts = list(dict.fromkeys(p.host for p in job.placements if not is_local_host(p.host)))
    if remote_hosts:
        timeout = job.start_timeout or 30.0
        unreachable = check_reachable(remote_hosts, job.ssh, timeout)
        if unreachable:
            for host, why in unreachable.items():
                note(f"cannot reach host {host} over ssh: {why}")
            ranks = [str(p.rank) for p in job.placements if p.host in unreachable]
            note(f"not starting the job: rank(s) {', '.join(ranks)} would run on unreachable hosts")
            return 1
    try:
        address = store_address(remote_hosts, job.iface)
    except NetworkError as e:
        note(f"error: {e}")
        return 1
    secret = make_secret()
    try:
        store = KVStoreServer(address, 0, secret, StoreLimits.for_job(len(job.placements))).start()
    except StoreError as e:
        note(f"error: {e}")
        return 1
    with store:
        if job.verbose:
            note(f"store listening on {store.address}")
        infos = []
        # torch.distributed's env:// rendezvous: rank 0 serves a TCPStore there.  The
        # port is free here; on another host it is a guess, as torchrun's own is.
        first = job.placements[0]
        master_addr = first.host if first.host in remote_hosts else store.host
        master_port = free_port()
        for p in job.placements:
            remote = p.host in remote_hosts
            env = horovod_env(
                p.rank, p.size, store.host, store.port, secret,
                local_rank=p.local_rank, local_size=p.local_size,
                cross_rank=p.cross_rank, cross_size=p.cross_size,
                hostname=p.host if remote else socket.gethostname(),
                start_timeout=job.start_timeout,
                master_addr=master_addr, master_port=master_port,
            )  # fmt: skip
            if job.iface:
                env["HOROVOD_GLOO_IFACE"] = job.iface
            infos.append(RankInfo(p.rank, p.host if remote_hosts else None, remote))
            try:
                if remote:
                    _start_remote(procs, p, env, job)
                else:
                    full = dict(os.environ)
                    full.update({k: v for k, v in job.extra_env.items() if v is not None})
                    full.update(env)
                    if job.verbose:
                        note(f"rank {p.rank}: {subprocess.list2cmdline(job.command)}")
                    procs.start(p.rank, job.command, full)
            except OSError as e:
                what = "ssh" if remote else job.command[0]
                note(f"cannot start rank {p.rank} on host {p.host}: {what}: {e.strerror}")
                return 127  # the shell's code for "command not found"
        code, _, _ = supervise(procs, infos, received)
        procs.drain()
        return code


def _start_remote(procs: Processes, p: Placement, env: dict[str, str], job: StaticJob) -> None:
    full = forwarded_env(os.environ, job.extra_env)
    full.update(env)
    argv, stdin = remote_command(p.host, job.command, full, os.getcwd(), job.ssh)
    if job.verbose:
        note(f"rank {p.rank} on {p.host}: ssh {p.host} {subprocess.list2cmdline(job.command)}")
    procs.start(p.rank, argv, dict(os.environ), stdin=stdin)
