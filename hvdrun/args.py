"""Command-line mistakes and the number checks every hvdrun mode shares."""

from __future__ import annotations

__all__ = ["UsageError", "non_negative_int", "positive_float", "positive_int"]


class UsageError(Exception):
    """A command-line mistake; launch.main() prints it and returns 2."""


def positive_int(name: str, text: str) -> int:
    try:
        n = int(text)
    except ValueError:
        n = 0
    if n < 1:
        raise UsageError(f"{name} must be a positive integer, got {text!r}")
    return n


def non_negative_int(name: str, text: str) -> int:
    if not text.isdigit():
        raise UsageError(f"{name} must be a non-negative integer, got {text!r}")
    return int(text)


def positive_float(name: str, text: str) -> float:
    try:
        x = float(text)
    except ValueError:
        x = 0.0
    if not x > 0:
        raise UsageError(f"{name} must be a positive number of seconds, got {text!r}")
    return x
