"""Meeting the other ranks through a torch.distributed Store, for hvd.init() under
torchrun and for the "hvd" backend's default group (hvd_torch/distributed.py).

Rank 0 serves hvd's own rendezvous store (the engine's client speaks its
protocol) and publishes where it listens in torch's store; every rank then sets
hvdrun's variables in its environment and hvd.init() starts the engine. torch's
store has no authentication, so hvd's secret never goes there (docs/security.md).
"""

from __future__ import annotations

import atexit
import datetime
import json
import os
import shutil
import socket
import stat
import tempfile
import threading

import torch.distributed as dist

from hvd_torch import config

# Rank 0's rendezvous store servers, kept for the life of the process so that a
# later hvd.init() (after hvd.shutdown()) meets the others again under a new scope.
_servers = []
_rendezvous_count = 0
_lock = threading.Lock()


def _route_address(toward: str) -> str:
    """This host's address on the route to `toward` (a UDP connect sends nothing)."""
    try:
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
            s.connect((toward, 9))
            return s.getsockname()[0]
    except OSError:
        return socket.gethostbyname(socket.gethostname())


def _topology(store, rank: int, size: int, prefix: str) -> dict:
    """local/cross rank and size: from torchrun's variables when it set them, else
    from every rank's host name (ranks of one host share memory)."""
    given = config.Launch.from_environment().torchrun_topology(rank, size)
    if given is not None:
        return given
    host = socket.gethostname()
    store.set(f"{prefix}/host/{rank}", host)
    hosts = [store.get(f"{prefix}/host/{r}").decode() for r in range(size)]
    order = list(dict.fromkeys(hosts))  # hosts in order of their first rank
    return dict(local_rank=[r for r in range(size) if hosts[r] == host].index(rank),
                local_size=hosts.count(host), cross_rank=order.index(host),
                cross_size=len(order))


def rendezvous_env(store, rank: int, size: int) -> None:
    """Sets hvdrun's variables (HOROVOD_RANK, the store's address, ...) in this
    process's environment for rank `rank` of `size`, meeting the others through
    `store` (a torch.distributed Store): rank 0 serves hvd's own store (the engine's
    client speaks its protocol) and publishes where it listens. hvd.init() then
    starts the engine.

    torch's store has no authentication, so the secret of hvd's store never goes
    there (docs/security.md): it is HVD_TORCH_SECRET when set (required when the job
    spans hosts), else, on one host, rank 0 makes one and hands it over in a file
    only this user can read."""
    global _rendezvous_count
    from hvdrun.env import horovod_env
    from hvdrun.store_protocol import job_secret_from_hex, make_secret
    from hvdrun.store_server import KVStoreServer

    with _lock:
        _rendezvous_count += 1
        prefix = f"hvd_torch/rendezvous/{_rendezvous_count}"
    topo = _topology(store, rank, size, prefix)
    launch = config.Launch.from_environment()
    one_host = topo["cross_size"] == 1
    given = (launch.secret or "").strip()
    if given:
        secret = job_secret_from_hex(given, "HVD_TORCH_SECRET")
    elif not one_host:
        # Every rank sees the same topology, so every rank refuses alike.
        raise RuntimeError(
            f"hvd_torch: this job spans {topo['cross_size']} hosts: set HVD_TORCH_SECRET to "
            "the same secret on every rank (e.g. export HVD_TORCH_SECRET=$(openssl rand -hex "
            "32) in the job script), or launch with hvdrun. torch's store is not "
            "authenticated, so hvd-torch does not publish its store's secret there "
            "(docs/security.md)")
    if rank == 0:
        if one_host:
            address = "127.0.0.1"
        else:  # the one address the other hosts reach this one at, not every interface
            toward = launch.master_addr
            address = _route_address("8.8.8.8" if toward is None else toward)
        if not given:
            secret = make_secret()
        server = KVStoreServer(address, 0, secret).start()
        _servers.append(server)
        where = {"host": address, "port": server.port}
        if not given:
            where["secret_file"] = _private_secret_file(secret)
        store.set(f"{prefix}/store", json.dumps(where))
    where = json.loads(store.get(f"{prefix}/store"))
    if not given:
        secret = _read_secret_file(where.get("secret_file"))
    env = horovod_env(rank, size, where["host"], where["port"], secret, **topo)
    env.pop("PYTHONUNBUFFERED", None)  # a launcher's concern, not ours to change here
    os.environ.update(env)


def _private_secret_file(secret: bytes) -> str:
    """A file holding secret that only this user can read (a 0700 directory, a 0600
    file), removed once the engine's rendezvous is done (remove_secret_files), or
    when this process exits; its path is not a secret."""
    directory = tempfile.mkdtemp(prefix="hvd_torch-")
    path = os.path.join(directory, "secret")
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
    with os.fdopen(fd, "wb") as f:
        f.write(secret)
    _secret_dirs.append(directory)
    atexit.register(shutil.rmtree, directory, ignore_errors=True)
    return path


_secret_dirs = []


def remove_secret_files() -> None:
    """Removes rank 0's secret files once its engine has met every rank: each read the
    file before it joined, and a later init() takes the secret from the environment.
    Not left to atexit alone: a process killed by its driver (Ray's workers are)
    never runs it."""
    while _secret_dirs:
        shutil.rmtree(_secret_dirs.pop(), ignore_errors=True)


def _read_secret_file(path) -> bytes:
    """The secret rank 0 left in path, if the file is this user's own and nobody
    else's to read or write: torch's store, which told us the path, is not
    authenticated, and anyone could have written it there."""
    if not isinstance(path, str):
        raise RuntimeError("hvd_torch: the rendezvous record in torch's store names no secret "
                           "file; set HVD_TORCH_SECRET on every rank")
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW)
    except OSError as e:
        raise RuntimeError(f"hvd_torch: cannot read rank 0's secret file {path} ({e.strerror}): "
                           "ranks on one host must share /tmp, else set HVD_TORCH_SECRET") from None
    with os.fdopen(fd, "rb") as f:
        info = os.fstat(f.fileno())
        if (not stat.S_ISREG(info.st_mode) or info.st_uid != os.getuid()
                or info.st_mode & 0o077):
            raise RuntimeError(f"hvd_torch: refusing the secret file {path}: it must be a "
                               "regular file of this user with no access for others")
        return f.read(4096)


def torchrun_store(rank: int, size: int):
    """The torch Store hvd.init() meets the other ranks through under torchrun's
    variables (see the module's docstring)."""
    launch = config.Launch.from_environment()
    addr, port = launch.torchrun_master()
    timeout = datetime.timedelta(seconds=launch.start_timeout_s())
    if launch.agent_store:
        store = dist.TCPStore(addr, port, size, is_master=False, timeout=timeout)
        return dist.PrefixStore(f"hvd_torch/{launch.attempt}/", store)
    store = dist.TCPStore(addr, port + 1, size, is_master=(rank == 0), timeout=timeout)
    _servers.append(store)  # rank 0 serves it until every rank has read the address
    return store
