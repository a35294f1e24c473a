"""PyTorch Lightning (2.6.6) DDP on the "hvd" backend (issue #45), on 2 and 3 ranks.

examples/lightning_digits.py's model and Trainer (HvdStrategy: DDPStrategy on "hvd")
run through tests/harness/lightning_job.py, which writes every rank's report, under
Lightning's own launcher (one process; Lightning starts the others) and under
`hvdrun -np N`, and once on torch's gloo as the reference. Each run: the weights
changed, are identical on every rank and match gloo's within float rounding;
`self.log(..., sync_dist=True)` gives every rank the mean (and max) over ranks that
the reports let us compute independently. The example's CLI, under hvdrun, resumes
the checkpoint that the run under Lightning's launcher saved after its first epoch
and ends with that run's final weights. hvdrun's per-node mode and elastic mode
(after hvd.init()) run the job too.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import sys
from pathlib import Path

import pytest
import torch
from hvdrun_job import run_hvdrun, run_hvdrun_nodes
from torchrun_job import launch_env, run_in_session

ROOT = Path(__file__).resolve().parents[2]
JOB = ROOT / "tests" / "harness" / "lightning_job.py"
EXAMPLE = ROOT / "examples" / "lightning_digits.py"
EPOCHS = 2
# One run: N processes that each import Lightning (about 4 CPU-s each), then a few
# seconds of training; minutes when the 2 cores are shared with other jobs.
RUN_TIMEOUT = 300
RTOL, ATOL = 1e-5, 1e-6
# One pytest-xdist worker runs the whole module: the runs fixture (three jobs per N)
# then serves every test instead of being set up again on the other worker.
pytestmark = pytest.mark.xdist_group("lightning")


def run_lightning(*args, n: int):
    """`python args... --devices N`: Lightning's launcher starts ranks 1..N-1 as
    children of this process (same session, same output pipe). Returns (code, output)
    once every rank has closed the pipe; on a timeout the whole session is killed."""
    return run_in_session([sys.executable, *args, "--devices", n], RUN_TIMEOUT)


def run_hvdrun_job(*args, np: int = 0, launcher_args=()):
    """`hvdrun [-np N | launcher_args] python args...`; returns (code, output)."""
    prefix = [*launcher_args] if launcher_args else ["-np", str(np)]
    code, out, _ = run_hvdrun([*prefix, sys.executable, *map(str, args)], env=launch_env(),
                              cwd=ROOT, timeout=RUN_TIMEOUT, merge_stderr=True)
    return code, out


def job_args(out: Path, backend: str, *extra):
    return [JOB, "--out", out, "--backend", backend, "--epochs", EPOCHS, *extra]


def reports(out_dir: Path, n: int, output: str) -> list[dict]:
    """Every rank's report, in rank order."""
    found = sorted(out_dir.glob("rank*.json"))
    assert [p.name for p in found] == [f"rank{r}.json" for r in range(n)], output
    return [json.loads(p.read_text()) for p in found]


def job(out_dir: Path, n: int, launcher: str, backend: str, *extra) -> list[dict]:
    """One run of the harness job to its end; its ranks' reports."""
    args = job_args(out_dir, backend, *extra)
    if launcher == "lightning":
        code, out = run_lightning(*args, n=n)
    else:
        code, out = run_hvdrun_job(*args, np=n)
    assert code == 0, out
    return reports(out_dir, n, out)


def tensor(values) -> torch.Tensor:
    return torch.tensor(values, dtype=torch.float32)


def assert_trained_alike(runs: list[dict], reference: list[dict] | None = None):
    """Weights moved from the start, are the same on every rank, and (given a reference
    run on gloo) match its weights within float rounding."""
    first = tensor(runs[0]["final"])
    assert not torch.allclose(tensor(runs[0]["start"]), first), "the weights did not change"
    for r in runs:
        assert r["size"] == len(runs) and r["epochs_done"] == EPOCHS, r["rank"]
        assert torch.equal(tensor(r["final"]), first), f"rank {r['rank']} differs from rank 0"
    if reference is not None:
        want = tensor(reference[0]["final"])
        assert torch.allclose(first, want, rtol=RTOL, atol=ATOL), (first - want).abs().max()


