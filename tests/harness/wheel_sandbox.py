"""Installs and runs the binary wheel where nothing else could help it (issue #48).

Run as root inside a fresh mount namespace (`unshare -m python wheel_sandbox.py ...`,
tests/wheel/test_wheel.py): it bind-mounts an empty, non-executable file over every
compiler (gcc, g++, cc, c++, clang, nvcc, wherever PATH or /usr/local/cuda has them)
and over the system's Gloo, hiredis, ibverbs and libnl libraries, so neither a build
nor the loader can reach them; only this process and its children see that. Then,
in the virtual environment VENV (torch and numpy only), with PATH = VENV/bin, /usr/bin
and /bin:

  1. checks that no compiler is on PATH and that the loader finds none of the
     hidden libraries (ctypes.CDLL must fail for each);
  2. installs the wheel with pip, no index and no pip configuration (so no find-links
     either), timed: a dependency the environment lacked would fail here;
  3. runs `python -m hvd_torch.doctor`;
  4. loads hvd_torch, starts a 1-rank job, and reports the libraries the process
     mapped (/proc/self/maps) and where _C's Gloo symbols resolved (dladdr);
  5. runs `hvdrun -np 2 python EXAMPLE`.

Each step is bounded by a timeout. Prints one JSON object with every result on its
last line; the test asserts on it. Leaves the wheel installed (the test uninstalls
it before the next run).
"""

from __future__ import annotations

import argparse
import glob
import json
import os
import shutil
import subprocess
import tempfile
import time

COMPILERS = ["gcc", "g++", "cc", "c++", "clang", "clang++", "nvcc"]
# Sonames the wheel must carry itself; every file of these libraries is hidden.
HIDDEN_SONAMES = ["libgloo.so.0", "libhiredis.so.0.14", "libibverbs.so.1", "libnl-3.so.200",
                  "libnl-route-3.so.200"]
HIDDEN_GLOBS = [f"{d}/{stem}*.so*" for d in ("/usr/lib/x86_64-linux-gnu", "/usr/lib",
                                             "/usr/local/lib")
                for stem in ("libgloo", "libhiredis", "libibverbs", "libnl-3", "libnl-route-3")]

PROBE = r"""
import json, torch, hvd_torch as hvd
from hvd_torch import _C
hvd.init()
total = hvd.allreduce(torch.ones(4), name="probe")
maps = sorted({line.split()[-1] for line in open("/proc/self/maps")
               if len(line.split()) >= 6 and ".so" in line.split()[-1]})
print(json.dumps({"gloo_library_path": _C.gloo_library_path(), "maps": maps,
                  "allreduce": total.tolist(), "hvd_file": hvd.__file__}))
hvd.shutdown()
"""


def run(command, timeout, env, cwd="/"):
    start = time.monotonic()
    try:
        proc = subprocess.run(command, capture_output=True, text=True, timeout=timeout, env=env,
                              cwd=cwd, stdin=subprocess.DEVNULL)
        rc, out, err = proc.returncode, proc.stdout, proc.stderr
    except subprocess.TimeoutExpired as e:
        rc, out, err = "timeout", str(e.stdout or ""), str(e.stderr or "")
    return {"rc": rc, "seconds": round(time.monotonic() - start, 2), "out": out, "err": err}


def compiler_files() -> list[str]:
    """Every compiler executable, by its real path (cc -> gcc-12 -> x86_64-linux-gnu-gcc-12)."""
    found = set()
    for name in COMPILERS:
        path = shutil.which(name)
        if path:
            found.add(os.path.realpath(path))
    for pattern in ("/usr/bin/*-linux-gnu-gcc*", "/usr/bin/*-linux-gnu-g++*", "/usr/bin/clang*",
                    "/usr/local/bin/nvcc", "/usr/local/cuda*/bin/nvcc"):
        found.update(os.path.realpath(p) for p in glob.glob(pattern))
    return sorted(p for p in found if os.path.isfile(p))


def hide(files: list[str]) -> list[str]:
    """Bind-mounts an empty file with mode 0644 over each file (real paths, once each)."""
    fd, empty = tempfile.mkstemp(prefix="hvd_wheel_hidden.")
    os.close(fd)
    os.chmod(empty, 0o644)
    hidden = []
    for path in sorted({os.path.realpath(f) for f in files if os.path.isfile(f)}):
        subprocess.run(["mount", "--bind", empty, path], check=True, timeout=30)
        hidden.append(path)
    return hidden


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--venv", required=True)
    parser.add_argument("--wheel", required=True)
    parser.add_argument("--example", required=True)
    args = parser.parse_args()
    venv = os.path.abspath(args.venv)
    python = os.path.join(venv, "bin", "python")
    report = {}

    # Nothing mounted here may leak back to the machine's own mount namespace.
    subprocess.run(["mount", "--make-rprivate", "/"], check=True, timeout=30)
    libraries = [p for pattern in HIDDEN_GLOBS for p in glob.glob(pattern)]
    report["hidden_libraries"] = hide(libraries)
    report["hidden_compilers"] = hide(compiler_files())

    path = os.pathsep.join([os.path.join(venv, "bin"), "/usr/bin", "/bin"])
    env = {"PATH": path, "HOME": os.environ.get("HOME", "/root"), "LANG": "C.UTF-8",
           "OMP_NUM_THREADS": "1", "PIP_CONFIG_FILE": os.devnull,
           "PIP_DISABLE_PIP_VERSION_CHECK": "1", "PYTHONDONTWRITEBYTECODE": "1"}
    report["compilers_on_path"] = {c: shutil.which(c, path=path) for c in COMPILERS}
    report["compilers_on_path"] = {c: p for c, p in report["compilers_on_path"].items()
                                   if p and os.access(p, os.X_OK)}
    loads = {}
    for soname in HIDDEN_SONAMES:
        probe = run([python, "-c", f"import ctypes; ctypes.CDLL({soname!r})"], 60, env)
        loads[soname] = {"loaded": probe["rc"] == 0, "error": probe["err"].strip()[-200:]}
    report["system_libraries_loadable"] = loads

    report["install"] = run([python, "-m", "pip", "install", "--no-index", args.wheel], 300, env)
    report["doctor"] = run([python, "-m", "hvd_torch.doctor"], 300, env)
    probe = run([os.path.join(venv, "bin", "hvdrun"), "-np", "1", python, "-c", PROBE], 120, env)
    lines = [ln.split(":", 1)[1] for ln in probe["out"].splitlines()
             if ln.startswith("[0]<stdout>:{")]
    report["probe"] = dict(probe, result=json.loads(lines[-1]) if lines else None)
    with tempfile.TemporaryDirectory() as work:  # away from the checkout
        report["example"] = run([os.path.join(venv, "bin", "hvdrun"), "-np", "2", "python",
                                 os.path.abspath(args.example)], 300, env, cwd=work)
    print(json.dumps(report))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
