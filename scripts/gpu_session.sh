#!/usr/bin/env bash
# Proving the GPU path on a lent GPU machine (the device tool; docs/gpu.md):
#
#   bash scripts/gpu_session.sh prepare   # here: fetch what that machine lacks into .gpu-carry/
#   bash scripts/gpu_session.sh run       # there (carry .gpu-carry): build, test, benchmark
#
# That machine has Python 3.12, a CUDA build of torch, nvcc, NCCL's wheel and
# pytest, but no Debian Gloo, no Ray and no network: `prepare` downloads Debian's
# libgloo-dev and the libraries libgloo0 needs as .deb files, and Ray for
# Python 3.12 trimmed to fit one call; `run` unpacks the .debs with dpkg -x into
# /tmp/gloo (never into /) and Ray into /tmp/ray-site, builds hvd_torch._C
# against the machine's torch with HVD_TORCH_GLOO_ROOT=/tmp/gloo, runs the GPU
# tests and the GPU benchmark, and writes logs and results under $OUT (or ./gpu-out).
set -euo pipefail
cd "$(dirname "$0")/.."

CARRY=.gpu-carry
DEBS=(libgloo-dev libgloo0 libhiredis0.14 libibverbs1 libnl-3-200 libnl-route-3-200)

prepare() {
    mkdir -p "$CARRY"
    (cd "$CARRY" && apt-get download "${DEBS[@]}")
    prepare_ray
    ls -la "$CARRY"
    # The device tool carries 64 MiB at most.
    du -sh "$CARRY"
}