@pytest.fixture(scope="module", params=[2, 3], ids=["2ranks", "3ranks"])
def runs(request, tmp_path_factory):
    """On N ranks: gloo and hvd (a checkpoint per epoch) under Lightning's launcher,
    hvd under hvdrun."""
    n, base = request.param, tmp_path_factory.mktemp(f"lightning{request.param}")
    done = {"n": n, "ckpt": base / "ckpt"}
    done["gloo"] = job(base / "gloo", n, "lightning", "gloo")
    done["lightning"] = job(base / "lightning", n, "lightning", "hvd", "--ckpt-dir", done["ckpt"])
    done["hvdrun"] = job(base / "hvdrun", n, "hvdrun", "hvd")
    return done


def test_hvd_trains_as_gloo_does(runs):
    assert_trained_alike(runs["gloo"])
    assert {r["backend"] for r in runs["gloo"]} == {"gloo"}
    for launcher, environment in (("lightning", "LightningEnvironment"),
                                  ("hvdrun", "HvdEnvironment")):
        assert {(r["backend"], r["environment"]) for r in runs[launcher]} == {
            ("hvd", environment)}, launcher  # fmt: skip
        assert_trained_alike(runs[launcher], runs["gloo"])


def test_sync_dist_gives_every_rank_the_mean_over_ranks(runs):
    """train_loss (sync_dist, on_epoch) is the last epoch's mean over every rank's
    batches, weighted by batch size; rank_mean and rank_max are known outright."""
    n = runs["n"]
    for launcher in ("gloo", "lightning", "hvdrun"):
        ranks = runs[launcher]
        steps = [step for r in ranks for step in r["losses"][str(EPOCHS - 1)]]
        mean = sum(loss * size for loss, size in steps) / sum(size for _, size in steps)
        for r in ranks:
            metrics = r["metrics"]
            assert metrics["train_loss"] == pytest.approx(mean, rel=RTOL), (launcher, r["rank"])
            assert metrics["rank_mean"] == pytest.approx((n - 1) / 2), (launcher, metrics)
            assert metrics["rank_max"] == n - 1, (launcher, metrics)
            assert metrics == ranks[0]["metrics"], (launcher, r["rank"])
        # Each rank's own losses differ: the mean above really is over ranks.
        assert len({json.dumps(r["losses"]) for r in ranks}) == n, launcher


def _printed(out: str) -> tuple[float, float, str]:
    """The example's last lines: the weights' sum, norm and sha256 prefix."""
    weights = re.search(r"weights: sum (-?[\d.]+)  norm ([\d.]+)", out)
    same = re.search(r"all \d ranks hold identical weights \(sha256 prefix ([0-9a-f]{16})\)", out)
    assert weights and same, out
    return float(weights.group(1)), float(weights.group(2)), same.group(1)


def test_example_resumes_a_checkpoint_to_the_same_weights(runs):
    """The example's CLI as a user runs it, `hvdrun -np N python examples/lightning_digits.py
    --resume CKPT`, from the checkpoint that the run under Lightning's launcher saved
    after epoch 0: it trains epoch 1 only (weights, momentum and loop position restored)
    and ends bit for bit where the uninterrupted run did."""
    n, ckpt = runs["n"], runs["ckpt"]
    assert sorted(p.name for p in ckpt.iterdir()) == ["epoch=0.ckpt", "epoch=1.ckpt", "last.ckpt"]
    code, out = run_hvdrun_job(EXAMPLE, "--epochs", EPOCHS, "--resume", ckpt / "epoch=0.ckpt",
                               np=n)
    assert code == 0, out
    assert f"Restored all states from the checkpoint at {ckpt / 'epoch=0.ckpt'}" in out, out
    assert f"epoch {EPOCHS}: train_loss" in out and f"(backend hvd, {n} ranks)" in out, out
    whole = tensor(runs["lightning"][0]["final"])
    total, norm, digest = _printed(out)
    assert digest == hashlib.sha256(whole.numpy().tobytes()).hexdigest()[:16], out
    gloo = tensor(runs["gloo"][0]["final"])
    assert (total, norm) == pytest.approx((gloo.sum().item(), gloo.norm().item()), rel=RTOL,
                                          abs=1e-5)


