#!/usr/bin/env bash
# The whole test suite: set up, then
#   1. Release build, every CTest test (unit, reference-logit and end-to-end tests);
#   2. ASan + UBSan build, the unit tests again (label `unit`) and the server load test;
#   3. libFuzzer build (clang) of the GGUF reader, corpus replay plus a bounded run.
# Benchmarks are programs (trellis bench ...), not tests: they do not run here.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh
jobs=${JOBS:-$(nproc)}
FUZZ_SECONDS=${FUZZ_SECONDS:-60}

echo "== [1/3] release build + all tests" >&2
scripts/build.sh release
ctest --test-dir build --output-on-failure -j "$jobs" --timeout 900

echo "== [2/3] ASan + UBSan build + unit tests" >&2
scripts/build.sh asan
ASAN_OPTIONS=detect_leaks=1:abort_on_error=1 UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1 \
  ctest --test-dir build-asan --output-on-failure -j "$jobs" -L unit --timeout 1800
# The server under load (64 concurrent clients sharing a system prompt): no errors, and
# LeakSanitizer fails the server's exit if anything leaked.
ASAN_OPTIONS=detect_leaks=1:abort_on_error=1 UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1 \
  ctest --test-dir build-asan --output-on-failure -R '^server_load$' --timeout 600

echo "== [3/3] libFuzzer: GGUF reader (${FUZZ_SECONDS}s)" >&2
scripts/build.sh fuzz
mkdir -p build-fuzz/fuzz-work
build-fuzz/tests/gguf_fuzz -runs=0 tests/data/gguf_corpus
build-fuzz/tests/gguf_fuzz -max_total_time="$FUZZ_SECONDS" -max_len=8192 -rss_limit_mb=2048 \
  -artifact_prefix=build-fuzz/fuzz-work/ build-fuzz/fuzz-work tests/data/gguf_corpus 2>&1 | tail -3
echo "== all test stages passed" >&2
