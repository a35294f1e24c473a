#!/usr/bin/env bash
# `pip install .` into a fresh virtual environment that already has torch, as a
# user would do it (build isolation on), then `import hvd_torch` and the doctor.
# Slow (a full build: about 7 minutes on 2 busy cores), so not part of `make test`;
# tests/slow/test_install.py covers the quick paths (the import-time check, the sdist).
#
#   scripts/check_install.sh [WORKDIR]
#
# PYTHON (default python3): the interpreter the venv is made from.
# TORCH (default torch==2.13.0): what pip installs first, a requirement or a wheel file.
set -euo pipefail
cd "$(dirname "$0")/.."
src=$PWD
work=${1:-$(mktemp -d /tmp/hvd_install.XXXXXX)}
PYTHON=${PYTHON:-python3}
TORCH=${TORCH:-torch==2.13.0}

say() { echo "[check_install] $*"; }
say "fresh venv in $work/venv"
"$PYTHON" -m venv "$work/venv"
"$work/venv/bin/pip" install --quiet "$TORCH" numpy
# A clean copy of the sources: nothing built here (build/, .so, the build record) leaks in.
mkdir -p "$work/src"
git -C "$src" ls-files -z | (cd "$src" && xargs -0 tar -cf -) | tar -xf - -C "$work/src"
start=$(date +%s)
(cd "$work/src" && MAX_JOBS="${MAX_JOBS:-2}" "$work/venv/bin/pip" install --quiet .)
say "pip install . took $(( $(date +%s) - start ))s"
(cd / && "$work/venv/bin/python" -c "import hvd_torch, torch; print('[check_install] imported', hvd_torch.__file__, 'with torch', torch.__version__)")
(cd / && "$work/venv/bin/python" -m hvd_torch.doctor)
