#!/usr/bin/env bash
# The extension under AddressSanitizer + UndefinedBehaviorSanitizer, running the
# real multi-rank tests (issue #43; docs/testing.md, "Sanitizers").
#
#   bash scripts/sanitize.sh build              build build/asan only
#   bash scripts/sanitize.sh full [PYTEST ARGS] build, then run the full set (~10 min)
#   bash scripts/sanitize.sh ci   [PYTEST ARGS] build, then run the CI subset (minutes)
#   bash scripts/sanitize.sh run CMD [ARGS]     build, then CMD with the sanitized
#                                               package and the runtimes preloaded
#
# `make test-sanitize` runs `full` after the C++ units under ASan and TSan;
# `make test-sanitize-ci` runs `ci`. Run after `make setup` (the venv).
#
# The build. setup.py with HVD_TORCH_SANITIZE=address,undefined builds the whole
# package into build/asan/lib (build_py copies the Python sources, build_ext
# compiles _C with -fsanitize=address,undefined), never into hvd_torch/: the
# normal in-place build (hvd_torch/_C*.so) and this one never overwrite each
# other. Make-style: nothing runs unless a source is newer than the last build;
# then ninja, in the persistent build/asan/temp, recompiles only what changed.
#
# The run. PYTHONPATH=build/asan/lib puts that copy of hvd_torch before the
# checkout's: the venv's editable install finds the checkout through a finder
# that Python asks after sys.path. Every process a test starts inherits the
# variable: the rank pools' fork server (and so every pooled rank), fresh ranks
# (dist_harness.py), hvdrun's ranks. pytest runs as .venv/bin/pytest, not
# `python -m pytest`, which would put the checkout (the current directory) first.
# Python and torch are not instrumented, so ASan's runtime must be the first
# library of every process: LD_PRELOAD, inherited by the same children.
set -euo pipefail

cd "$(dirname "$0")/.."
ROOT=$(pwd)
PY="$ROOT/.venv/bin/python"
ASAN_DIR=build/asan
ASAN_LIB="$ROOT/$ASAN_DIR/lib"
STAMP="$ASAN_DIR/built"

say() { echo "[sanitize] $*"; }

build() {
    local newer
    if [ -f "$STAMP" ] && [ -f "$ASAN_LIB/hvd_torch/__init__.py" ]; then
        # What the build reads: the C++ sources, the packages' Python, the build
        # files. Not what a build writes (the record, the in-place .so).
        newer=$(find csrc hvd_torch hvdrun ray_integration setup.py build_config.py -type f \
                \( -name '*.cc' -o -name '*.cpp' -o -name '*.h' -o -name '*.cu' -o -name '*.py' \) \
                ! -name _build_info.py -newer "$STAMP" -print -quit)
        if [ -z "$newer" ]; then
            say "build/asan: up to date"
            return
        fi
        say "build/asan: building ($newer is newer)"
    else
        say "build/asan: building (no sanitized build yet; about 10 minutes on 2 cores)"
    fi
    local start
    start=$(date +%s)
    # The stamp takes the time the build started: a source edited while it
    # runs is newer than the stamp, so the next run builds again.
    touch "$STAMP.next"
    # --force: setuptools compares only the .cc files with the .so (not the
    # headers), so it decides nothing; ninja rebuilds exactly the stale objects.
    HVD_TORCH_SANITIZE=address,undefined MAX_JOBS="${MAX_JOBS:-2}" \
        "$PY" setup.py -q build --force --build-base "$ASAN_DIR" --build-lib "$ASAN_LIB" \
        >"$ASAN_DIR.log" 2>&1 || { cat "$ASAN_DIR.log"; say "build/asan: build failed"; exit 1; }
    mv "$STAMP.next" "$STAMP"
    say "build/asan: built in $(( $(date +%s) - start ))s (log: $ASAN_DIR.log)"
}

# The multi-rank tests (tests/ranks) that run every op kind over the three
# planes of one machine, each on 2 and 3 ranks: shared memory (one host; the
# default), flat Gloo (HVD_TORCH_SHM=0) and hierarchical (host names faked per
# rank, so 3 and 4 ranks: it needs a host with two). Serial tests measure the
# machine and stay out; so does test_shm.py's soak (slow), which fails on any
# growth of memory, and ASan's quarantine keeps freed memory by design.
#
# ci: each op kind on each plane with 2 and 3 ranks, in a few minutes on 2 cores.
#   test_planes.py     every op and dtype over flat Gloo (2, 3 ranks); async
#                      handles, in-place, grouped and join() over shm (2, 3),
#                      Gloo (2, 3) and hierarchical (3, 4); every rank loads
#                      the sanitized extension
#   test_shm.py        every op and dtype over shm (2, 3 ranks) and hierarchical
#                      (hosts a,a,b,b / a,b,a / a,b,b)
#   test_allreduce.py, test_reducescatter.py: their grids (1, 2, 3 ranks) with
#                      the default inline budget, so small ops take rank 0's
#                      inline path too (where UBSan found a memcpy to null)
#   test_agreement.py  every op kind agreed among the ranks without rank 0
#                      (issue #47; 2, 3 ranks over Gloo), against rank 0's numbers
CI_SET=(
    tests/ranks/test_planes.py
    tests/ranks/test_shm.py::test_every_op_and_dtype_through_many_rounds
    tests/ranks/test_shm.py::test_every_op_and_dtype_across_hosts_hierarchical
    tests/ranks/test_allreduce.py::test_every_dtype_op_scale_and_size
    tests/ranks/test_reducescatter.py::test_reducescatter_values
    tests/ranks/test_agreement.py::test_every_op_kind_is_agreed_and_gives_rank_0s_numbers
)
# full: the whole ranks tier (about 410 tests; 3-4 minutes on 2 cores): the CI
# set, the rest of test_shm.py (large ops both ways, the plane per process set,
# a rank killed mid-collective), each op's own file (every dtype, op, scale and
# size, gradients, errors) and everything around the ops: process sets, join,
# the eager fast path and the fast lane, the response cache, sparse, Adasum,
# compression, the optimizer, error paths, stalls, the timeline, the rank pools,
# torch.distributed's "hvd" backend, torch.compile.
FULL_SET=(tests/ranks)

