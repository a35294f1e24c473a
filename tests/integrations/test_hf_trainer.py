"""The Transformers Trainer on the "hvd" backend, on CPU (issue #45).

examples/hf_trainer_tiny.py (a 2-layer BERT of hidden size 32 built from a config,
random token data, no download) calls hvd_torch.integrations.accelerate.partial_state()
before TrainingArguments(use_cpu=True): the Trainer's Accelerate adopts the hvd group
and DDP runs on it. 4 steps on 2 ranks under torchrun and `accelerate launch`, and on
3 under hvdrun (SGD, below); every rank ends with the same weights, moved from the start, equal
within float tolerance to the same script on the Trainer's own CPU backend (gloo,
under torchrun), and the same training loss.

Also the reason the script needs the helper: TrainingArguments(use_cpu=True,
ddp_backend="hvd") is refused by Accelerate ("Your assigned backend hvd is not
available, please use gloo"), checked in one process, which is all it takes.
"""

import math
import subprocess
import sys

import pytest

from accelerate_job import (RUN_TIMEOUT, GlooRuns, assert_trained_alike, offline_env,
                            run_example, saved_ranks)

SCRIPT = "hf_trainer_tiny.py"
# SGD, not the Trainer's default AdamW, for the comparison with gloo: Adam divides each
# step by the gradient's running RMS, so an element whose ranks' gradients nearly
# cancel turns a rounding difference of the sum's order into a visible step (3 ranks,
# AdamW: 16 weights differ by up to 2.3e-6, one of 7.6e-7; SGD: at most 1.9e-9).
OPTIM = ("--optim", "sgd")


@pytest.fixture(scope="module")
def gloo_runs(tmp_path_factory):
    return GlooRuns(tmp_path_factory, SCRIPT, *OPTIM)


@pytest.mark.parametrize("launcher, nproc", [("torchrun", 2), ("accelerate", 2), ("hvdrun", 3)])
def test_trainer_on_hvd_matches_gloo(launcher, nproc, tmp_path, gloo_runs):
    out = tmp_path / "out"
    code, output = run_example(launcher, SCRIPT, nproc, out, *OPTIM)
    assert code == 0, output
    assert "trained 4 steps" in output and f"(backend hvd, {nproc} processes)" in output, output
    hvd, gloo = saved_ranks(out, nproc, output), gloo_runs(nproc)
    assert_trained_alike(hvd, gloo)
    assert math.isclose(hvd[0]["loss"], gloo[0]["loss"], rel_tol=1e-5), (hvd[0], gloo[0])


REFUSED = """
from transformers import TrainingArguments
try:
    TrainingArguments(output_dir="out", use_cpu=True, ddp_backend="hvd", report_to="none").device
except ValueError as e:
    print("refused:", e)
else:
    print("accepted")
"""


def test_ddp_backend_hvd_is_refused_on_cpu(tmp_path):
    """One process that looks launched (RANK, WORLD_SIZE 2): Accelerate refuses the name
    before any group exists. If a later Accelerate accepts it, docs/integrations.md and
    the example can say so."""
    env = offline_env(tmp_path / "hf_home")
    env.update(RANK="0", WORLD_SIZE="2", LOCAL_RANK="0", LOCAL_WORLD_SIZE="2")
    done = subprocess.run([sys.executable, "-c", REFUSED], env=env, cwd=tmp_path,
                          stdin=subprocess.DEVNULL, capture_output=True, text=True,
                          timeout=RUN_TIMEOUT)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "refused: Your assigned backend hvd is not available, please use gloo" in done.stdout, \
        done.stdout + done.stderr