@pytest.mark.parametrize("runs", [2], indirect=True, ids=["2ranks"])
def test_hvdrun_per_node_mode(runs, tmp_path):
    """Two one-rank "nodes" on this machine (one hvdrun each, as srun starts them):
    HvdEnvironment takes node rank and counts from hvdrun, and the example's defaults
    (devices=LOCAL_WORLD_SIZE, num_nodes=GROUP_WORLD_SIZE) agree with them."""
    env = launch_env(HVD_TORCH_SECRET=os.urandom(16).hex())
    codes, outs, _ = run_hvdrun_nodes([sys.executable, *job_args(tmp_path, "hvd")], env, ROOT,
                                      RUN_TIMEOUT)
    assert codes == [0, 0], outs
    ranks = reports(tmp_path, 2, "\n".join(outs))
    assert {r["environment"] for r in ranks} == {"HvdEnvironment"}
    assert_trained_alike(ranks, runs["gloo"])


@pytest.mark.parametrize("runs", [2], indirect=True, ids=["2ranks"])
def test_elastic_hvdrun_after_hvd_init(runs, tmp_path):
    """A worker of elastic hvdrun learns its rank in hvd.init(), then trains as under
    static hvdrun (a fixed world: no reset happens)."""
    code, out = run_hvdrun_job(*job_args(tmp_path, "hvd", "--hvd-init"), launcher_args=[
        "--min-np", "2", "--max-np", "2", "-H", "localhost:2"])
    assert code == 0, out
    ranks = reports(tmp_path, 2, out)
    assert {r["environment"] for r in ranks} == {"HvdEnvironment"}
    assert_trained_alike(ranks, runs["gloo"])


# ------------------------------------------------ HvdEnvironment and HvdStrategy in-process


HVDRUN_3_RANKS_HOST_1 = {"HOROVOD_RANK": "1", "HOROVOD_SIZE": "3", "HOROVOD_LOCAL_RANK": "1",
                         "HOROVOD_LOCAL_SIZE": "3", "HOROVOD_CROSS_RANK": "0",
                         "HOROVOD_CROSS_SIZE": "1", "MASTER_ADDR": "127.0.0.1",
                         "MASTER_PORT": "29500"}  # fmt: skip


@pytest.fixture
def hvdrun_env(monkeypatch):
    for name in (*HVDRUN_3_RANKS_HOST_1, "HOROVOD_ELASTIC"):
        monkeypatch.delenv(name, raising=False)
    return monkeypatch


def test_strategy_under_hvdrun_takes_the_launchers_ranks(hvdrun_env):
    from hvd_torch.integrations.lightning import HvdEnvironment, HvdStrategy

    for name, value in HVDRUN_3_RANKS_HOST_1.items():
        hvdrun_env.setenv(name, value)
    strategy = HvdStrategy()
    env = strategy.cluster_environment
    assert isinstance(env, HvdEnvironment) and strategy.process_group_backend == "hvd"
    assert (env.global_rank(), env.world_size(), env.local_rank(), env.node_rank()) == (1, 3, 1, 0)
    assert (env.main_address, env.main_port, env.creates_processes_externally) == (
        "127.0.0.1", 29500, True)  # fmt: skip
    env.validate_settings(num_devices=3, num_nodes=1)
    with pytest.raises(ValueError, match=r"3 ranks on 1 host\(s\), 3 on this one \(rank 1\), "
                                         r"but the Trainer has devices=2, num_nodes=1: pass "
                                         r"devices=3, num_nodes=1"):
        env.validate_settings(num_devices=2, num_nodes=1)


def test_strategy_elsewhere_leaves_the_environment_to_lightning(hvdrun_env):
    from hvd_torch.integrations.lightning import HvdStrategy

    strategy = HvdStrategy(process_group_backend="gloo")
    assert strategy.cluster_environment is None and strategy.process_group_backend == "gloo"


def test_elastic_worker_must_call_hvd_init_first(hvdrun_env):
    from hvd_torch.integrations.lightning import HvdStrategy

    hvdrun_env.setenv("HOROVOD_ELASTIC", "1")
    with pytest.raises(RuntimeError, match=r"call hvd.init\(\) before creating the Trainer"):
        HvdStrategy()
