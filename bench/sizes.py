"""Byte sizes on the command line, as nccl-tests writes them: 4, 64K, 64M, 1G (binary units)."""

import argparse

UNITS = {"": 1, "K": 1 << 10, "M": 1 << 20, "G": 1 << 30}


def parse_size(text, minimum=1):
    """'4', '64K', '64M', '1G' -> bytes; an argparse type (raises ArgumentTypeError)."""
    t = text.strip().upper().removesuffix("B")
    unit = t[-1] if t and t[-1] in UNITS else ""
    try:
        value = int(t[: len(t) - len(unit)]) * UNITS[unit]
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a size: {text!r} (e.g. 4, 64K, 64M)") from None
    if value < minimum:
        raise argparse.ArgumentTypeError(f"size must be at least {minimum} bytes: {text!r}")
    return value
