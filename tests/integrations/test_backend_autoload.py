"""init_process_group("hvd") in a process that never imported hvd_torch (issue #45):
torch's `torch.backends` entry point (hvd_torch_autoload) registers a lazy creator
while `import torch` runs, as a framework that creates the group itself needs.

In fresh interpreters: `import torch` registers "hvd" and imports nothing of ours;
each off switch turns it off; a stub that fails leaves `import torch` working;
and a plain DDP script on backend "hvd" (tests/harness/plain_ddp.py, which imports
only torch) trains on 2 and 3 ranks under torchrun and hvdrun to the weights of the
same script on gloo. tests/unit/test_autoload.py has the stub's own logic.
"""

import json
import subprocess
import sys

import pytest
import torch

from hvdrun_job import run_hvdrun
from torchrun_job import PLAIN_DDP, ROOT, ddp_reports, launch_env, run_torchrun

RUN_TIMEOUT = 150

PROBE = """
import json, sys, time
t = time.perf_counter()
import torch
import torch.distributed as dist
plugin = dist.Backend._plugins.get("HVD")
print("probe " + json.dumps({
    "hvd_torch_imported": "hvd_torch" in sys.modules,
    "registered": plugin is not None,
    "creator": None if plugin is None else plugin.creator_fn.__module__,
    "capability": dist.Backend.backend_capability.get("hvd"),
}))
"""


def _probe(**env):
    done = subprocess.run([sys.executable, "-c", PROBE], env=launch_env(**env), cwd="/",
                          stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    line = [x for x in done.stdout.splitlines() if x.startswith("probe ")]
    assert line, done.stdout + done.stderr
    return json.loads(line[0][len("probe "):]), done.stderr


def test_import_torch_registers_hvd_and_imports_nothing_of_ours():
    seen, _ = _probe()
    from hvd_torch import _build_info

    devices = ["cpu", "cuda"] if _build_info.cuda_built else ["cpu"]
    assert seen == {"hvd_torch_imported": False, "registered": True,
                    "creator": "hvd_torch_autoload", "capability": devices}, seen


@pytest.mark.parametrize("switch", ["HVD_TORCH_AUTOLOAD", "TORCH_DEVICE_BACKEND_AUTOLOAD"])
def test_each_off_switch_leaves_hvd_unregistered(switch):
    seen, _ = _probe(**{switch: "0"})
    assert not seen["registered"] and not seen["hvd_torch_imported"], seen


def test_a_failing_stub_logs_and_leaves_import_torch_working(tmp_path):
    """A build record the stub cannot parse (found first on PYTHONPATH): `import torch`
    still succeeds, "hvd" is simply not registered, and the log says why."""
    fake = tmp_path / "hvd_torch"
    fake.mkdir()
    (fake / "__init__.py").write_text("")
    (fake / "_build_info.py").write_text("cuda_built = (\n")
    seen, err = _probe(PYTHONPATH=f"{tmp_path}:{ROOT}")
    assert not seen["registered"], seen
    assert "could not register the \"hvd\" torch.distributed backend" in err, err
    assert "SyntaxError" in err, err


def _weights(reports):
    return {rank: torch.tensor(r["weights"]) for rank, r in reports.items()}


def _trained_alike(hvd_reports, gloo_reports):
    """Every rank never imported hvd_torch before its group, used hvd, ended with the
    same weights, and those match gloo's (within float tolerance: the ranks' sums
    may be added in another order) and moved from the start."""
    for report in hvd_reports.values():
        assert report["backend"] == "hvd" and not report["hvd_imported_before"], report
        assert report["hvd_imported"], report  # the lazy creator imported it
    hvd_w, gloo_w = _weights(hvd_reports), _weights(gloo_reports)
    torch.manual_seed(0)
    start = torch.cat([p.detach().reshape(-1) for p in torch.nn.Linear(10, 2).parameters()])
    for rank, w in hvd_w.items():
        assert torch.equal(w, hvd_w[0]), (rank, w, hvd_w[0])
        assert torch.allclose(w, gloo_w[rank], rtol=1e-5, atol=1e-6), (w, gloo_w[rank])
        assert not torch.allclose(w, start), "the weights never moved"


@pytest.mark.parametrize("nproc", [2, 3])
def test_torchrun_plain_ddp_on_hvd_without_import(nproc):
    runs = {}
    for backend in ("hvd", "gloo"):
        code, out = run_torchrun(PLAIN_DDP, "--backend", backend, nproc=nproc,
                                 timeout=RUN_TIMEOUT)
        assert code == 0, out
        runs[backend] = ddp_reports(out, nproc)
    _trained_alike(runs["hvd"], runs["gloo"])


@pytest.mark.parametrize("nproc", [2, 3])
def test_hvdrun_plain_ddp_on_hvd_without_import(nproc):
    runs = {}
    for backend in ("hvd", "gloo"):
        code, out, _ = run_hvdrun(["-np", str(nproc), sys.executable, str(PLAIN_DDP),
                                   "--backend", backend], env=launch_env(), cwd=ROOT,
                                  timeout=RUN_TIMEOUT, merge_stderr=True)
        assert code == 0, out
        runs[backend] = ddp_reports(out, nproc)
    _trained_alike(runs["hvd"], runs["gloo"])
