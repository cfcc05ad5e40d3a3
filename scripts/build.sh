#!/usr/bin/env bash
# Configures and builds one flavour of Trellis.
#   scripts/build.sh release   -> build/        (optimized; what `run` and benchmarks use)
#   scripts/build.sh asan      -> build-asan/   (AddressSanitizer + UBSan, Debug)
#   scripts/build.sh fuzz      -> build-fuzz/   (clang libFuzzer targets only)
#   scripts/build.sh aarch64   -> build-aarch64/ (cross build of util, model, kernels, kv and
#                                 engine with their tests, run under qemu-user)
set -euo pipefail
cd "$(dirname "$0")/.."
flavour=${1:-release}
jobs=${JOBS:-$(nproc)}
case "$flavour" in
  release)
    cmake -S . -B build -G Ninja -DCMAKE_BUILD_TYPE=Release >/dev/null
    ninja -C build -j "$jobs" "${@:2}" ;;
  asan)
    cmake -S . -B build-asan -G Ninja -DCMAKE_BUILD_TYPE=Debug -DCMAKE_CXX_FLAGS_DEBUG="-O1 -g" -DTRELLIS_SANITIZE=ON >/dev/null
    ninja -C build-asan -j "$jobs" "${@:2}" ;;
  fuzz)
    CC=clang CXX=clang++ cmake -S . -B build-fuzz -G Ninja -DCMAKE_BUILD_TYPE=Debug \
      -DTRELLIS_FUZZ=ON -DTRELLIS_SANITIZE=ON >/dev/null
    ninja -C build-fuzz -j "$jobs" gguf_fuzz api_fuzz http_fuzz store_fuzz grid_fuzz jinja_fuzz ;;
  aarch64)
    cmake -S . -B build-aarch64 -G Ninja -DCMAKE_BUILD_TYPE=Release \
      -DCMAKE_TOOLCHAIN_FILE=cmake/aarch64-linux-gnu.cmake -DTRELLIS_CORE_ONLY=ON >/dev/null
    ninja -C build-aarch64 -j "$jobs" "${@:2}" ;;
  *) echo "build.sh: unknown flavour '$flavour' (release, asan, fuzz, aarch64)" >&2; exit 2 ;;
esac
