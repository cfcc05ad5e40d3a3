#!/usr/bin/env bash
# The whole test suite: set up, then
#   1. Release build, every CTest test (unit, reference-logit and end-to-end tests);
#   2. ASan + UBSan build, the unit tests again (label `unit`) and the server load test;
#   3. libFuzzer builds (clang) of the GGUF reader, the HTTP request reader, the JSON
#      request readers, the store's request handlers and a grid node's message decoding:
#      corpus replay plus a bounded run of each;
#   4. (on x86-64) the aarch64 cross build of util, model, kernels, kv and engine, whose
#      tests (NEON kernels, dotprod and not, and the llama.cpp reference logits) run
#      under qemu-user.
# Benchmarks are programs (trellis bench ...), not tests: they do not run here.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh
jobs=${JOBS:-$(nproc)}
FUZZ_SECONDS=${FUZZ_SECONDS:-60}

echo "== [1/4] release build + all tests" >&2
scripts/build.sh release
ctest --test-dir build --output-on-failure -j "$jobs" --timeout 900

echo "== [2/4] ASan + UBSan build + unit tests" >&2
scripts/build.sh asan
ASAN_OPTIONS=detect_leaks=1:abort_on_error=1 UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1 \
  ctest --test-dir build-asan --output-on-failure -j "$jobs" -L unit --timeout 1800
# The server under load (64 concurrent clients sharing a system prompt) and under hostile
# input: no errors, and LeakSanitizer fails the server's exit if anything leaked.
TRELLIS_ASAN=1 ASAN_OPTIONS=detect_leaks=1:abort_on_error=1 UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1 \
  ctest --test-dir build-asan --output-on-failure -R '^server_(load|hostile)$' --timeout 900

echo "== [3/4] libFuzzer: GGUF reader, HTTP reader, API readers, store requests, grid messages, chat templates (${FUZZ_SECONDS}s each)" >&2
scripts/build.sh fuzz
# fuzz NAME CORPUS MAX_LEN [flags...]: replays the committed corpus, then fuzzes for
# FUZZ_SECONDS into a scratch directory (new inputs never go into the committed corpus).
fuzz() {
  local name=$1 corpus=$2 max_len=$3; shift 3
  mkdir -p "build-fuzz/$name-work"
  "build-fuzz/tests/$name" -runs=0 "$corpus"
  "build-fuzz/tests/$name" -max_total_time="$FUZZ_SECONDS" -max_len="$max_len" -rss_limit_mb=2048 \
    -artifact_prefix="build-fuzz/$name-work/" "$@" "build-fuzz/$name-work" "$corpus" 2>&1 | tail -3
}
fuzz gguf_fuzz tests/data/gguf_corpus 8192
fuzz http_fuzz tests/data/http_corpus 16384 -dict=tests/data/http_corpus.dict
fuzz api_fuzz tests/data/api_corpus 65536 -dict=tests/data/api_corpus.dict
UCX_NET_DEVICES=lo LSAN_OPTIONS=suppressions=tests/fuzz/store_fuzz.lsan.supp fuzz store_fuzz tests/data/store_corpus 4096
fuzz grid_fuzz tests/data/grid_corpus 4096
fuzz jinja_fuzz tests/data/jinja_corpus 4096 -dict=tests/data/jinja_corpus.dict

if [[ $(uname -m) == x86_64 ]]; then
  echo "== [4/4] aarch64 cross build + tests under qemu-user" >&2
  scripts/build.sh aarch64
  ctest --test-dir build-aarch64 --output-on-failure -j "$jobs" --timeout 1800
fi
echo "== all test stages passed" >&2
