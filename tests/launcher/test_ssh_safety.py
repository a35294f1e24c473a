"""ssh as an attacker's input would meet it (issue #44): a host name that ssh would
read as an option is refused wherever names enter (-H, a hostfile, a discovery
script), before ssh runs; ssh gets `--` before the host anyway; host keys are
checked (accept-new) unless the user turns that off."""

import subprocess
import sys
from pathlib import Path

import pytest

from hvdrun.args import UsageError
from hvdrun.discovery import DiscoveryError, parse_hosts
from hvdrun.hosts import parse_host_list, parse_hostfile
from hvdrun.launch import parse_args
from hvdrun.ssh import SshSettings

ROOT = Path(__file__).resolve().parents[2]
HOSTILE = ["-oProxyCommand=touch pwned", "-l", "a b", "a;b", "a@b", "$(id)", "x" * 254]


@pytest.mark.unit
@pytest.mark.parametrize("name", HOSTILE)
def test_a_name_ssh_would_misread_is_refused_wherever_names_enter(tmp_path, name):
    with pytest.raises(UsageError, match="is not a host name"):
        parse_host_list(f"{name}:1")
    if " " not in name:  # a hostfile splits its lines at white space
        hostfile = tmp_path / "hosts"
        hostfile.write_text(f"good slots=1\n{name} slots=1\n")
        with pytest.raises(UsageError, match=r"line 2: .* is not a host name"):
            parse_hostfile(str(hostfile))
    with pytest.raises(DiscoveryError, match="host discovery: .* is not a host name"):
        parse_hosts(f"good:1\n{name}:1\n", None)
    with pytest.raises(ValueError, match="is not a host name"):
        SshSettings().base_command(name)


@pytest.mark.unit
def test_plain_names_and_addresses_pass_and_follow_a_double_dash(monkeypatch):
    monkeypatch.delenv("HVD_TORCH_SSH_STRICT", raising=False)
    names = ["node01", "gpu-7.cluster.local", "10.0.0.12", "n_1"]
    assert [h for h, _ in parse_host_list(",".join(f"{n}:2" for n in names))] == names
    cmd = SshSettings(port=2222, identity_file="k").base_command("node01")
    assert cmd[-2:] == ["--", "node01"] and cmd.count("--") == 1
    assert cmd.index("-p") < cmd.index("--") and cmd.index("-i") < cmd.index("--")


@pytest.mark.unit
def test_host_keys_are_checked_by_default_and_the_way_back_is_documented(monkeypatch):
    def options(strict=None, known=None):
        if strict is None:
            monkeypatch.delenv("HVD_TORCH_SSH_STRICT", raising=False)
        else:
            monkeypatch.setenv("HVD_TORCH_SSH_STRICT", strict)
        cmd = SshSettings(known_hosts_file=known).base_command("h")
        return [cmd[i + 1] for i, a in enumerate(cmd) if a == "-o"]

    assert "StrictHostKeyChecking=accept-new" in options()
    assert not any(o.startswith("UserKnownHostsFile") for o in options())
    assert "UserKnownHostsFile=/tmp/kh" in options(known="/tmp/kh")
    assert "StrictHostKeyChecking=yes" in options("1", "/tmp/kh")
    assert {"StrictHostKeyChecking=no", "UserKnownHostsFile=/dev/null"} <= set(options("0"))
    with pytest.raises(ValueError, match="HVD_TORCH_SSH_STRICT must be 1 .* got 'yes'"):
        options("yes")
    with pytest.raises(UsageError, match="HVD_TORCH_SSH_STRICT must be"):
        parse_args(["-np", "1", "true"], environ={"HVD_TORCH_SSH_STRICT": "on"})
    assert parse_args(["-np", "1", "--ssh-known-hosts-file", "/k", "true"],
                      environ={}).ssh.known_hosts_file == "/k"


@pytest.mark.parametrize("how", ["-H", "--hostfile"])
def test_a_proxy_command_host_runs_nothing(tmp_path, how):
    """The demonstrated attack: before the fix, ssh read the name as an option and
    ran the proxy command here, on the launching machine."""
    target = tmp_path / "pwned"
    evil = tmp_path / "evil.sh"
    evil.write_text(f"#!/bin/sh\ntouch {target}\n")
    evil.chmod(0o755)
    name = f"-oProxyCommand={evil}"
    if how == "-H":
        hosts = ["-H", f"{name}:1"]
    else:
        (tmp_path / "hosts").write_text(f"{name} slots=1\n")
        hosts = ["--hostfile", str(tmp_path / "hosts")]
    proc = subprocess.run(
        [sys.executable, "-m", "hvdrun", "-np", "1", *hosts, "--start-timeout", "5", "true"],
        cwd=tmp_path, env={"PATH": "/usr/bin:/bin", "PYTHONPATH": str(ROOT)},
        capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert not target.exists(), "ssh ran the host name's proxy command"
    assert proc.returncode == 2, (proc.returncode, proc.stderr)
    assert f"{name!r} is not a host name" in proc.stderr, proc.stderr
