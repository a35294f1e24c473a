"""Issue #47's host leaders across namespace hosts: 2 hosts of 3 ranks (an odd count
per host). Each host's first rank accepts its host's control connections and relays
their frames to rank 0 (csrc/core/control_relay.cc), so rank 0 holds one connection
for the other host, not one per rank. New names, every step's, negotiate through the
leaders with exact numbers, with the agreement on (the default across hosts) and off;
a process set of part of each host, without either leader, and one inside one host
work; a SIGKILLed leader ends the job naming it on every rank.

Multihost tier (root, namespaces); each job starts 6 ranks.
"""

import json
import signal
import time

import pytest
from multihost_harness import (cluster, finish, hvdrun, launcher_env, rank_lines, rank_reports,
                               spawn)

pytestmark = [pytest.mark.multihost, pytest.mark.xdist_group("multihost")]

HOSTS, PER_HOST = 2, 3
N = HOSTS * PER_HOST
JOB_TIMEOUT = 180


def _args(hosts, script, env) -> list[str]:
    forwarded = [a for name in env for a in ("-x", name)]
    slots = ",".join(f"{hosts.address(name)}:{PER_HOST}" for name in hosts.names)
    return ["-np", str(N), "-H", slots, *hosts.hvdrun_ssh_args(), *forwarded,
            "python", str(script)]  # fmt: skip


# Every step uses new names (rank 0 negotiates each, through the leaders) and one
# cached name; then a set of ranks 1, 2, 4, 5 (part of each host, neither leader)
# and a set of ranks 4, 5 (part of host 1) do the same.
NEW_NAMES = """
import json, torch, hvd_torch as hvd
from hvd_torch import _C
STEPS = 3
hvd.init()
r, n = hvd.rank(), hvd.size()
got = {k: [] for k in ("new", "cached", "gather", "bcast", "split", "host")}
split = hvd.add_process_set([1, 2, 4, 5])
host = hvd.add_process_set([4, 5])
for step in range(STEPS):
    got["new"].append(hvd.allreduce(torch.tensor([r, step], dtype=torch.float64),
                                    name=f"new.{step}", op=hvd.Sum).tolist())
    got["cached"].append(hvd.allreduce(torch.full((2,), float(r)), name="cached",
                                       op=hvd.Sum).tolist())
    got["gather"].append(hvd.allgather(torch.full((r + 1,), float(step)),
                                       name=f"gather.{step}").tolist())
    got["bcast"].append(hvd.broadcast(torch.tensor([float(r + step)]), root_rank=4,
                                      name=f"bcast.{step}").tolist())
    if r in (1, 2, 4, 5):
        got["split"].append(hvd.allreduce(torch.tensor([float(r)]), name=f"split.{step}",
                                          op=hvd.Sum, process_set=split).tolist())
    if r in (4, 5):
        got["host"].append(hvd.allreduce(torch.tensor([float(r + step)]), name="host",
                                         op=hvd.Sum, process_set=host).tolist())
# Rank 0 negotiates the sets' ops: every rank stays until the last is done. It is
# also the job's last op, which a partner that finishes it first exits after: the
# others' round still completes (BitAgreement::awaits).
hvd.allreduce(torch.zeros(1), name="done")
report = dict(rank=r, got=got, links=_C.control_links(), relayed=_C.relayed_frames(),
              plane=_C.control_plane())
print(json.dumps(report), flush=True)
hvd.shutdown()
"""


@pytest.mark.parametrize("agreement", ["auto", "0"])
def test_new_names_and_part_host_sets_go_through_the_host_leaders(tmp_path, agreement):
    script = tmp_path / "rank.py"
    script.write_text(NEW_NAMES)
    env = {"HVD_TORCH_AGREEMENT": agreement}
    with cluster(tmp_path, ["a", "b"]) as hosts:
        run = hvdrun(_args(hosts, script, env), timeout=JOB_TIMEOUT, env=launcher_env(**env))
    assert run.code == 0, run
    steps, total = 3, N * (N - 1) // 2  # 15
    for rank, rep in enumerate(rank_reports(run, N)):
        got = rep["got"]
        assert got["new"] == [[total, N * s] for s in range(steps)], (rank, got)
        assert got["cached"] == [[total] * 2] * steps, (rank, got)
        assert got["gather"] == [[s] * (N * (N + 1) // 2) for s in range(steps)], (rank, got)
        assert got["bcast"] == [[4 + s] for s in range(steps)], (rank, got)
        assert got["split"] == ([[12]] * steps if rank in (1, 2, 4, 5) else []), (rank, got)
        assert got["host"] == ([[9 + 2 * s] for s in range(steps)] if rank in (4, 5) else []), (
            rank, got)  # fmt: skip
        leader = rank % PER_HOST == 0
        if rank == 0:
            # Its host's two other ranks, and host b's leader: not one per rank.
            assert rep["links"] == (PER_HOST - 1) + (HOSTS - 1), (rank, rep)
        elif leader:
            # Its two ranks and rank 0; it passed on at least each new name of each.
            assert rep["links"] == PER_HOST, (rank, rep)
            assert rep["relayed"] >= 2 * steps, (rank, rep)
        else:
            assert rep["links"] == 1 and rep["relayed"] == 0, (rank, rep)
        # A host's ranks reach their leader through shared memory.
        if not leader:
            assert rep["plane"] == "shm", (rank, rep)


# Two agreed calls of "x", then host b's leader (rank 3) SIGKILLs itself; every other
# rank's next call fails, naming it.
KILL_LEADER = """
import json, os, signal, time, torch, hvd_torch as hvd
hvd.init()
for _ in range(2):
    hvd.allreduce(torch.ones(2), name="x", op=hvd.Sum)
if hvd.rank() == 3:
    print(json.dumps(dict(rank=3, killed_at=time.time())), flush=True)
    os.kill(os.getpid(), signal.SIGKILL)
try:
    hvd.allreduce(torch.ones(2), name="x", op=hvd.Sum)
    report = dict(kind="ok", message="")
except hvd.HorovodInternalError as e:
    report = dict(kind="HorovodInternalError", message=str(e))
print(json.dumps(dict(report, rank=hvd.rank(), t=time.time())), flush=True)
"""


def test_a_killed_host_leader_fails_every_rank_naming_it(tmp_path):
    script = tmp_path / "rank.py"
    script.write_text(KILL_LEADER)
    with cluster(tmp_path, ["a", "b"]) as hosts:
        proc = spawn(["hvdrun", *_args(hosts, script, {})], launcher_env())
        run = finish(proc, JOB_TIMEOUT)
        ended = time.time()
    assert run.code == 128 + signal.SIGKILL, run
    (line,) = rank_lines(run.out, 3)
    took = ended - json.loads(line)["killed_at"]
    # Well before Gloo's 30 s op timeout, which is all a peer would have without the
    # control plane's word: a bound that load cannot reach, not a timing.
    assert took < 25, (took, run)
    survivors = [json.loads(x) for r in range(N) if r != 3 for x in rank_lines(run.out, r)]
    assert survivors, run
    for rep in survivors:
        assert rep["kind"] == "HorovodInternalError", (rep, run)
        assert "rank 3" in rep["message"], (rep, run)
    print(f"\nleader killed -> hvdrun exit in {took:.2f}s; {len(survivors)} survivors named it: "
          + "; ".join(sorted({rep['message'][:160] for rep in survivors})))
