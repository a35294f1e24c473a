"""torchrun and hvdrun run each other's scripts (issue #31): torchrun launches an
`import hvd_torch as hvd` script (hvd.init() reads torchrun's variables and meets the
other ranks through torchrun's TCPStore), examples/digits_train.py unchanged and
examples/ddp_on_hvd.py; hvdrun launches a plain DDP script that knows nothing of hvd
(hvdrun sets RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT, ...) in its static, per-node
and elastic modes (elastic: after hvd.init(), which joins the round), and the same DDP
example over the "hvd" backend.
"""

import os
import re
import sys
from pathlib import Path

from hvdrun_job import run_hvdrun, run_hvdrun_nodes
from torchrun_job import PLAIN_DDP, ddp_reports as _ddp_reports
from torchrun_job import launch_env as _env, run_torchrun as _torchrun

ROOT = Path(__file__).resolve().parents[2]
EXAMPLES = ROOT / "examples"
# Each run starts 2 ranks that import torch (10-40 s on 2 busy cores).
RUN_TIMEOUT = 150
IDENTICAL = re.compile(r"all 2 ranks hold identical weights \(sha256 prefix ([0-9a-f]{16})\)")

HVD_SCRIPT = """
import torch
import hvd_torch as hvd

hvd.init()
total = hvd.allreduce(torch.tensor([hvd.rank() + 1.0]), op=hvd.Sum)
print(f"rank {hvd.rank()} of {hvd.size()}, local {hvd.local_rank()} of {hvd.local_size()}, "
      f"host {hvd.cross_rank()} of {hvd.cross_size()}: sum {total.item():g}", flush=True)
hvd.shutdown()
hvd.init()  # again: the same rendezvous store, a new scope
print(f"rank {hvd.rank()} again: {hvd.allreduce(torch.ones(1), op=hvd.Sum).item():g}", flush=True)
"""


def _hvdrun(*args):
    code, out, _ = run_hvdrun(["-np", "2", sys.executable, *map(str, args)], env=_env(), cwd=ROOT,
                              timeout=RUN_TIMEOUT, merge_stderr=True)
    return code, out


def test_torchrun_runs_an_hvd_script(tmp_path):
    script = tmp_path / "hvd_script.py"
    script.write_text(HVD_SCRIPT)
    code, out = _torchrun(script)
    assert code == 0, out
    for rank in range(2):
        assert f"rank {rank} of 2, local {rank} of 2, host 0 of 1: sum 3" in out, out
        assert f"rank {rank} again: 2" in out, out


def test_torchrun_runs_digits_train_unchanged(tmp_path):
    """The Horovod-style example (hvd.init, DistributedOptimizer, broadcasts) under torchrun."""
    code, out = _torchrun(EXAMPLES / "digits_train.py", "--epochs", "1",
                          "--checkpoint", tmp_path / "digits.pt")
    assert code == 0, out
    assert out.startswith("2 rank(s)") or "\n2 rank(s), DigitsNet" in out, out
    assert re.search(r"epoch\s+1/1\s+loss [\d.]+\s+val accuracy", out) and IDENTICAL.search(out), out


def test_torchrun_runs_ddp_on_hvd_with_hvd_metrics():
    code, out = _torchrun(EXAMPLES / "ddp_on_hvd.py", "--epochs", "1", "--hvd-metrics")
    assert code == 0, out
    assert "(backend hvd, 2 ranks)" in out and IDENTICAL.search(out), out


def _env_of(report, *names):
    return tuple(report["env"][n] for n in names)


def test_hvdrun_runs_a_plain_ddp_script():
    code, out = _hvdrun(PLAIN_DDP)
    assert code == 0, out
    for rank, report in _ddp_reports(out, 2).items():
        assert not report["hvd_imported"]
        assert _env_of(report, "LOCAL_RANK", "LOCAL_WORLD_SIZE", "GROUP_RANK") == (
            str(rank), "2", "0"), report  # fmt: skip
        assert report["env"]["MASTER_ADDR"] == "127.0.0.1", report


def test_hvdrun_per_node_runs_a_plain_ddp_script():
    """Two "nodes" on this machine (one hvdrun each, as srun would start them), one rank
    each: node 0 picks MASTER_PORT and publishes it through the rendezvous store."""
    env = dict(_env(), HVD_TORCH_SECRET=os.urandom(16).hex())
    codes, outs, rdzv_port = run_hvdrun_nodes([sys.executable, PLAIN_DDP], env, ROOT,
                                              RUN_TIMEOUT)
    assert codes == [0, 0], outs
    reports = _ddp_reports("\n".join(outs), 2)
    for rank, report in reports.items():
        assert _env_of(report, "LOCAL_RANK", "LOCAL_WORLD_SIZE", "GROUP_RANK",
                       "GROUP_WORLD_SIZE") == ("0", "1", str(rank), "2"), report  # fmt: skip
        assert report["env"]["MASTER_ADDR"] == "127.0.0.1", report  # the endpoint's host
    master_ports = {r["env"]["MASTER_PORT"] for r in reports.values()}
    assert len(master_ports) == 1 and master_ports != {str(rdzv_port)}, reports


def test_elastic_hvdrun_runs_a_ddp_script_after_hvd_init():
    """Elastic workers learn their round's rank and MASTER_ADDR/MASTER_PORT in hvd.init()."""
    code, out, _ = run_hvdrun(
        ["--min-np", "2", "--max-np", "2", "-H", "localhost:2", sys.executable, str(PLAIN_DDP),
         "--hvd-init"], env=_env(), cwd=ROOT, timeout=RUN_TIMEOUT, merge_stderr=True)  # fmt: skip
    assert code == 0, out
    reports = _ddp_reports(out, 2)
    assert len({_env_of(r, "MASTER_ADDR", "MASTER_PORT") for r in reports.values()}) == 1, out
    assert reports[0]["env"]["MASTER_ADDR"] == "127.0.0.1", out


def test_hvdrun_runs_ddp_on_hvd_and_gloo_alike():
    losses = {}
    for backend in ("hvd", "gloo"):
        code, out = _hvdrun(EXAMPLES / "ddp_on_hvd.py", "--epochs", "1", "--backend", backend)
        assert code == 0, out
        assert f"(backend {backend}, 2 ranks)" in out and IDENTICAL.search(out), out
        losses[backend] = float(re.search(r"epoch 1/1  loss ([\d.]+)", out).group(1))
    # The same training: the mean loss agrees to the 4 decimals printed.
    assert losses["hvd"] == losses["gloo"], losses
