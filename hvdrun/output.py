"""hvdrun's own messages, the locks that keep them whole next to rank output, and
--output-filename's per-rank files."""

from __future__ import annotations

import os
import sys
import threading

__all__ = ["PROG", "STREAM_LOCKS", "RankFiles", "note"]

PROG = "hvdrun"
# One lock per launcher stream, so rank lines and our own notes never interleave.
STREAM_LOCKS = {"stdout": threading.Lock(), "stderr": threading.Lock()}


def note(message: str) -> None:
    with STREAM_LOCKS["stderr"]:
        sys.stderr.write(f"{PROG}: {message}\n")
        sys.stderr.flush()


class RankFiles:
    """--output-filename DIR: horovodrun's layout, DIR/rank.N/stdout and DIR/rank.N/stderr,
    N zero-padded to the width of the largest rank (rank.03 of 12 ranks), so the
    directories sort in rank order. The lines still reach the terminal too, prefixed;
    the files get them as the rank wrote them (the file already says which rank and
    stream). Each file is truncated when the rank starts and flushed per line, so
    `tail -f` follows a live job and a killed launcher loses nothing."""

    def __init__(self, directory: str, size: int):
        self.directory = directory
        self.width = len(str(max(size - 1, 0)))
        os.makedirs(directory, exist_ok=True)

    def path(self, rank: int, stream: str) -> str:
        return os.path.join(self.directory, f"rank.{rank:0{self.width}d}", stream)

    def open(self, rank: int, stream: str):
        path = self.path(rank, stream)
        os.makedirs(os.path.dirname(path), exist_ok=True)
        return open(path, "wb")
