"""hvdrun's own messages, the locks that keep them whole next to rank output, and
--output-filename's per-rank files."""

from __future__ import annotations

import errno
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
        """The rank's file, truncated. Neither rank.N nor the file may be a symbolic
        link: in a shared folder one planted there would make the job overwrite
        whatever it points to."""
        path = self.path(rank, stream)
        folder = os.path.dirname(path)
        os.makedirs(folder, exist_ok=True)
        for each in (folder, path):
            if os.path.islink(each):
                raise OSError(errno.ELOOP, f"--output-filename: {each} is a symbolic link")
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW, 0o644)
        return os.fdopen(fd, "wb")
