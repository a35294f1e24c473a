"""Command-line mistakes and the number checks every hvdrun mode shares."""

from __future__ import annotations

import os

__all__ = [
    "ENGINE_FLAGS", "ENGINE_VALUED", "UsageError", "engine_env", "non_negative_int",
    "positive_float", "positive_int",
]  # fmt: skip


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


def non_negative_float(name: str, text: str) -> float:
    try:
        x = float(text)
    except ValueError:
        x = -1.0
    if not x >= 0:
        raise UsageError(f"{name} must be a non-negative number, got {text!r}")
    return x


# horovodrun's timeline and autotune flags: each sets the variable the ranks'
# engine reads (docs/toolbox.md, "Timeline" and "Autotune"), after this check.
ENGINE_VALUED = {
    "--timeline-filename": ("HOROVOD_TIMELINE", os.path.abspath),
    "--autotune-log-file": ("HOROVOD_AUTOTUNE_LOG", os.path.abspath),
    "--autotune-warmup-samples": ("HOROVOD_AUTOTUNE_WARMUP_SAMPLES", non_negative_int),
    "--autotune-steps-per-sample": ("HOROVOD_AUTOTUNE_STEPS_PER_SAMPLE", positive_int),
    "--autotune-bayes-opt-max-samples": ("HOROVOD_AUTOTUNE_BAYES_OPT_MAX_SAMPLES", positive_int),
    "--autotune-gaussian-process-noise": ("HOROVOD_AUTOTUNE_GAUSSIAN_PROCESS_NOISE",
                                          non_negative_float),
}  # fmt: skip
ENGINE_FLAGS = {  # flag -> variable set to "1", or (variable, value)
    "--timeline-mark-cycles": "HOROVOD_TIMELINE_MARK_CYCLES",
    "--autotune": "HOROVOD_AUTOTUNE",
    "--hierarchical-allreduce": "HOROVOD_HIERARCHICAL_ALLREDUCE",
    "--no-hierarchical-allreduce": ("HOROVOD_HIERARCHICAL_ALLREDUCE", "0"),
    "--hierarchical-allgather": "HOROVOD_HIERARCHICAL_ALLGATHER",
    "--no-hierarchical-allgather": ("HOROVOD_HIERARCHICAL_ALLGATHER", "0"),
}


def engine_env(values: dict[str, str], flags: set[str]) -> dict[str, str]:
    """The rank variables for the engine flags given: values by flag name, flags
    the boolean ones present.  Paths become absolute (a rank may chdir).
    Raises UsageError for a malformed number."""
    env = {}
    for flag, text in values.items():
        variable, check = ENGINE_VALUED[flag]
        env[variable] = check(text) if check is os.path.abspath else str(check(flag, text))
    for flag in flags:
        target = ENGINE_FLAGS[flag]
        variable, value = (target, "1") if isinstance(target, str) else target
        env[variable] = value
    return env
