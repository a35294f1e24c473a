"""Autotune (docs/toolbox.md, "Autotune"): on a synthetic workload where a known
setting is clearly best, rank 0's tuner logs its trials, settles in the good
region, and every rank ends up with the values rank 0 chose. Real ranks."""

import csv

import pytest
import torch

from dist_harness import run_ranks

MiB = 1 << 20


def _workload(steps, ntensors, numel):
    """A training loop's communication: ntensors named gradients per step,
    submitted together, then waited for."""
    import hvd_torch as hvd
    from hvd_torch import _C

    hvd.init()
    grads = [torch.ones(numel) for _ in range(ntensors)]
    for _ in range(steps):
        handles = [hvd.allreduce_async(g, name=f"grad.{i}", op=hvd.Sum)
                   for i, g in enumerate(grads)]
        for h in handles:
            hvd.synchronize(h)
    # One more op after rank 0 settled: every rank has read the last change.
    hvd.allreduce(torch.ones(1), name="end")
    tunables = _C.tunables()
    hvd.shutdown()
    return tunables


def _log(path):
    with open(path) as f:
        rows = list(csv.DictReader(f))
    trials = [r for r in rows if r["trial"] != "settled"]
    settled = [r for r in rows if r["trial"] == "settled"]
    assert len(settled) == 1, rows
    return trials, settled[0]


@pytest.mark.parametrize(
    "knob, fixed, ntensors, numel, good",
    [
        # 64 gradients of 16 KiB through Gloo: a threshold of 0 fuses nothing
        # (64 collectives a step), anything from 1 MiB fuses the step into one.
        ("fusion_threshold", {"HVD_TORCH_INLINE_THRESHOLD": "0"}, 64, 4096,
         lambda v: v >= 1 * MiB),
        # 32 gradients of 1 KiB, unfused: inline (one round trip to rank 0)
        # beats a negotiation plus a Gloo allreduce each.
        ("inline_threshold", {"HOROVOD_FUSION_THRESHOLD": "0"}, 32, 256,
         lambda v: v >= 16 << 10),
    ],
)
def test_autotune_converges(tmp_path, knob, fixed, ntensors, numel, good):
    log = tmp_path / "autotune.csv"
    env = {
        "HOROVOD_AUTOTUNE": "1",
        "HOROVOD_AUTOTUNE_LOG": str(log),
        "HOROVOD_AUTOTUNE_WARMUP_SAMPLES": "1",
        "HOROVOD_AUTOTUNE_STEPS_PER_SAMPLE": "5",
        # Gloo over loopback, where the known setting is far better than the
        # bad one; on shared memory unfused and non-inline ops cost little,
        # so the scores are too close to tell a converged tuner from noise.
        "HVD_TORCH_SHM": "0",
        **fixed,
    }
    # warm-up 5 steps + at most 6 trials x (1 skipped + 5 scored) steps, and spare.
    results = run_ranks(_workload, 2, args=(80, ntensors, numel), env=env, timeout=180)
    trials, settled = _log(log)
    grid_size = 6 if knob == "fusion_threshold" else 5
    assert len(trials) == grid_size, trials
    assert {r["knob"] for r in trials} == {knob}
    # Every grid value was tried, the fixed knob never moved.
    other = "inline_threshold" if knob == "fusion_threshold" else "fusion_threshold"
    assert {r[other] for r in trials} == {settled[other]} == {"0"}
    chosen = int(settled[knob])
    assert good(chosen), (chosen, trials)
    scores = {int(r[knob]): float(r["bytes_per_second"]) for r in trials}
    assert scores[0] < 0.7 * max(scores.values()), scores  # the bad setting is clearly worse
    # Rank 0 sent its choice to every rank: they all use the same values.
    fusion, inline = results[0]
    assert results == [(fusion, inline)] * 2
    assert {"fusion_threshold": fusion, "inline_threshold": inline}[knob] == chosen


@pytest.mark.unit
def test_hvdrun_autotune_flags_map_to_the_ranks_environment():
    from hvdrun import launch

    opts = launch.parse_args(
        ["-np", "2", "--autotune", "--autotune-log-file", "/tmp/a.csv",
         "--autotune-warmup-samples", "0", "--autotune-steps-per-sample", "4",
         "--autotune-bayes-opt-max-samples", "7", "--autotune-gaussian-process-noise", "0.3",
         "python", "train.py"])  # fmt: skip
    assert opts.static.extra_env == {
        "HOROVOD_AUTOTUNE": "1", "HOROVOD_AUTOTUNE_LOG": "/tmp/a.csv",
        "HOROVOD_AUTOTUNE_WARMUP_SAMPLES": "0", "HOROVOD_AUTOTUNE_STEPS_PER_SAMPLE": "4",
        "HOROVOD_AUTOTUNE_BAYES_OPT_MAX_SAMPLES": "7",
        "HOROVOD_AUTOTUNE_GAUSSIAN_PROCESS_NOISE": "0.3",
    }  # fmt: skip
    with pytest.raises(launch.UsageError, match="--autotune-steps-per-sample must be"):
        launch.parse_args(["-np", "2", "--autotune-steps-per-sample", "0", "python"])
