"""The environment a rank starts with: who it is and where the rendezvous store is.

Shared by the launcher, the Ray driver and the test harness so that every way of
starting ranks hands the engine the same variables, under horovodrun's names.
"""

from __future__ import annotations

import os
import re
import socket
from collections.abc import Mapping

from .store import secret_to_hex

__all__ = [
    "DENIED_NAMES", "DENIED_PREFIXES", "exportable", "forwarded_env", "horovod_env", "rank_env",
]  # fmt: skip

# What a rank on another host gets, as horovodrun does: the launching shell's whole
# environment, less what describes this machine, this login or this shell (the remote
# host has its own, and ours would be wrong there), plus -x NAME[=VALUE], which also
# forwards a denied name.  docs/multihost.md, "Working directory and environment".
DENIED_NAMES = frozenset({
    # this machine and this shell
    "HOSTNAME", "HOST", "PWD", "OLDPWD", "SHLVL", "_",
    # the login: sshd sets the remote user's own
    "HOME", "USER", "LOGNAME", "MAIL", "SHELL",
    # this machine's desktop and terminal sessions
    "DISPLAY", "XAUTHORITY", "WAYLAND_DISPLAY", "DBUS_SESSION_BUS_ADDRESS", "XDG_RUNTIME_DIR",
    "TMUX", "TMUX_PANE", "STY", "WINDOW",
    # the job's secret travels on its own (ssh.py); the store's address is per host
    "HOROVOD_SECRET_KEY",
})  # fmt: skip
DENIED_PREFIXES = (
    "SSH_",         # this machine's ssh session and agent (SSH_CLIENT, SSH_AUTH_SOCK, ...)
    "BASH_FUNC_",   # exported bash functions: not variables, and a shell-injection vector
    "XDG_SESSION_",  # this machine's login session
)  # fmt: skip
_SHELL_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*\Z")


def exportable(name: str) -> bool:
    """Whether a launcher variable goes to remote ranks without -x: not denied, and a
    name a POSIX shell can export (the remote wrapper is sh)."""
    return (_SHELL_NAME.match(name) is not None and name not in DENIED_NAMES
            and not name.startswith(DENIED_PREFIXES))


def horovod_env(
    rank: int,
    size: int,
    store_host: str,
    store_port: int,
    secret: bytes,
    *,
    local_rank: int | None = None,
    local_size: int | None = None,
    cross_rank: int = 0,
    cross_size: int = 1,
    hostname: str | None = None,
    start_timeout: float | None = None,
    master_addr: str | None = None,
    master_port: int | None = None,
) -> dict[str, str]:
    """Only the variables we set.  local_rank/local_size default to rank/size
    (every rank on this machine).

    HOROVOD_GLOO_TIMEOUT_SECONDS is left alone on purpose: it passes through from
    the caller's environment if the user set it, and the engine's default applies
    otherwise.  start_timeout, when given, becomes HOROVOD_START_TIMEOUT, the
    variable horovodrun reads for --start-timeout's default.
    """
    local_rank = rank if local_rank is None else local_rank
    local_size = size if local_size is None else local_size
    if not 0 <= rank < size:
        raise ValueError(f"rank {rank} is outside [0, {size})")
    if not 0 <= local_rank < local_size:
        raise ValueError(f"local rank {local_rank} is outside [0, {local_size})")
    env = {
        "HOROVOD_RANK": str(rank),
        "HOROVOD_SIZE": str(size),
        "HOROVOD_LOCAL_RANK": str(local_rank),
        "HOROVOD_LOCAL_SIZE": str(local_size),
        "HOROVOD_CROSS_RANK": str(cross_rank),
        "HOROVOD_CROSS_SIZE": str(cross_size),
        "HOROVOD_HOSTNAME": hostname or socket.gethostname(),
        "HOROVOD_GLOO_RENDEZVOUS_ADDR": store_host,
        "HOROVOD_GLOO_RENDEZVOUS_PORT": str(store_port),
        "HOROVOD_SECRET_KEY": secret_to_hex(secret),
        "HOROVOD_CONTROLLER": "gloo",
        "HOROVOD_CPU_OPERATIONS": "gloo",
        # Ranks' output goes through the launcher's pipes; without this Python
        # block-buffers it and lines from a crashed rank are lost.
        "PYTHONUNBUFFERED": "1",
    }
    # torch.distributed's names for the same facts (what torchrun sets), so a plain
    # DDP script (init_process_group with env://) runs under hvdrun unchanged.
    env.update({
        "RANK": str(rank),
        "WORLD_SIZE": str(size),
        "LOCAL_RANK": str(local_rank),
        "LOCAL_WORLD_SIZE": str(local_size),
        "GROUP_RANK": str(cross_rank),
        "GROUP_WORLD_SIZE": str(cross_size),
    })
    if master_port is not None:
        env["MASTER_ADDR"] = master_addr or store_host
        env["MASTER_PORT"] = str(master_port)
    if start_timeout is not None:
        env["HOROVOD_START_TIMEOUT"] = f"{start_timeout:g}"
    return env


def rank_env(
    rank: int,
    size: int,
    store_host: str,
    store_port: int,
    secret: bytes,
    *,
    base: Mapping[str, str] | None = None,
    **kwargs,
) -> dict[str, str]:
    """The full environment for a rank: base (default os.environ) plus horovod_env().
    kwargs are horovod_env's keyword arguments."""
    env = dict(os.environ) if base is None else dict(base)
    env.update(horovod_env(rank, size, store_host, store_port, secret, **kwargs))
    return env


def forwarded_env(environ: Mapping[str, str],
                  extra: Mapping[str, str | None] = ()) -> dict[str, str]:
    """What a remote rank gets from environ: every exportable() variable, plus extra:
    -x NAME (value None: this machine's value, if set, even of a denied name) or
    -x NAME=VALUE.  It travels on the ssh channel's stdin (ssh.remote_command)."""
    env = {k: v for k, v in environ.items() if exportable(k)}
    for name, value in dict(extra).items():
        if value is not None:
            env[name] = value
        elif name in environ:
            env[name] = environ[name]
    return env
