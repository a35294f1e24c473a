"""A rank killed (SIGKILL) during allreduces ends an hvdrun job in seconds, with a clear error."""

import os
import subprocess
import sys
import textwrap
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]

# Every rank allreduces in a loop; rank 1 SIGKILLs itself in the middle.
_TRAINING = textwrap.dedent(
    """
    import os, signal, sys, time
    import torch
    import hvd_torch as hvd

    hvd.init()
    x = torch.ones(1 << 16)
    for step in range(100000):
        if hvd.rank() == 1 and step == 50:
            print("killing myself", flush=True)
            os.kill(os.getpid(), signal.SIGKILL)
        try:
            hvd.allreduce(x, name="grad")
        except hvd.HorovodInternalError as e:
            print(f"rank {hvd.rank()} caught HorovodInternalError: {e}", flush=True)
            sys.exit(3)
    """
)


def test_killed_rank_ends_the_job_with_a_clear_error(tmp_path):
    script = tmp_path / "train.py"
    script.write_text(_TRAINING)
    start = time.monotonic()
    proc = subprocess.run(
        [sys.executable, "-m", "hvdrun", "-np", "3", sys.executable, str(script)],
        cwd=ROOT,
        env=dict(os.environ, PYTHONPATH=str(ROOT)),
        capture_output=True,
        text=True,
        timeout=120,
    )
    elapsed_after_start = time.monotonic() - start
    out = proc.stdout + proc.stderr
    assert proc.returncode != 0, out
    assert "killing myself" in out, out
    # The launcher names the dead rank and its signal.
    assert "rank 1" in out and "SIGKILL" in out, out
    # Ranks are imported and initialised within seconds, then die within seconds.
    assert elapsed_after_start < 60, (elapsed_after_start, out)


def test_survivors_raise_horovod_internal_error_naming_the_dead_rank(tmp_path):
    """Without the launcher's help: surviving ranks see the failure themselves."""
    sys.path.insert(0, str(ROOT / "tests"))
    from dist_harness import RankFailure, run_ranks

    outcomes = run_ranks(_survivor, 3, timeout=90, expect_fail=True)
    assert isinstance(outcomes[1], RankFailure) and outcomes[1].exitcode == -9, outcomes[1]
    for rank in (0, 2):
        kind, message, waited = outcomes[rank]
        assert kind == "HorovodInternalError", outcomes[rank]
        assert "rank 1" in message, message
        assert waited < 10.0, outcomes[rank]


def _survivor():
    import signal

    import torch

    import hvd_torch as hvd

    hvd.init()
    x = torch.ones(1 << 16)
    hvd.allreduce(x, name="warmup")
    if hvd.rank() == 1:
        time.sleep(0.5)
        os.kill(os.getpid(), signal.SIGKILL)
    start = time.monotonic()
    try:
        for _ in range(1000000):
            hvd.allreduce(x, name="grad")
    except hvd.HorovodInternalError as e:
        return ("HorovodInternalError", str(e), time.monotonic() - start - 0.5)
    return ("no error", "", time.monotonic() - start)
