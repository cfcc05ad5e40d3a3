#!/usr/bin/env bash
# Configures and builds one flavour of Trellis.
#   scripts/build.sh release   -> build/         (g++, optimized; what `run` and benchmarks use)
#   scripts/build.sh asan      -> build-asan/    (clang, AddressSanitizer + UBSan at -O1, and
#                                 the libFuzzer targets; FUZZ_SECONDS sets their bounded runs)
#   scripts/build.sh aarch64   -> build-aarch64/ (cross build of util, model, kernels, kv and
#                                 engine with their tests, run under qemu-user)
# Further arguments go to ninja (targets, -k 0, ...). Compiles go through ccache when it is
# installed (CMakeLists.txt; cache in ~/.cache/ccache).
set -euo pipefail
cd "$(dirname "$0")/.."
flavour=${1:-release}
jobs=${JOBS:-$(nproc)}
case "$flavour" in
  release)
    cmake -S . -B build -G Ninja -DCMAKE_BUILD_TYPE=Release >/dev/null
    ninja -C build -j "$jobs" "${@:2}" ;;
  asan)
    # clang: it compiles the sanitized tree in half g++'s time (-O1 -g: 834 s against
    # ~420 s here), and builds the fuzzers in the same tree. Line tables are all that
    # ASan and UBSan reports need for file:line in their stacks.
    cmake -S . -B build-asan -G Ninja -DCMAKE_C_COMPILER=clang -DCMAKE_CXX_COMPILER=clang++ \
      -DCMAKE_BUILD_TYPE=Debug -DCMAKE_CXX_FLAGS_DEBUG="-O1 -gline-tables-only" \
      -DTRELLIS_SANITIZE=ON -DTRELLIS_FUZZ=ON -DTRELLIS_FUZZ_SECONDS="${FUZZ_SECONDS:-30}" >/dev/null
    ninja -C build-asan -j "$jobs" "${@:2}" ;;
  aarch64)
    cmake -S . -B build-aarch64 -G Ninja -DCMAKE_BUILD_TYPE=Release \
      -DCMAKE_TOOLCHAIN_FILE=cmake/aarch64-linux-gnu.cmake -DTRELLIS_CORE_ONLY=ON >/dev/null
    ninja -C build-aarch64 -j "$jobs" "${@:2}" ;;
  *) echo "build.sh: unknown flavour '$flavour' (release, asan, aarch64)" >&2; exit 2 ;;
esac