# The runtimes, preloaded: ASan must come first in every process, and neither
# python nor torch links it. UBSan's runtime beside it (_C needs both).
sanitizer_env() {
    local asan ubsan
    asan=$(gcc -print-file-name=libasan.so)
    ubsan=$(gcc -print-file-name=libubsan.so)
    [ -e "$asan" ] && [ -e "$ubsan" ] \
        || { say "gcc's libasan/libubsan not found (Debian: libgcc-12-dev)"; exit 1; }
    export LD_PRELOAD="$asan $ubsan${LD_PRELOAD:+ $LD_PRELOAD}"
    # detect_leaks=0: python and torch do not free what they hold at exit, and a
    # leak suppression matches any frame of the allocation's stack, so one that
    # hid python's leaks would hide every csrc allocation made under a python
    # call too. csrc's own leaks are LeakSanitizer's in the C++ unit tests
    # (tests/cpp, SAN=asan), which run the engine and the planes without python.
    # abort_on_error: a report kills the rank with SIGABRT, which the harness
    # reports as the rank's failure, with the report in the rank's output.
    # The caller's own options, if any, come last and win.
    local asan=(detect_leaks=0 abort_on_error=1 halt_on_error=1
                detect_stack_use_after_return=1 check_initialization_order=1 strict_init_order=1)
    local ubsan=(print_stacktrace=1 halt_on_error=1 abort_on_error=1)
    ASAN_OPTIONS="$(IFS=:; echo "${asan[*]}")${ASAN_OPTIONS:+:$ASAN_OPTIONS}"
    UBSAN_OPTIONS="$(IFS=:; echo "${ubsan[*]}")${UBSAN_OPTIONS:+:$UBSAN_OPTIONS}"
    export ASAN_OPTIONS UBSAN_OPTIONS
    export PYTHONPATH="$ASAN_LIB${PYTHONPATH:+:$PYTHONPATH}"
}

# All in one function, read whole before it runs: an edit to this file while
# it runs (a build takes minutes) cannot change what it does.
main() {
    build_only=0
    case "${1:-}" in
        build) build_only=1 ;;
        full|ci|run) ;;
        *) echo "usage: $0 build | full|ci [PYTEST ARGS] | run CMD [ARGS]" >&2; exit 2 ;;
    esac
    mkdir -p "$ASAN_DIR"
    build
    [ "$build_only" = 1 ] && exit 0

    sanitizer_env
    # The checkout's hvd_torch must not be found first: the rank pools' fork server
    # runs `python -c`, which puts the current directory at the head of sys.path
    # (Python 3.11 ignores the sys.path multiprocessing hands it). So everything
    # runs from build/asan/lib, whose hvd_torch is the sanitized one.
    cd "$ASAN_LIB"
    "$ROOT/.venv/bin/python" - "$ASAN_LIB" <<'PYEOF'
import sys
import hvd_torch._C as C
assert C.__file__.startswith(sys.argv[1] + "/"), f"not the sanitized extension: {C.__file__}"
assert b"__asan_init" in open(C.__file__, "rb").read(), f"not built with ASan: {C.__file__}"
PYEOF
    set_name=$1
    shift
    case "$set_name" in
        run) exec "$@" ;;
        ci) tests=("${CI_SET[@]}") ;;
        full) tests=("${FULL_SET[@]}") ;;
    esac
    say "$set_name set: ${#tests[@]} entries; ASAN_OPTIONS=$ASAN_OPTIONS"
    start=$(date +%s)
    status=0
    "$ROOT/.venv/bin/pytest" -q --rootdir "$ROOT" -c "$ROOT/pyproject.toml" -p no:cacheprovider \
        --timeout="${PYTEST_TIMEOUT:-900}" --durations=15 -n "${JOBS:-2}" --dist loadgroup \
        -m "not serial and not slow" "${tests[@]/#/$ROOT/}" "$@" || status=$?
    say "done in $(( $(date +%s) - start ))s (exit $status)"
    exit $status
}

main "$@"
