"""The Ray trainer's checkpoint files (issue #44): loaded weights-only by default, so
a file someone else wrote cannot run code; written privately, never through a link
planted in a shared folder."""

import os
import pickle

import pytest
import torch

from ray_integration.trainer.checkpoint_files import load_checkpoint, save_private


class _Payload:
    """Unpickling this opens (creates) a file: code a checkpoint should never run."""

    def __init__(self, marker):
        self.marker = marker

    def __reduce__(self):
        return (open, (self.marker, "w"))


def test_a_checkpoint_that_would_run_code_is_refused_by_default(tmp_path):
    marker = tmp_path / "ran"
    path = tmp_path / "evil.pt"
    torch.save({"models": [torch.ones(2)], "operator": _Payload(str(marker))}, path)
    with pytest.raises(pickle.UnpicklingError, match="weights_only=False only if you trust"):
        load_checkpoint(str(path))
    assert not marker.exists()
    # The explicit opt-in is torch's own unpickling (it does run the payload).
    load_checkpoint(str(path), weights_only=False)
    assert marker.exists()


def test_a_checkpoint_is_written_privately_and_never_through_a_planted_link(tmp_path):
    victim = tmp_path / "victim"
    victim.write_text("precious\n")
    path = tmp_path / "trainer.pt"
    # The temporary name the trainer used to derive from the pid.
    (tmp_path / f"trainer.pt.tmp{os.getpid()}").symlink_to(victim)
    state = {"epoch": 3, "models": [{"w": torch.arange(4.0)}], "operator": {"origin_lr": 0.1}}
    save_private(state, str(path))
    assert victim.read_text() == "precious\n"
    assert oct(os.stat(path).st_mode & 0o777) == "0o600"
    loaded = load_checkpoint(str(path))
    assert loaded["epoch"] == 3 and torch.equal(loaded["models"][0]["w"], torch.arange(4.0))
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(
        ["victim", "trainer.pt", f"trainer.pt.tmp{os.getpid()}"])  # no temporary left
