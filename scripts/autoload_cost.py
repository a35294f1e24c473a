"""What the "hvd" torch.backends entry point adds to `import torch` (issue #45).

Each run is a fresh interpreter that imports torch with every plug-in off, then
times importing hvd_torch_autoload and calling its register(): what torch does
for our entry point. Prints the median and spread over RUNS runs, beside the
median of `import torch` itself.

    .venv/bin/python scripts/autoload_cost.py [RUNS]
"""

import json
import os
import statistics
import subprocess
import sys

CHILD = """
import json, time
t0 = time.perf_counter()
import torch
t1 = time.perf_counter()
import hvd_torch_autoload
hvd_torch_autoload.register()
t2 = time.perf_counter()
print(json.dumps({"torch_ms": (t1 - t0) * 1e3, "stub_ms": (t2 - t1) * 1e3,
                  "registered": "HVD" in torch.distributed.Backend._plugins}))
"""


def main() -> None:
    runs = int(sys.argv[1]) if len(sys.argv) > 1 else 10
    env = dict(os.environ, TORCH_DEVICE_BACKEND_AUTOLOAD="0")
    rows = [json.loads(subprocess.run([sys.executable, "-c", CHILD], env=env, cwd="/", check=True,
                                      capture_output=True, text=True, timeout=120).stdout)
            for _ in range(runs)]
    assert all(r["registered"] for r in rows), rows
    stub = sorted(r["stub_ms"] for r in rows)
    torch_ms = statistics.median(r["torch_ms"] for r in rows)
    print(f"entry point: median {statistics.median(stub):.2f} ms (min {stub[0]:.2f}, "
          f"max {stub[-1]:.2f}) over {runs} fresh interpreters; import torch: median "
          f"{torch_ms:.0f} ms; the entry point is {statistics.median(stub) / torch_ms:.2%} of it")


if __name__ == "__main__":
    main()
