"""The binary wheel (issue #48): built by scripts/build_wheel.py (what `make wheel`
runs), installed into a virtual environment that holds only torch (and numpy), with
no compiler on PATH and the system's Gloo, hiredis, ibverbs and libnl hidden from
the loader, then the doctor and a 2-rank training example run there.

The environment is made once and kept under build/wheel-test/venv (installing torch
takes a minute); every run first uninstalls hvd-torch from it and checks that what
is left is exactly what it was made with, so each run installs the wheel afresh.
The hiding happens in a mount namespace of the sandbox's own (tests/harness/
wheel_sandbox.py, under `unshare -m`, as root): the machine itself is untouched.

Its own tier (`make test-wheel`, its own CI step): the first build of a fresh clone
compiles the extension (about 2 minutes on 2 cores), which `make test` should not
carry; later builds reuse build/'s objects and take seconds.
"""

import importlib.metadata
import json
import os
import re
import shutil
import subprocess
import sys
import time
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
WORK = ROOT / "build" / "wheel-test"
VENV = WORK / "venv"
SANDBOX = ROOT / "tests" / "harness" / "wheel_sandbox.py"
EXAMPLE = ROOT / "examples" / "linear_regression.py"
BUNDLED = ["libgloo", "libhiredis", "libibverbs", "libnl-3", "libnl-route-3"]
# Issue #48's goal for `pip install` of the wheel alone, torch already there.
INSTALL_GOAL_S = 30.0

pytestmark = pytest.mark.timeout(1800)


def _pip(*args, timeout=900):
    return subprocess.run([str(VENV / "bin" / "python"), "-m", "pip", "--disable-pip-version-check",
                           *args], capture_output=True, text=True, timeout=timeout)


def _freeze():
    proc = _pip("list", "--format=freeze", timeout=120)
    assert proc.returncode == 0, proc.stderr
    return sorted(proc.stdout.split())


@pytest.fixture(scope="module")
def torch_venv():
    """A venv with this suite's torch and numpy and nothing of ours; made once."""
    wanted = [f"torch=={importlib.metadata.version('torch')}",
              f"numpy=={importlib.metadata.version('numpy')}"]
    stamp = WORK / "venv.freeze"
    if not (stamp.exists() and (VENV / "bin" / "python").exists()
            and stamp.read_text().split("\n", 1)[0] == " ".join(wanted)):
        shutil.rmtree(VENV, ignore_errors=True)
        WORK.mkdir(parents=True, exist_ok=True)
        subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(VENV)], check=True,
                       timeout=120)
        # pip from the suite's venv bootstraps the new one: no download of pip itself.
        proc = subprocess.run([sys.executable, "-m", "pip", "--python", str(VENV / "bin" / "python"),
                               "install", "--quiet", "pip", *wanted], capture_output=True,
                              text=True, timeout=900)
        assert proc.returncode == 0, proc.stdout + proc.stderr
        stamp.write_text(" ".join(wanted) + "\n" + "\n".join(_freeze()) + "\n")
    # A run before this one left the wheel installed: back to torch and numpy alone.
    if (VENV / "bin" / "hvdrun").exists() or "hvd-torch" in " ".join(_freeze()).lower():
        proc = _pip("uninstall", "--yes", "hvd-torch", timeout=300)
        assert proc.returncode == 0, proc.stdout + proc.stderr
    left = _freeze()
    assert left == stamp.read_text().split("\n", 1)[1].split(), left
    assert any(p.startswith("torch==") for p in left) and not any("hvd" in p for p in left), left
    site = Path(subprocess.run([str(VENV / "bin" / "python"), "-c",
                                "import sysconfig; print(sysconfig.get_paths()['platlib'])"],
                               capture_output=True, text=True, timeout=60,
                               check=True).stdout.strip())
    assert not list(site.glob("hvd_torch*")) and not (VENV / "bin" / "hvdrun").exists()
    return site


@pytest.fixture(scope="module")
def wheel():
    """The wheel, built now from this checkout (scripts/build_wheel.py, as make wheel)."""
    out = WORK / "dist"
    shutil.rmtree(out, ignore_errors=True)
    start = time.monotonic()
    proc = subprocess.run([sys.executable, str(ROOT / "scripts" / "build_wheel.py"), "--out",
                           str(out)], capture_output=True, text=True, timeout=1500)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    print(f"\nbuild_wheel.py took {time.monotonic() - start:.1f} s\n{proc.stdout}")
    path = Path(re.search(r"^wheel: (.+)$", proc.stdout, re.M).group(1))
    assert path.is_file() and path.parent.parent == out, proc.stdout
    return path


