#!/usr/bin/env bash
# The whole test suite: set up, then
#   1. Release build (g++), every CTest test but the exhaustive ones (label full): unit,
#      llama.cpp reference logits on the best kernel path and again on the AVX2 paths,
#      end-to-end tests of the binary;
#   2. ASan + UBSan build (clang), the unit tests again (label unit) and the server under
#      load and hostile input;
#   3. the libFuzzer targets of the same build (GGUF reader, HTTP reader, JSON request
#      readers, store requests, grid messages, chat templates): corpus replay plus a
#      bounded run of each, two at a time;
#   4. (on x86-64) the aarch64 cross build of util, model, kernels, kv and engine, whose
#      tests (NEON kernels, dotprod and not, and the llama.cpp reference logits) run
#      under qemu-user.
# At the end (and on a failure) it prints each stage's wall time and the ten slowest
# tests, and fails if the run took longer than its budget (TRELLIS_TEST_BUDGET seconds,
# 2100 = 35 minutes; 0 turns the check off).
#
# usage: scripts/test.sh [--full]
#   --full  the exhaustive run for releases: every reference prompt on every kernel path
#           and under qemu, the loopback store evaluation, 10 minutes per fuzzer
#           (FUZZ_SECONDS); no budget.
# Benchmarks are programs (trellis bench ...), not tests: they do not run here.
set -euo pipefail
cd "$(dirname "$0")/.."
full=0
for arg in "$@"; do
  case $arg in
    --full) full=1 ;;
    *) echo "usage: scripts/test.sh [--full]" >&2; exit 2 ;;
  esac
done
jobs=${JOBS:-$(nproc)}
if ((full)); then
  export FUZZ_SECONDS=${FUZZ_SECONDS:-600}
  export TRELLIS_TEST_FULL=1  # the emulated stage runs every case too (src/util/slowdown.h)
  budget=0
  not_full=()
else
  export FUZZ_SECONDS=${FUZZ_SECONDS:-30}  # 7 fuzzers, 2 at a time: 30 s each keeps the run in its budget
  budget=${TRELLIS_TEST_BUDGET:-2100}
  not_full=(-LE '^full$')
fi

# Stage times and every ctest stage's JUnit file, read by scripts/test_report.py.
report=$PWD/build-report
rm -rf "$report"
mkdir -p "$report"
start=$(date +%s)
summary() {
  local rc=$?
  python3 scripts/test_report.py "$report" --budget "$budget" --elapsed $(($(date +%s) - start)) --rc "$rc" || rc=1
  exit "$rc"
}
trap summary EXIT

# stage NAME CMD...: runs CMD as one timed stage.
stage() {
  local name=$1 t0 rc=0
  shift
  echo "== $name" >&2
  t0=$(date +%s)
  "$@" || rc=$?
  printf '%s\t%s\t%s\n' "$name" $(($(date +%s) - t0)) "$rc" >>"$report/stages.tsv"
  return "$rc"
}
# tests NAME BUILD_DIR [ctest args...]: one ctest run over both cores as a timed stage.
tests() {
  local name=$1 dir=$2
  shift 2
  stage "$name" ctest --test-dir "$dir" --output-on-failure -j "$jobs" \
    --output-junit "$report/${name// /_}.xml" "$@"
}

stage "setup" scripts/setup.sh

stage "release build" scripts/build.sh release
tests "release tests" build "${not_full[@]}" --timeout 900

stage "asan build" scripts/build.sh asan
# Time bounds in the tests scale by TRELLIS_TEST_SLOWDOWN (src/util/slowdown.h).
export ASAN_OPTIONS=detect_leaks=1:abort_on_error=1 UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1
TRELLIS_TEST_SLOWDOWN=4 tests "asan unit tests" build-asan -L '^unit$' --timeout 1800
# The server under load (64 concurrent clients sharing a system prompt) and under hostile
# input: no errors, and LeakSanitizer fails the server's exit if anything leaked.
TRELLIS_TEST_SLOWDOWN=4 TRELLIS_ASAN=1 tests "asan server" build-asan -R '^server_(load|hostile)$' --timeout 900
unset ASAN_OPTIONS UBSAN_OPTIONS
tests "fuzz" build-asan -L '^fuzz$'

if [[ $(uname -m) == x86_64 ]]; then
  stage "aarch64 build" scripts/build.sh aarch64
  TRELLIS_TEST_SLOWDOWN=30 tests "qemu tests" build-aarch64 "${not_full[@]}" --timeout 1800
fi
echo "== all test stages passed" >&2
