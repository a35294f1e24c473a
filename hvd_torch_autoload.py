"""Lets `dist.init_process_group("hvd")` work in a process that never imported
hvd_torch (docs/integrations.md, "The backend without an import").

Frameworks create the process group themselves (Ray Train's workers, Lightning,
Accelerate), before the user's code could `import hvd_torch`. torch calls every
`torch.backends` entry point while `import torch` runs; ours, `register`, tells
torch.distributed that "hvd" exists and how to create it, and nothing more:
hvd_torch (and its C++ extension) is imported only when a group is created.

A module of its own, outside the hvd_torch package, so that loading the entry
point imports neither hvd_torch's __init__ nor torch again: torch is half
imported when this runs. Whatever goes wrong here is logged, never raised: an
exception would break `import torch` for every program on the machine.

Off: HVD_TORCH_AUTOLOAD=0 (ours only); TORCH_DEVICE_BACKEND_AUTOLOAD=0 (every plug-in).
"""

import ast
import importlib.util
import logging
import os
import sys

BACKEND = "hvd"
_log = logging.getLogger(__name__)


def register() -> None:
    """The entry point: registers a lazy "hvd" creator with torch.distributed."""
    try:
        if os.environ.get("HVD_TORCH_AUTOLOAD", "1").strip() == "0":
            return
        # torch/__init__.py imports torch.distributed before its plug-ins; a torch
        # without distributed support (or a different order) leaves nothing to do.
        dist = sys.modules.get("torch.distributed")
        if dist is None or not dist.is_available():
            return
        if BACKEND.upper() in getattr(dist.Backend, "_plugins", {}):
            return  # hvd_torch itself got there first
        dist.Backend.register_backend(BACKEND, create_backend, extended_api=True,
                                      devices=_devices())
    except Exception:  # noqa: BLE001 - never break `import torch`
        _log.warning("hvd_torch: could not register the \"hvd\" torch.distributed backend "
                     "lazily; `import hvd_torch` before init_process_group(\"hvd\") still "
                     "works", exc_info=True)


def create_backend(options, backend_options):
    """torch.distributed's creator until hvd_torch is imported: importing it
    registers the real creator (hvd_torch.distributed._create_backend) in our place."""
    from hvd_torch import distributed

    return distributed._create_backend(options, backend_options)


create_backend.hvd_autoload = True  # hvd_torch.distributed replaces a creator so marked


def _devices() -> list:
    """The devices the installed build serves, read from its build record without
    importing it (hvd_torch's import loads the extension: too much inside `import torch`)."""
    spec = importlib.util.find_spec("hvd_torch")
    if spec is None or not spec.submodule_search_locations:
        return ["cpu"]
    for folder in spec.submodule_search_locations:
        path = os.path.join(folder, "_build_info.py")
        if os.path.isfile(path):
            with open(path, encoding="utf-8") as f:
                record = f.read(64 * 1024)
            for node in ast.parse(record).body:
                if (isinstance(node, ast.Assign) and len(node.targets) == 1
                        and getattr(node.targets[0], "id", None) == "cuda_built"):
                    return ["cpu", "cuda"] if ast.literal_eval(node.value) is True else ["cpu"]
    return ["cpu"]
