"""hvdrun's own messages and the locks that keep them whole next to rank output."""

from __future__ import annotations

import sys
import threading

__all__ = ["PROG", "STREAM_LOCKS", "note"]

PROG = "hvdrun"
# One lock per launcher stream, so rank lines and our own notes never interleave.
STREAM_LOCKS = {"stdout": threading.Lock(), "stderr": threading.Lock()}


def note(message: str) -> None:
    with STREAM_LOCKS["stderr"]:
        sys.stderr.write(f"{PROG}: {message}\n")
        sys.stderr.flush()