def test_wheel_contents_tag_and_torch_pin(wheel):
    import torch

    assert wheel.parent.name == f"torch-{torch.__version__}"
    name = re.fullmatch(r"hvd_torch-0\.1\.0-(cp\d+)-(cp\d+)-manylinux_2_(\d+)_x86_64\.whl",
                        wheel.name)
    assert name, wheel.name
    assert name.group(1) == f"cp{sys.version_info.major}{sys.version_info.minor}"
    # Built on this machine's glibc (Debian 12: 2.36); auditwheel may prove an older
    # one enough, never a newer one.
    glibc = tuple(int(v) for v in os.confstr("CS_GNU_LIBC_VERSION").split()[1].split("."))
    assert 17 <= int(name.group(3)) <= glibc[1], (wheel.name, glibc)
    with zipfile.ZipFile(wheel) as z:
        names = z.namelist()
        metadata = z.read("hvd_torch-0.1.0.dist-info/METADATA").decode()
        record = z.read("hvd_torch-0.1.0.dist-info/RECORD").decode()
        bundled_list = z.read("hvd_torch-0.1.0.dist-info/licenses/bundled/BUNDLED.txt").decode()
        build_info = z.read("hvd_torch/_build_info.py").decode()
    pin = importlib.metadata.version("torch")  # what pip knows this torch as
    assert f"Requires-Dist: torch=={pin}\n" in metadata, metadata[:800]
    assert f"torch_version = {torch.__version__!r}" in build_info, build_info
    assert f"torch_cuda = {torch.version.cuda!r}" in build_info, build_info
    libs = sorted(n.split("/", 1)[1] for n in names if n.startswith("hvd_torch.libs/"))
    assert [re.sub(r"-[0-9a-f]{8}\.so.*$", "", n) for n in libs] == BUNDLED, libs
    # Nothing of torch's, nor of the toolchain's, rides along.
    assert not [n for n in names if re.search(r"lib(torch|c10|nccl|cuda|stdc\+\+|gomp)", n)], names
    for lib in libs:
        assert f"hvd_torch.libs/{lib}" in bundled_list, bundled_list
    licenses = {n.rsplit("/", 1)[1] for n in names if "/licenses/bundled/" in n}
    assert {"libgloo0.copyright", "libhiredis0.14.copyright", "libibverbs1.copyright",
            "libnl-3-200.copyright", "libnl-route-3-200.copyright"} <= licenses, licenses
    assert all(n in record for n in names if not n.endswith(("/", "RECORD"))), "RECORD is stale"
    assert wheel.stat().st_size < 4 * 2**20, wheel.stat().st_size


def test_installs_and_trains_without_compiler_or_system_gloo(wheel, torch_venv):
    if os.geteuid() != 0 or not shutil.which("unshare"):
        pytest.skip("needs root and unshare(1) for a mount namespace")
    proc = subprocess.run(["unshare", "-m", sys.executable, str(SANDBOX), "--venv", str(VENV),
                           "--wheel", str(wheel), "--example", str(EXAMPLE)],
                          capture_output=True, text=True, timeout=1200)
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-4000:]
    report = json.loads(proc.stdout.strip().splitlines()[-1])
    print(json.dumps({k: v for k, v in report.items() if k not in ("doctor", "example")},
                     indent=1)[:6000])

    # Nothing to build with, and the loader cannot find the system's libraries.
    assert report["compilers_on_path"] == {}, report["compilers_on_path"]
    assert any(p.endswith("gloo.so.0.5.0") or "libgloo" in p
               for p in report["hidden_libraries"]), report["hidden_libraries"]
    for stem in BUNDLED:
        assert any(f"/{stem}.so" in p for p in report["hidden_libraries"]), (stem, report)
    for soname, result in report["system_libraries_loadable"].items():
        assert not result["loaded"], (soname, result)

    install = report["install"]
    assert install["rc"] == 0, install["out"] + install["err"]
    print(f"pip install of the wheel: {install['seconds']} s")
    assert install["seconds"] < INSTALL_GOAL_S * 3, install  # the goal is 30 s; a busy machine
    assert "Successfully installed hvd-torch-0.1.0" in install["out"], install["out"]

    doctor = report["doctor"]
    print(doctor["out"])
    assert doctor["rc"] == 0, doctor["out"] + doctor["err"]
    assert "OK       the extension was built for the running torch" in doctor["out"]
    assert re.search(r"OK       2-process allreduce, broadcast and error through hvdrun",
                     doctor["out"]), doctor["out"]
    assert doctor["out"].rstrip().endswith(
        "Verdict: OK: hvd-torch is built for this torch and runs collectives here"), doctor["out"]
    # dladdr names the file as the loader reached it: through hvd_torch/../hvd_torch.libs.
    gloo = re.search(r"Gloo from (\S+?)\)", doctor["out"])
    assert gloo and os.path.normpath(gloo.group(1)).startswith(
        f"{torch_venv}/hvd_torch.libs/libgloo-"), doctor["out"]

    # _C's Gloo is the wheel's own: not the system's (hidden anyway), not libtorch_cpu's.
    probe = report["probe"]["result"]
    assert probe, report["probe"]
    assert probe["hvd_file"] == f"{torch_venv}/hvd_torch/__init__.py", probe
    assert probe["allreduce"] == [1.0] * 4, probe
    libs_dir = f"{torch_venv}/hvd_torch.libs/"
    assert os.path.normpath(probe["gloo_library_path"]).startswith(libs_dir + "libgloo-"), probe
    for stem in BUNDLED:
        mapped = [p for p in probe["maps"] if re.search(rf"/{stem}[-.]", p)]
        assert len(mapped) == 1 and mapped[0].startswith(libs_dir), (stem, probe["maps"])

    example = report["example"]
    print(example["out"])
    assert example["rc"] == 0, example["out"] + example["err"]
    out = example["out"]
    losses = [float(v) for v in re.findall(r"^\[0\]<stdout>:epoch +\d+/30 +loss ([\d.]+)$", out,
                                           re.M)]
    assert len(losses) == 4 and losses[-1] < 0.001 < losses[0], out
    assert re.search(r"^\[0\]<stdout>:all 2 ranks hold identical weights", out, re.M), out
