"""The "hvd" torch.distributed backend never publishes its store's secret in torch's
store, which anyone who reaches it can read (issue #44): on one host the secret goes
to the other ranks in a file only this user can read; across hosts it must come
from HVD_TORCH_SECRET, and without it every rank refuses, naming the variable."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
TIMEOUT = 120  # two ranks that import torch, on two busy cores

# A rank of a plain torch.distributed job on the "hvd" backend, meeting the other
# through a FileStore (whose file holds every key and value torch's store got).
RANK = """
import glob, json, os, sys, tempfile, torch, torch.distributed as dist
import hvd_torch  # registers the backend
path, rank = sys.argv[1], int(sys.argv[2])
dist.init_process_group("hvd", store=dist.FileStore(path, 2), rank=rank, world_size=2)
t = torch.tensor([rank + 1.0])
dist.all_reduce(t)
dist.barrier()
secret = os.environ["HOROVOD_SECRET_KEY"]
seen = open(path, "rb").read()
print(json.dumps({"sum": t.item(), "secret": secret, "store_host": os.environ[
    "HOROVOD_GLOO_RENDEZVOUS_ADDR"], "leaked": secret.encode() in seen.lower()
    or bytes.fromhex(secret) in seen, "secret_dirs": glob.glob(os.path.join(
    tempfile.gettempdir(), "hvd_torch-*"))}), flush=True)
dist.destroy_process_group()
"""


def _run_job(tmp_path, extra_env):
    store = tmp_path / "filestore"
    # A temp folder of the job's own: what rank 0's secret file leaves behind is seen.
    (tmp_path / "tmp").mkdir()
    env = dict(os.environ, PYTHONPATH=str(ROOT), TMPDIR=str(tmp_path / "tmp"), **extra_env)
    procs = []
    for rank in range(2):
        rank_env = {k: v.format(rank=rank) for k, v in env.items()}
        procs.append(subprocess.Popen(
            [sys.executable, "-c", RANK, str(store), str(rank)], env=rank_env, cwd=tmp_path,
            stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True))
    try:
        outs = [p.communicate(timeout=TIMEOUT) for p in procs]
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.communicate()
    return [p.returncode for p in procs], outs


def _reports(codes, outs):
    assert codes == [0, 0], outs
    return [json.loads(out.strip().splitlines()[-1]) for out, _ in outs]


def test_one_host_hands_the_secret_over_in_a_private_file_not_in_torchs_store(tmp_path):
    reports = _reports(*_run_job(tmp_path, {}))
    assert [r["sum"] for r in reports] == [3.0, 3.0]
    assert reports[0]["secret"] == reports[1]["secret"] and len(reports[0]["secret"]) == 64
    assert not any(r["leaked"] for r in reports), reports
    assert {r["store_host"] for r in reports} == {"127.0.0.1"}
    # Gone once every rank met the engine, while the job still runs: a rank its
    # driver kills (Ray's workers) never runs the atexit that removes it too.
    assert [r["secret_dirs"] for r in reports] == [[], []], reports


TWO_HOSTS = {  # torchrun's variables for one rank on each of two hosts
    "RANK": "{rank}", "WORLD_SIZE": "2", "LOCAL_RANK": "0", "LOCAL_WORLD_SIZE": "1",
    "GROUP_RANK": "{rank}", "GROUP_WORLD_SIZE": "2", "MASTER_ADDR": "127.0.0.1",
}


def test_across_hosts_every_rank_refuses_without_a_given_secret(tmp_path):
    codes, outs = _run_job(tmp_path, TWO_HOSTS)
    assert codes == [1, 1], outs
    for _, err in outs:
        assert "this job spans 2 hosts: set HVD_TORCH_SECRET" in err, err


def test_across_hosts_the_given_secret_is_used_and_never_published(tmp_path):
    secret = os.urandom(32).hex()
    reports = _reports(*_run_job(tmp_path, dict(TWO_HOSTS, HVD_TORCH_SECRET=secret)))
    assert [r["sum"] for r in reports] == [3.0, 3.0]
    assert [r["secret"] for r in reports] == [secret, secret]
    assert not any(r["leaked"] for r in reports), reports
    # The store listens on the address towards MASTER_ADDR, not on every interface.
    assert {r["store_host"] for r in reports} == {"127.0.0.1"}


@pytest.mark.unit
def test_a_secret_file_anyone_else_could_have_written_is_refused(tmp_path):
    from hvd_torch.store_rendezvous import _private_secret_file, _read_secret_file

    path = _private_secret_file(b"s" * 32)
    assert oct(os.stat(path).st_mode & 0o777) == "0o600"
    assert oct(os.stat(os.path.dirname(path)).st_mode & 0o777) == "0o700"
    assert _read_secret_file(path) == b"s" * 32
    loose = tmp_path / "loose"
    loose.write_bytes(b"x" * 32)
    loose.chmod(0o644)
    with pytest.raises(RuntimeError, match="refusing the secret file"):
        _read_secret_file(str(loose))
    link = tmp_path / "link"
    link.symlink_to(path)
    with pytest.raises(RuntimeError, match="cannot read rank 0's secret file"):
        _read_secret_file(str(link))
    with pytest.raises(RuntimeError, match="names no secret file"):
        _read_secret_file(None)
