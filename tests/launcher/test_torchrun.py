"""torchrun and hvdrun run each other's scripts (issue #31): torchrun launches an
`import hvd_torch as hvd` script (hvd.init() reads torchrun's variables and meets the
other ranks through torchrun's TCPStore), examples/digits_train.py unchanged and
examples/ddp_on_hvd.py; hvdrun launches
a plain DDP script that knows nothing of hvd (hvdrun sets RANK, WORLD_SIZE,
MASTER_ADDR, MASTER_PORT, ...) and the same DDP example over the "hvd" backend.
"""

import os
import re
import socket
import subprocess
import sys
from pathlib import Path

from hvdrun_job import run_hvdrun

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

PLAIN_DDP_SCRIPT = """
import hashlib, os
import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP

dist.init_process_group("gloo")   # env://: RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT
rank, size = dist.get_rank(), dist.get_world_size()
assert (os.environ["LOCAL_RANK"], os.environ["LOCAL_WORLD_SIZE"]) == (str(rank), str(size))
torch.manual_seed(0)
model = DDP(torch.nn.Linear(10, 2))
opt = torch.optim.SGD(model.parameters(), lr=0.1)
g = torch.Generator().manual_seed(rank)
for _ in range(3):
    opt.zero_grad()
    model(torch.randn(4, 10, generator=g)).pow(2).mean().backward()
    opt.step()
w = torch.cat([p.detach().reshape(-1) for p in model.parameters()])
digests = [None] * size
dist.all_gather_object(digests, hashlib.sha256(w.numpy().tobytes()).hexdigest()[:16])
assert len(set(digests)) == 1, digests
print(f"rank {rank} of {size}: ddp weights {digests[0]}", flush=True)
dist.destroy_process_group()
"""


def _env():
    return dict(os.environ, PYTHONPATH=str(ROOT),
                PATH=os.path.dirname(sys.executable) + os.pathsep + os.environ.get("PATH", ""))


def _free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _torchrun(*args, timeout=RUN_TIMEOUT):
    """`python -m torch.distributed.run --nproc-per-node 2 ...`; returns (code, output)."""
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "2",
           "--master-addr", "127.0.0.1", "--master-port", str(_free_port()), *map(str, args)]
    try:
        done = subprocess.run(cmd, env=_env(), cwd=ROOT, stdin=subprocess.DEVNULL,
                              stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                              timeout=timeout)
    except subprocess.TimeoutExpired as e:
        raise AssertionError(f"torchrun {args}: no exit within {timeout}s\n{e.output}") from None
    return done.returncode, done.stdout


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


def test_hvdrun_runs_a_plain_ddp_script(tmp_path):
    script = tmp_path / "plain_ddp.py"
    script.write_text(PLAIN_DDP_SCRIPT)
    code, out = _hvdrun(script)
    assert code == 0, out
    digests = re.findall(r"rank (\d) of 2: ddp weights ([0-9a-f]{16})", out)
    assert sorted(r for r, _ in digests) == ["0", "1"] and len({d for _, d in digests}) == 1, out


def test_hvdrun_runs_ddp_on_hvd_and_gloo_alike():
    losses = {}
    for backend in ("hvd", "gloo"):
        code, out = _hvdrun(EXAMPLES / "ddp_on_hvd.py", "--epochs", "1", "--backend", backend)
        assert code == 0, out
        assert f"(backend {backend}, 2 ranks)" in out and IDENTICAL.search(out), out
        losses[backend] = float(re.search(r"epoch 1/1  loss ([\d.]+)", out).group(1))
    # The same training: the mean loss agrees to the 4 decimals printed.
    assert losses["hvd"] == losses["gloo"], losses
