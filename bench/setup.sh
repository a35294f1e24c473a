#!/usr/bin/env bash
# What the benchmarks need beyond scripts/setup.sh, idempotently (make bench-setup;
# `make bench` runs it first). Never run by the tests or by scripts/setup.sh:
#   1. Debian's Open MPI (openmpi-bin, libopenmpi-dev), the MPI baseline of
#      bench/collectives_bench.py --mpi (its shared-memory BTL, vader);
#   2. mpi4py, built from source against that Open MPI (--no-binary: a wheel
#      could bring or expect another MPI), and matplotlib for the busbw plot,
#      both into the venv.
# A second run takes a second: each step checks before it acts.
#
#   bash bench/setup.sh            (PY=/path/to/python to use another venv)
set -euo pipefail

cd "$(dirname "$0")/.."
PY=${PY:-.venv/bin/python}

say() { echo "[bench-setup] $*"; }

as_root() {
    if [ "$(id -u)" = 0 ]; then "$@"; else sudo "$@"; fi
}

# Open MPI's own mpirun: collectives_bench.py passes it Open MPI's options.
if mpirun --version 2>/dev/null | grep -q "Open MPI" && command -v mpicc >/dev/null; then
    say "Open MPI: $(mpirun --version 2>/dev/null | head -n 1)"
else
    say "Open MPI: installing openmpi-bin libopenmpi-dev (apt-get)"
    # Wait for apt's locks if another apt-get holds them (scripts/setup.sh).
    as_root apt-get -o DPkg::Lock::Timeout=600 update -qq
    as_root env DEBIAN_FRONTEND=noninteractive apt-get -o DPkg::Lock::Timeout=600 install -y -qq \
        openmpi-bin libopenmpi-dev >/dev/null
fi

pip_install() { "$PY" -m pip install --quiet --disable-pip-version-check "$@"; }
has() { "$PY" -c "import importlib.util as u, sys; sys.exit(u.find_spec('$1') is None)"; }

if has mpi4py; then
    say "mpi4py: present"
else
    say "mpi4py: building against $(command -v mpicc) (a minute or two)"
    MPICC=mpicc pip_install --no-binary mpi4py mpi4py
fi

if has matplotlib; then
    say "matplotlib: present"
else
    say "matplotlib: installing"
    pip_install matplotlib
fi
say "ready"
