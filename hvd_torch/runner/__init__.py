"""The launcher's old home: `hvd_torch.runner.<module>` is `hvdrun.<module>`.

The launcher lives in the top-level package `hvdrun` so that it starts without
torch or the compiled extension (importing anything under `hvd_torch` runs
hvd_torch/__init__.py, which loads both).  Code that runs next to torch anyway
(the elastic worker side, tests) may keep importing it from here:
each name below is the very same module object, so monkeypatching one patches both.
"""

import importlib
import sys

_MODULES = (
    "discovery", "elastic_driver", "elastic_keys", "elastic_launch", "env", "launch", "store",
    "store_protocol", "store_server",
)  # fmt: skip

for _name in _MODULES:
    sys.modules[f"{__name__}.{_name}"] = importlib.import_module(f"hvdrun.{_name}")
    globals()[_name] = sys.modules[f"{__name__}.{_name}"]
del _name
