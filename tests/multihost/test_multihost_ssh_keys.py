"""ssh host keys under hvdrun (issue #44): the whole environment, tokens included,
goes over ssh, so by default a new host's key is recorded on first use and a host
whose key changed is refused; HVD_TORCH_SSH_STRICT=1 accepts only known keys and
HVD_TORCH_SSH_STRICT=0 is horovodrun's no-check, the documented way back."""

from multihost_harness import cluster, hvdrun, rank_lines
from multihost_harness import launcher_env as _env

HOSTNAME = ["python", "-c", "import socket; print('ran on', socket.gethostname())"]


def _run(hosts, a, env=None):
    return hvdrun(["-np", "1", "-H", f"{a}:1", "--start-timeout", "10",
                   *hosts.hvdrun_ssh_args(), *HOSTNAME], timeout=60, env=env)  # fmt: skip


def test_a_new_key_is_recorded_once_and_a_changed_key_refused(tmp_path):
    with cluster(tmp_path, ["a"]) as hosts:
        a = hosts.address("a")
        assert not hosts.known_hosts.exists()
        first = _run(hosts, a)
        assert first.code == 0 and len(rank_lines(first.out, 0)) == 1, first
        recorded = hosts.known_hosts.read_text()
        assert recorded.count("ssh-ed25519") == 1, recorded
        again = _run(hosts, a)
        assert again.code == 0, again
        assert hosts.known_hosts.read_text() == recorded  # known: nothing added

        hosts.change_host_key("a")
        refused = _run(hosts, a)
        assert refused.code != 0 and rank_lines(refused.out, 0) == [], refused
        assert f"cannot reach host {a} over ssh: Host key verification failed" in refused.err, \
            refused
        assert hosts.known_hosts.read_text() == recorded  # the impostor's key is not taken

        # The way back, for clusters whose nodes are reinstalled with new keys.
        trusting = _run(hosts, a, env=_env(HVD_TORCH_SSH_STRICT="0"))
        assert trusting.code == 0 and len(rank_lines(trusting.out, 0)) == 1, trusting


def test_strict_mode_refuses_a_host_it_does_not_know(tmp_path):
    with cluster(tmp_path, ["a"]) as hosts:
        a = hosts.address("a")
        run = _run(hosts, a, env=_env(HVD_TORCH_SSH_STRICT="1"))
        assert run.code != 0 and rank_lines(run.out, 0) == [], run
        assert "Host key verification failed" in run.err, run
        assert not hosts.known_hosts.exists() or "ssh-ed25519" not in hosts.known_hosts.read_text()
