"""Starting a rank on another host over ssh, and checking hosts are reachable first.

A remote rank is `ssh host sh -c <wrapper>` (see remote_script()).  The wrapper reads
the rank's environment from stdin (the ssh channel), cds to the launcher's working
directory (hosts are expected to share the file system, or at least its layout, as
with horovodrun), and runs the command in its own process group.  No variable's
value is on any command line: a command line is visible to every user of both
machines (ps), a pipe is not; horovodrun puts them all on ssh's command line, the
job's secret included.  The wrapper also watches its stdin: when hvdrun closes that
pipe, or hvdrun or the connection dies, the read sees EOF and the wrapper kills the
whole group (TERM, then KILL), so no rank is left behind on a remote host.  Without
a terminal (-T) ssh sends no SIGHUP, which is why the wrapper has to watch for itself.

Exit codes: the rank's own code comes back through ssh; 255 is ssh's own failure
(connection refused or lost), which launchers report as such; 125 is a wrapper that
did not receive its environment (the connection closed first).
"""

from __future__ import annotations

import concurrent.futures
import dataclasses
import os
import secrets
import shlex
import subprocess
import time

from .config import Launch
from .hosts import checked_host_name

__all__ = ["SSH_FAILED", "SshSettings", "check_reachable", "remote_command"]

SSH_FAILED = 255  # ssh's exit code for its own errors
_STOP_GRACE = 3  # seconds the wrapper waits between TERM and KILL


@dataclasses.dataclass(frozen=True)
class SshSettings:
    port: int | None = None  # --ssh-port
    identity_file: str | None = None  # --ssh-identity-file
    known_hosts_file: str | None = None  # --ssh-known-hosts-file (default ssh's own)
    connect_timeout: float = 10.0  # per connection attempt

    def base_command(self, host: str) -> list[str]:
        """ssh's argv up to and with the destination; the remote command follows.
        Every name is checked here too, whichever list it came from, and `--` ends
        ssh's options before it, so no host name can become an option."""
        checked_host_name(host, "ssh")
        cmd = [
            "ssh", "-T",
            "-o", "BatchMode=yes",  # never prompt: a password prompt would hang the job
            "-o", f"ConnectTimeout={max(1, int(self.connect_timeout))}",
            # A host that stops answering fails its ranks within about 3 x 2 s.
            "-o", "ServerAliveInterval=2", "-o", "ServerAliveCountMax=3",
            "-o", "LogLevel=ERROR",
        ]  # fmt: skip
        # accept-new by default: the whole environment, tokens included, goes over
        # this channel, so a host whose key changed is refused; a new host's key is
        # recorded on first use. HVD_TORCH_SSH_STRICT=0 is horovodrun's "no check".
        policy = Launch.from_environment().host_key_checking()
        cmd += ["-o", f"StrictHostKeyChecking={policy}"]
        if policy == "no":
            cmd += ["-o", "UserKnownHostsFile=/dev/null"]
        elif self.known_hosts_file is not None:
            cmd += ["-o", f"UserKnownHostsFile={self.known_hosts_file}"]
        if self.port is not None:
            cmd += ["-p", str(self.port)]
        if self.identity_file is not None:
            cmd += ["-i", self.identity_file]
        return cmd + ["--", host]


def env_payload(env: dict[str, str], end: str) -> bytes:
    """What remote_script() reads from stdin: one `export NAME='value'` per variable
    (values may span lines: the wrapper evals the whole text once), then the line
    `end`, which the caller picked so that no line of the text equals it."""
    lines = "".join(f"export {k}={shlex.quote(v)}\n" for k, v in sorted(env.items()))
    # os.fsencode: a value that is not UTF-8 (os.environ keeps its bytes as surrogate
    # escapes) travels as the same bytes, as it would on a command line.
    return os.fsencode(lines + end + "\n")


def remote_script(command: list[str], cwd: str, end: str) -> str:
    """The shell program a remote rank runs (see the module docstring).  It reads
    env_payload()'s lines up to `end`, evals them, and runs the command."""
    # sh's `read` takes one byte at a time from a pipe, so it never swallows what
    # follows the payload; the watcher below owns the rest of the channel.
    # The wrapper's own variables start with _hvd_ so that no user's is unset.
    return (
        f"_hvd_end={shlex.quote(end)}\n"
        "_hvd_env=\n"
        "while IFS= read -r _hvd_line; do\n"
        '  [ "$_hvd_line" = "$_hvd_end" ] && break\n'
        '  _hvd_env="$_hvd_env$_hvd_line\n"\n'
        "done\n"
        '[ "$_hvd_line" = "$_hvd_end" ] || exit 125\n'
        'eval "$_hvd_env" || exit 125\n'
        "unset _hvd_env _hvd_line _hvd_end\n"
        f"cd {shlex.quote(cwd)} || exit 127\n"
        "exec 3<&0\n"  # an asynchronous list's own stdin is /dev/null; keep the channel
        f"setsid {shlex.join(command)} </dev/null 3<&- &\n"
        "pid=$!\n"
        "( while read -r _ <&3; do :; done\n"
        "  kill -TERM -$pid 2>/dev/null; n=0\n"
        f"  while kill -0 -$pid 2>/dev/null && [ $n -lt {_STOP_GRACE * 10} ]; do\n"
        "    sleep 0.1; n=$((n + 1)); done\n"
        "  kill -KILL -$pid 2>/dev/null ) &\n"
        "watcher=$!\n"
        "exec 3<&-\n"
        "wait $pid\n"
        "code=$?\n"
        "kill $watcher 2>/dev/null\n"
        "exit $code\n"
    )


def remote_command(
    host: str, command: list[str], env: dict[str, str], cwd: str, settings: SshSettings
) -> tuple[list[str], bytes]:
    """(argv of the local ssh client that runs command on host, what to write to its
    stdin first: env (the job's secret, HOROVOD_SECRET_KEY, among it) as env_payload())."""
    while True:  # an end line that no variable's value holds as a line of its own
        end = f"__hvd_env_end_{secrets.token_hex(8)}"
        if not any(end in v for v in env.values()):
            break
    script = remote_script(command, cwd, end)
    return settings.base_command(host) + ["sh -c " + shlex.quote(script)], env_payload(env, end)


def check_reachable(hosts: list[str], settings: SshSettings, timeout: float) -> dict[str, str]:
    """{host: why} for every host where `ssh host true` fails; all hosts are tried in
    parallel and the whole check takes at most about timeout seconds."""
    if not hosts:
        return {}
    failures: dict[str, str] = {}

    def probe(host: str) -> None:
        started = time.monotonic()
        try:
            proc = subprocess.run(
                settings.base_command(host) + ["true"],
                stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=timeout,
            )  # fmt: skip
        except subprocess.TimeoutExpired:
            failures[host] = f"no answer within {timeout:g}s"
            return
        if proc.returncode != 0:
            why = proc.stderr.strip().splitlines()[-1:] or [f"exit code {proc.returncode}"]
            failures[host] = f"{why[0]} (after {time.monotonic() - started:.1f}s)"

    with concurrent.futures.ThreadPoolExecutor(max_workers=min(32, len(hosts))) as pool:
        list(pool.map(probe, hosts))
    return failures
