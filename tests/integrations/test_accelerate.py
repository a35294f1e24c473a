"""Hugging Face Accelerate on the "hvd" backend, on CPU (issue #45).

examples/accelerate_digits.py (hvd_torch.integrations.accelerate.accelerator(): the
default group on hvd, adopted by Accelerate) trains 8 steps on 2 and 3 processes
under `accelerate launch`, torchrun and hvdrun; every rank ends with the same weights,
moved from the start, equal within float tolerance to the same script on Accelerate's
own CPU backend (gloo, under torchrun), and the loss Accelerate gathered matches too.
Accelerate's gather takes its all_gather_into_tensor path there (the label is "hvd").

And the helper's own rules, in one fresh interpreter: a plain `python script.py` is
one process without a group, a group on another backend is refused by name, and
Accelerate's own refusal of backend="hvd" on CPU (why the helper exists) still holds.
"""

import subprocess
import sys

import pytest
import torch

from accelerate_job import (LAUNCHERS, RUN_TIMEOUT, GlooRuns, assert_trained_alike,
                            offline_env, run_example, saved_ranks)
from torchrun_job import ROOT, free_port

SCRIPT = "accelerate_digits.py"


@pytest.fixture(scope="module")
def gloo_runs(tmp_path_factory):
    return GlooRuns(tmp_path_factory, SCRIPT)


@pytest.mark.parametrize("nproc", [2, 3])
@pytest.mark.parametrize("launcher", LAUNCHERS)
def test_accelerate_digits_on_hvd_matches_gloo(launcher, nproc, tmp_path, gloo_runs):
    out = tmp_path / "out"
    code, output = run_example(launcher, SCRIPT, nproc, out)
    assert code == 0, output
    assert f"(backend hvd, {nproc} processes)" in output, output
    hvd = saved_ranks(out, nproc, output)
    gloo = gloo_runs(nproc)
    assert_trained_alike(hvd, gloo)
    for saved in hvd:
        assert saved["accelerate_backend"] == "hvd", saved["accelerate_backend"]
        assert saved["losses"] == hvd[0]["losses"], "ranks gathered different losses"
    assert torch.allclose(torch.tensor(hvd[0]["losses"]), torch.tensor(gloo[0]["losses"]),
                          rtol=1e-5, atol=1e-6), (hvd[0]["losses"], gloo[0]["losses"])


HELPER_RULES = """
import os, torch.distributed as dist
from accelerate import PartialState
from accelerate.utils import DistributedType
from hvd_torch.integrations.accelerate import partial_state

state = partial_state()                       # no launcher: one process, no group
assert state.distributed_type == DistributedType.NO and not dist.is_initialized()
PartialState._reset_state()

os.environ.update(RANK="0", WORLD_SIZE="1", LOCAL_RANK="0", LOCAL_WORLD_SIZE="1",
                  MASTER_ADDR="127.0.0.1", MASTER_PORT=os.environ["TEST_PORT"])
try:
    PartialState(cpu=True, backend="hvd")     # Accelerate alone: refused on CPU
    raise SystemExit("Accelerate accepted backend='hvd' on CPU: revisit the helper")
except ValueError as e:
    assert "backend hvd is not available" in str(e), e
PartialState._reset_state()

dist.init_process_group("gloo")
try:
    partial_state()
    raise SystemExit("a gloo group was taken")
except ValueError as e:
    assert "already runs on 'gloo'" in str(e), e
dist.destroy_process_group()
PartialState._reset_state()

state = partial_state()                       # a launched process: the group is hvd's
assert dist.get_backend() == "hvd" and state.backend == "hvd", (dist.get_backend(), state)
assert state.distributed_type == DistributedType.MULTI_CPU and state.num_processes == 1
print("helper rules hold", flush=True)
"""


def test_partial_state_rules(tmp_path):
    env = {k: v for k, v in offline_env(tmp_path).items()
           if k not in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT")}
    env["TEST_PORT"] = str(free_port())
    done = subprocess.run([sys.executable, "-c", HELPER_RULES], env=env, cwd=ROOT,
                          stdin=subprocess.DEVNULL, capture_output=True, text=True,
                          timeout=RUN_TIMEOUT)
    assert done.returncode == 0 and "helper rules hold" in done.stdout, done.stdout + done.stderr
