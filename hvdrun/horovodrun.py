"""The `horovodrun` command: hvdrun under Horovod's name, so that scripts and job
files that call `horovodrun -np 4 python train.py` run unchanged.

Same flags, same behaviour, same exit code: main() hands its arguments to
hvdrun's main() untouched.  Except when Horovod itself is installed in the same
environment: then `horovodrun` is Horovod's launcher, as it was before hvd-torch
came (its scripts may need it), and hvd-torch's launcher is `hvdrun`.  pip lets
the last package installed write bin/horovodrun; this entry point checks at
each start, so whichever of the two wrote it, a Horovod that is installed keeps
its horovodrun.

Standard library only, like the rest of hvdrun (no torch at start).
"""

from __future__ import annotations

import importlib.util
import sys

from . import launch

__all__ = ["horovod_launcher", "main"]


def horovod_launcher():
    """Horovod's horovodrun entry point (horovod.runner.launch.run_commandline)
    when Horovod is installed in this environment, else None."""
    if importlib.util.find_spec("horovod") is None:
        return None
    from horovod.runner.launch import run_commandline

    return run_commandline


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    horovod = horovod_launcher()
    if horovod is not None:
        # Horovod's entry point reads sys.argv, as its own console script does.
        sys.argv = ["horovodrun", *argv]
        return horovod()
    return launch.main(argv)


if __name__ == "__main__":
    sys.exit(main())
