#!/usr/bin/env bash
# What `make fuzz` needs besides `make setup`: Debian's clang, whose compiler-rt
# carries libFuzzer and the sanitizers (bookworm: clang-14, libclang-rt in
# libclang-common-14-dev). Idempotent: with a clang that links
# -fsanitize=fuzzer,address,undefined it returns in a second.
#
#   bash scripts/setup_fuzz.sh
set -euo pipefail

say() { echo "[setup-fuzz] $*"; }

as_root() {
    if [ "$(id -u)" = 0 ]; then "$@"; else sudo "$@"; fi
}

clangxx() { command -v clang++ || command -v clang++-14 || true; }

# Links a one-line target with libFuzzer, ASan and UBSan: what every target needs.
links() {
    local cxx dir
    cxx=$(clangxx)
    [ -n "$cxx" ] || return 1
    dir=$(mktemp -d)
    printf '#include <cstddef>\n#include <cstdint>\nextern "C" int LLVMFuzzerTestOneInput(const uint8_t*, size_t) { return 0; }\n' \
        >"$dir/t.cc"
    "$cxx" -fsanitize=fuzzer,address,undefined "$dir/t.cc" -o "$dir/t" 2>/dev/null
    local ok=$?
    rm -rf "$dir"
    return $ok
}

if links; then
    say "clang with libFuzzer: present ($(clangxx))"
    exit 0
fi
say "clang: installing (apt-get)"
as_root apt-get -o DPkg::Lock::Timeout=600 update -qq
as_root env DEBIAN_FRONTEND=noninteractive apt-get -o DPkg::Lock::Timeout=600 install -y -qq clang >/dev/null
if ! links; then
    say "clang is installed but cannot link -fsanitize=fuzzer,address,undefined (libclang-rt missing?)"
    exit 1
fi
say "clang with libFuzzer: installed ($(clangxx))"
