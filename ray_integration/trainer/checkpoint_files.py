"""The trainer's checkpoint files: written privately, read safely.

A checkpoint is written through a temporary file with a random name made with
O_EXCL in the target's folder (a link planted there, in a shared folder, is never
written through) and then renamed over the target, so a crash never leaves half a
file; the file is this user's alone (0600). It is read with torch.load's
weights_only by default: tensors and plain containers only, so a file someone else
wrote cannot run code when it is loaded.
"""

from __future__ import annotations

import os
import pickle
import tempfile

__all__ = ["load_checkpoint", "save_private"]


def save_private(state, path: str) -> None:
    import torch

    fd, tmp = tempfile.mkstemp(prefix=f".{os.path.basename(path)}.",
                               dir=os.path.dirname(os.path.abspath(path)))  # fmt: skip
    try:
        with os.fdopen(fd, "wb") as f:
            torch.save(state, f)
        os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except FileNotFoundError:
            pass
        raise


def load_checkpoint(path: str, weights_only: bool = True):
    import torch

    try:
        return torch.load(path, map_location="cpu", weights_only=weights_only)
    except pickle.UnpicklingError as e:
        raise pickle.UnpicklingError(
            f"checkpoint {path} holds objects other than tensors and plain containers "
            "(an operator's state_dict()?), which weights_only loading refuses because "
            "unpickling them can run code. Load it with weights_only=False only if you "
            f"trust the file. torch.load said: {str(e).splitlines()[0]}") from None
