"""Elastic hvdrun across namespace hosts: workers start over ssh on the hosts the
discovery script prints, the job grows onto a new host and survives losing one.

The job is tests/harness/elastic_job.py (deterministic float64 regression), so the final
weights are checked against elastic_job.reference() for the world sizes and commits
the run went through.  Skipped where namespaces cannot be made (not root).
"""

import json
import os
import signal
import time

import pytest

from hvdrun_job import HvdrunJob
from multihost_harness import ROOT, cluster, launcher_env

_ATOL = 1e-9
EPOCHS = 4  # long enough to grow (a new host's workers take seconds to start) and shrink


def start_elastic_run(tmp_path, hosts, first_hosts: str, *args):
    """hvdrun's elastic mode over the namespace hosts, with a file-driven discovery
    script listing `first_hosts` at the start."""
    hosts_file = tmp_path / "discovered"
    hosts_file.write_text(first_hosts)
    env = launcher_env(ELASTIC_JOB_STEP_SLEEP="0.15", ELASTIC_JOB_EPOCHS=str(EPOCHS))
    cmd = ["hvdrun", "--min-np", "2", "--max-np", "4", *args,
           "--host-discovery-script", f"cat {hosts_file}", *hosts.hvdrun_ssh_args(),
           "-x", "ELASTIC_JOB_STEP_SLEEP", "-x", "ELASTIC_JOB_EPOCHS",
           "python", "tests/harness/elastic_job.py"]  # fmt: skip
    return HvdrunJob(cmd, env, ROOT, hosts_file=hosts_file, wait_timeout=90.0,
                     finish_timeout=180.0)


@pytest.fixture
def elastic(tmp_path):
    runs = []

    def start(*args):
        runs.append(start_elastic_run(tmp_path, *args))
        return runs[-1]

    yield start
    for run in runs:  # a failed assertion must not leave the launcher behind
        run.kill()


def test_grows_onto_a_new_host_then_survives_losing_it(tmp_path, elastic, monkeypatch):
    import elastic_job

    monkeypatch.setattr(elastic_job, "EPOCHS", EPOCHS)  # what the workers run

    with cluster(tmp_path, ["a", "b"]) as hosts:
        a, b = hosts.address("a"), hosts.address("b")
        j = elastic(hosts, f"{a}:2\n")
        j.wait_for(lambda line: "EVENT step epoch=0 batch=2 size=2" in line)

        # Growth: host b appears in discovery; two workers start there over ssh.
        j.set_hosts(f"{a}:2\n{b}:2\n")

        def grown_starts():
            return [f for _, f in j.events("start") if f["size"] == "4"]

        # Each worker's start line comes over its own stream (ssh for host b's):
        # rank 0's first step of size 4 can arrive before another worker's start
        # (under load, w2's had not come yet). Wait for the starts themselves.
        j.wait_for(lambda line: len(grown_starts()) >= 4)
        grown = grown_starts()
        assert len(grown) == 4, j.output
        assert hosts.pids("b"), "no worker runs on host b"
        # Train with 4 past at least one completed commit (the next one is printed).
        first_4 = int(grown[0]["commits"])
        j.wait_for(lambda line: f"EVENT commit commits={first_4 + 2} " in line)

        # Loss: host b goes down (its sshd, then its processes), still listed by
        # discovery. sshd first: hvdrun restarts lost workers at once, and one
        # that reached a still-listening sshd (a loaded machine) ran on b to the end.
        lost_at = time.time()
        hosts.stop_sshd("b")
        for pid in hosts.pids("b"):
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        assert j.finish() == 0, j.output

        # The workers lost with b, and the restarts ssh could not make, blacklist b.
        assert f"blacklisted host {b}" in j.output, j.output
        assert hosts.pids("a") == [], "workers left behind on host a"
        done = [f for _, f in j.events("done")]
        assert len(done) == 2 and {f["size"] for f in done} == {"2"}, j.output
        weights = [json.loads(f["weights"]) for f in done]
        assert weights[0] == weights[1]

        # The run went 2 -> 4 -> 2 workers; replaying those sizes between the same
        # commits in one process gives the same weights.
        grew_at = {int(f["commits"]) for f in grown}
        shrunk = [f for _, f in j.events("start", after=lost_at) if f["size"] == "2"]
        shrank_at = {int(f["commits"]) for f in shrunk}
        assert len(grew_at) == 1 and len(shrank_at) == 1, j.output
        expected = elastic_job.reference([(2, grew_at.pop()), (4, shrank_at.pop()), (2, None)])
        assert weights[0] == pytest.approx(expected, abs=_ATOL, rel=0)
        first_step = min(t for t, _ in j.events("step", after=lost_at))
        print(f"\nhost b lost -> first training step with 2 workers: {first_step - lost_at:.2f}s")


def test_host_removed_by_discovery_loses_its_workers_and_nothing_is_left(tmp_path, elastic,
                                                                        monkeypatch):  # fmt: skip
    import elastic_job

    monkeypatch.setattr(elastic_job, "EPOCHS", EPOCHS)
    with cluster(tmp_path, ["a", "b"]) as hosts:
        a, b = hosts.address("a"), hosts.address("b")
        j = elastic(hosts, f"{a}:1\n{b}:1\n")
        j.wait_for(lambda line: "EVENT step epoch=0 batch=3 size=2" in line)
        assert len(hosts.pids("b")) >= 1  # the worker (and its wrapper) run on b
        j.set_hosts(f"{a}:1\n{b}:2\n")  # b grows: a second worker starts there
        j.wait_for(lambda line: "EVENT step" in line and "size=3" in line)
        removed_at = time.time()
        j.set_hosts(f"{a}:2\n")  # b leaves; a gets a second slot
        j.wait_for(lambda line: "EVENT step" in line and "size=2" in line
                   and float(line.rsplit("t=", 1)[1]) > removed_at)  # fmt: skip
        # b's workers were asked to leave, exited, and took their wrappers with them.
        deadline = time.monotonic() + 15
        while hosts.pids("b") and time.monotonic() < deadline:
            time.sleep(0.1)
        assert hosts.pids("b") == [], j.output
        assert j.finish() == 0, j.output
        assert "blacklisted" not in j.output  # leaving is no failure
        done = [f for _, f in j.events("done")]
        assert len(done) == 2 and {f["size"] for f in done} == {"2"}, j.output
        sizes = [f["size"] for _, f in j.events("start") if f["rank"] == "0"]
        assert sizes[:1] == ["2"] and "3" in sizes and sizes[-1] == "2", sizes
