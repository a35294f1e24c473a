"""Where the elastic driver's store listens (hvdrun/elastic_launch.py: _store_bind):
only on loopback when -H names local hosts alone (no host can join later), on every
address when a discovery script may add remote hosts later, and on the given
interface's address when there is one."""

from hvdrun import elastic_launch
from hvdrun.discovery import FixedHosts


def test_fixed_local_hosts_listen_on_loopback_only():
    assert elastic_launch._store_bind(FixedHosts({"localhost": 2}), None) == (
        "127.0.0.1", "127.0.0.1")


def test_a_discovery_script_may_add_remote_hosts_so_every_address_listens():
    def discovery():  # what HostDiscoveryScript returns: today only this machine
        return {"localhost": 2}

    assert elastic_launch._store_bind(discovery, None) == ("0.0.0.0", "127.0.0.1")


def test_a_failing_first_discovery_still_listens_everywhere():
    def discovery():
        raise RuntimeError("script not ready yet")

    assert elastic_launch._store_bind(discovery, None) == ("0.0.0.0", "127.0.0.1")


def test_the_network_interface_decides_when_given(monkeypatch):
    monkeypatch.setattr(elastic_launch, "interface_address", lambda iface: "10.9.8.7")
    assert elastic_launch._store_bind(FixedHosts({"localhost": 2}), "eth9") == (
        "10.9.8.7", "10.9.8.7")
