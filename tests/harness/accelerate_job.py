"""Accelerate and Transformers examples (examples/accelerate_digits.py,
examples/hf_trainer_tiny.py) under the three launchers a user has, and the checks on
what their ranks saved: shared by tests/integrations/test_accelerate.py and
test_hf_trainer.py.

Each example saves DIR/rank<r>.pt on every rank: its start and end weights and the
backend of its process group. `accelerate launch` reads a config file written here
(never the user's ~/.cache/huggingface one), and nothing may reach the network.
"""

from __future__ import annotations

import sys
from pathlib import Path

import torch

from hvdrun_job import run_hvdrun
from torchrun_job import ROOT, launch_env, run_in_session, run_torchrun

EXAMPLES = ROOT / "examples"
LAUNCHERS = ("accelerate", "torchrun", "hvdrun")
# One run, most of it starting the processes and importing Accelerate (or
# Transformers): 7-20 s each on 2 busy cores.
RUN_TIMEOUT = 150

# accelerate launch starts N local processes through torch.distributed.run only in
# its multi-GPU mode; on a machine without GPUs they run on the CPU. Port 0: a free one.
ACCELERATE_CONFIG = """\
compute_environment: LOCAL_MACHINE
distributed_type: MULTI_GPU
num_machines: 1
num_processes: {nproc}
main_process_port: 0
mixed_precision: 'no'
dynamo_config: {{}}
"""


def offline_env(home: Path) -> dict:
    """launch_env() with Hugging Face's folders under `home` and the Hub switched off."""
    return launch_env(HF_HOME=str(home), HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1",
                      HF_DATASETS_OFFLINE="1")


def run_example(launcher: str, script: str, nproc: int, out: Path, *args) -> tuple[int, str]:
    """examples/<script> --out OUT args... on nproc processes under `launcher`;
    (exit code, output with stderr merged)."""
    env = offline_env(out.parent / "hf_home")
    argv = [str(EXAMPLES / script), "--out", str(out), *map(str, args)]
    if launcher == "torchrun":
        return run_torchrun(*argv, nproc=nproc, timeout=RUN_TIMEOUT, env=env)
    if launcher == "hvdrun":
        code, output, _ = run_hvdrun(["-np", str(nproc), sys.executable, *argv], env=env,
                                     cwd=ROOT, timeout=RUN_TIMEOUT, merge_stderr=True)
        return code, output
    if launcher == "accelerate":
        config = out.parent / f"accelerate_{nproc}.yaml"
        config.write_text(ACCELERATE_CONFIG.format(nproc=nproc))
        return _run([sys.executable, "-m", "accelerate.commands.launch", "--config_file",
                     str(config), *argv], env)
    raise ValueError(f"unknown launcher {launcher!r}")


def _run(cmd, env) -> tuple[int, str]:
    return run_in_session(cmd, RUN_TIMEOUT, env)


def saved_ranks(out: Path, nproc: int, output: str) -> list[dict]:
    """Every rank's rank<r>.pt, in rank order, each checked to be from a job of nproc."""
    files = sorted(p.name for p in out.glob("rank*.pt"))
    assert files == sorted(f"rank{r}.pt" for r in range(nproc)), (files, output)
    ranks = [torch.load(out / f"rank{r}.pt") for r in range(nproc)]
    for r, saved in enumerate(ranks):
        assert saved["rank"] == r and saved["size"] == nproc, (saved["rank"], saved["size"])
    return ranks


class GlooRuns:
    """The gloo reference of one example, run under torchrun once per number of
    processes and kept: runs(nproc) is each rank's saved run, in rank order."""

    def __init__(self, tmp_path_factory, script: str, *args):
        self.tmp_path_factory, self.script, self.args = tmp_path_factory, script, args
        self.runs = {}

    def __call__(self, nproc: int) -> list[dict]:
        if nproc not in self.runs:
            out = self.tmp_path_factory.mktemp(f"gloo{nproc}") / "out"
            code, output = run_example("torchrun", self.script, nproc, out, *self.args,
                                       "--backend", "gloo")
            assert code == 0, output
            self.runs[nproc] = saved_ranks(out, nproc, output)
        return self.runs[nproc]


def assert_trained_alike(hvd_ranks: list[dict], gloo_ranks: list[dict]) -> None:
    """The hvd run's group was hvd's; its weights moved from the start, are the same on
    every rank, and match the gloo run's within float tolerance (hvd may add the ranks'
    gradients in another order than gloo)."""
    for saved in hvd_ranks:
        assert saved["backend"] == "hvd", saved["backend"]
    for saved in gloo_ranks:
        assert saved["backend"] == "gloo", saved["backend"]
    end = hvd_ranks[0]["end"]
    assert not torch.allclose(end, hvd_ranks[0]["start"]), "the weights never moved"
    for r, saved in enumerate(hvd_ranks):
        assert torch.equal(saved["start"], hvd_ranks[0]["start"]), f"rank {r} started elsewhere"
        assert torch.equal(saved["end"], end), f"rank {r} ended with other weights than rank 0"
        gloo = gloo_ranks[r]["end"]
        assert torch.allclose(saved["end"], gloo, rtol=1e-5, atol=1e-6), \
            f"rank {r}: hvd and gloo differ by {(saved['end'] - gloo).abs().max().item()}"
