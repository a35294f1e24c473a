#!/usr/bin/env bash
# Proving the GPU path on a lent GPU machine (the device tool; docs/gpu.md):
#
#   bash scripts/gpu_session.sh prepare   # here: fetch what that machine lacks into .gpu-carry/
#   bash scripts/gpu_session.sh run       # there (carry .gpu-carry): build, test, benchmark
#
# That machine has Python 3.12, a CUDA build of torch, nvcc, NCCL's wheel and
# pytest, but no Debian Gloo and no network: `prepare` downloads Debian's
# libgloo-dev and the libraries libgloo0 needs as .deb files; `run` unpacks them
# with dpkg -x into /tmp/gloo (never into /), builds hvd_torch._C against the
# machine's torch with HVD_TORCH_GLOO_ROOT=/tmp/gloo, runs the GPU tests and the
# GPU benchmark, and writes logs and results under $OUT (or ./gpu-out).
set -euo pipefail
cd "$(dirname "$0")/.."

CARRY=.gpu-carry
DEBS=(libgloo-dev libgloo0 libhiredis0.14 libibverbs1 libnl-3-200 libnl-route-3-200)

prepare() {
    mkdir -p "$CARRY"
    (cd "$CARRY" && apt-get download "${DEBS[@]}")
    ls -la "$CARRY"
}

run() {
    local out=${OUT:-gpu-out}
    mkdir -p "$out"
    rm -rf /tmp/gloo && mkdir -p /tmp/gloo
    for deb in "$CARRY"/*.deb; do dpkg -x "$deb" /tmp/gloo; done
    export HVD_TORCH_GLOO_ROOT=/tmp/gloo
    export LD_LIBRARY_PATH=/tmp/gloo/usr/lib/x86_64-linux-gnu:${LD_LIBRARY_PATH:-}
    export PYTHONUNBUFFERED=1 MAX_JOBS=${MAX_JOBS:-16} TORCH_CUDA_ARCH_LIST=${TORCH_CUDA_ARCH_LIST:-9.0}
    # torch's CUDAExtension finds the toolkit through CUDA_HOME; build_config knows where it is.
    CUDA_HOME=${CUDA_HOME:-$(python3 -c 'import build_config; print(build_config.cuda_home() or "")')}
    export CUDA_HOME
    nvidia-smi -L | tee "$out/device.txt"
    python3 -c "import torch; print('torch', torch.__version__, 'cuda', torch.version.cuda)" \
        | tee -a "$out/device.txt"
    local start=$SECONDS
    # In place, like `make setup`: the tests import hvd_torch from the checkout.
    python3 setup.py build_ext --inplace >"$out/build.log" 2>&1 \
        || { tail -50 "$out/build.log"; exit 1; }
    echo "built in $((SECONDS - start)) s" | tee -a "$out/device.txt"
    python3 -c "import hvd_torch as hvd; print('cuda_built', hvd.cuda_built(), 'nccl_built', \
hvd.nccl_built())" | tee -a "$out/device.txt"
    set +e
    python3 -m pytest -q --timeout=900 tests/test_cuda_ops.py tests/test_cuda_build.py \
        tests/test_allreduce.py 2>&1 | tee "$out/tests.log" | tail -40
    python3 bench/gpu_bench.py --json "$out/gpu_bench.json" 2>&1 | tee "$out/bench.log"
}

case "${1:-}" in
    prepare) prepare ;;
    run) run ;;
    *) echo "usage: $0 prepare|run" >&2; exit 2 ;;
esac