# Ray (the version scripts/setup.sh installs) and the one dependency the image
# lacks, jsonschema, for Python 3.12, unpacked into one site folder. Ray's wheel
# (75 MiB) is more than one call carries; without its Java jars, its
# dashboard's web client and RLlib, which tests/gpu/test_ray_gpu.py never loads, it
# packs into about 40 MB.
prepare_ray() {
    local version tmp
    version=$(sed -n 's/.*"ray\[tune,client\]==\([0-9.]*\)".*/\1/p' scripts/setup.sh)
    tmp=$(mktemp -d)
    python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 \
        --implementation cp --platform manylinux2014_x86_64 --platform manylinux_2_17_x86_64 \
        --platform manylinux_2_28_x86_64 -d "$tmp" "ray==$version" jsonschema \
        jsonschema-specifications referencing rpds-py
    mkdir "$tmp/site"
    for wheel in "$tmp"/*.whl; do unzip -qo "$wheel" -d "$tmp/site"; done
    rm -rf "$tmp/site/ray/jars" "$tmp/site/ray/dashboard/client/build" "$tmp/site/ray/rllib"
    tar -czf "$CARRY/ray-site.tgz" -C "$tmp/site" .
    rm -rf "$tmp"
}

# One device call may run 600 s, and a session has about 15 minutes of device
# time in all, a machine's start included: every phase gets a bounded share of
# DEADLINE (seconds from the start), the most important first. Logs go to $work
# as each phase runs, and after each phase they are bundled into $out/logs.tgz
# (the tool brings back 8 files at most), so a call cut short keeps what ran.
DEADLINE=${DEADLINE:-480}
work=/tmp/gpu-session

left() { echo $((DEADLINE - SECONDS)); }

# phase NAME CAP COMMAND...: runs COMMAND for at most CAP seconds (less if the
# deadline is nearer), logs it to $work/NAME.log and records rc and time.
phase() {
    local name=$1 cap=$2 start=$SECONDS
    shift 2
    local limit=$(( cap < $(left) ? cap : $(left) ))
    if (( $(left) < 20 )); then
        echo "$name: skipped, $(left) s left" | tee -a "$work/summary.txt"
        return 0
    fi
    echo "== $name (at most $limit s)"
    local rc=0
    timeout --kill-after=10 "$limit" "$@" >"$work/$name.log" 2>&1 || rc=$?
    tail -15 "$work/$name.log"
    echo "$name: rc $rc, $((SECONDS - start)) s" | tee -a "$work/summary.txt"
    tar -czf "$out/logs.tgz" -C "$work" .
    return 0
}

run() {
    out=${OUT:-gpu-out}
    mkdir -p "$out"
    rm -rf "$work" && mkdir -p "$work"
    : >"$work/summary.txt"
    rm -rf /tmp/gloo && mkdir -p /tmp/gloo
    for deb in "$CARRY"/*.deb; do dpkg -x "$deb" /tmp/gloo; done
    export HVD_TORCH_GLOO_ROOT=/tmp/gloo
    export LD_LIBRARY_PATH=/tmp/gloo/usr/lib/x86_64-linux-gnu:${LD_LIBRARY_PATH:-}
    # The examples and the benchmark's ranks import hvd_torch from the checkout.
    export PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH}
    if [[ -f $CARRY/ray-site.tgz ]]; then
        rm -rf /tmp/ray-site && mkdir -p /tmp/ray-site
        tar -xzf "$CARRY/ray-site.tgz" -C /tmp/ray-site
        export PYTHONPATH=$PYTHONPATH:/tmp/ray-site
    fi
    export PYTHONUNBUFFERED=1 MAX_JOBS=${MAX_JOBS:-16} TORCH_CUDA_ARCH_LIST=${TORCH_CUDA_ARCH_LIST:-9.0}
    # The image's CC/CXX name a wrapper (/opt/gcc) whose link finds only libstdc++'s
    # static archive; setup.py refuses such a build (docs/gpu.md, "Building").
    if [[ -x /usr/bin/g++ ]]; then export CC=/usr/bin/gcc CXX=/usr/bin/g++; fi
    # torch's CUDAExtension finds the toolkit through CUDA_HOME; build_config knows where it is.
    CUDA_HOME=${CUDA_HOME:-$(python3 -c 'import build_config; print(build_config.cuda_home() or "")')}
    export CUDA_HOME
    {
        nvidia-smi -L || echo "no nvidia-smi"
        echo "nvcc $(command -v nvcc || echo none), CUDA_HOME=$CUDA_HOME, $(nproc) cores"
        python3 -c "import torch; print('torch', torch.__version__, 'cuda', torch.version.cuda)"
    } 2>&1 | tee "$work/device.txt"
    # In place, like `make setup`: the tests import hvd_torch from the checkout.
    # SKIP_BUILD=1 uses an extension carried in (a second call after a Python-only fix).
    if [[ -z ${SKIP_BUILD:-} ]]; then
        phase build 240 python3 setup.py build_ext --inplace
        # The build comes back for such a second call.
        tar -czf "$out/build.tgz" hvd_torch/_C*.so hvd_torch/_build_info.py 2>/dev/null || true
    fi
    python3 -c "import hvd_torch as hvd; print('cuda_built', hvd.cuda_built(), 'nccl_built', \
hvd.nccl_built())" 2>&1 | tee -a "$work/device.txt" || true
    local pytest=(python3 -m pytest -q -rfE --timeout=240 --durations=25 -p no:cacheprovider)
    # The GPU tests start 1-3 rank processes each: run four tests at a time
    # (16 cores; the ranks of different tests share the GPU like any ranks do).
    # tests/gpu/test_cuda_build.py is CI's compile check: the build phase did that.
    local workers=()
    python3 -c "import xdist" 2>/dev/null && workers=(-n 4)
    phase gpu-tests 220 "${pytest[@]}" "${workers[@]}" --junitxml="$work/gpu-tests.xml" \
        ${GPU_TESTS:-tests/gpu/test_cuda_ops.py tests/gpu/test_cuda_training.py \
        tests/gpu/test_cuda_sets_join.py tests/gpu/test_cuda_adasum.py tests/gpu/test_ray_gpu.py \
        tests/gpu/test_c10d_cuda.py}
    phase bench 150 python3 bench/gpu_bench.py --json "$out/gpu_bench.json"
    phase digits-np1 45 python3 -m hvdrun -np 1 python3 examples/digits_train.py \
        --device cuda --epochs 3 --no-resume --checkpoint /tmp/digits1.pt
    phase digits-np2 45 python3 -m hvdrun -np 2 python3 examples/digits_train.py \
        --device cuda --epochs 3 --no-resume --checkpoint /tmp/digits2.pt
    phase synthetic 45 python3 -m hvdrun -np 1 python3 examples/synthetic_benchmark.py \
        --device cuda --num-iters 3 --json "$work/synthetic.json"
    # ResNet-50's overhead ratio moved between 0.91 and 1.00 from one run to
    # the next: two more pairs give it a spread (docs/gpu.md).
    phase resnet-2 50 python3 bench/gpu_bench.py --part resnet --json "$out/gpu_resnet2.json"
    phase resnet-3 50 python3 bench/gpu_bench.py --part resnet --json "$out/gpu_resnet3.json"
    # The CPU path of the CUDA build, with what time is left.
    phase cpu-tests 600 "${pytest[@]}" "${workers[@]}" ${CPU_TESTS:-tests/ranks/test_allreduce.py \
        tests/ranks/test_errors.py tests/ranks/test_grouped.py tests/ranks/test_optimizer.py}
    cat "$work/summary.txt"
}

case "${1:-}" in
    prepare) prepare ;;
    run) run ;;
    *) echo "usage: $0 prepare|run" >&2; exit 2 ;;
esac
