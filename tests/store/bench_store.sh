#!/usr/bin/env bash
# store_bench_micro: `trellis bench store --micro` end to end at toy sizes: store
# processes start, the bulk get reads every block back intact (the bench checks the
# bytes), ucx_perftest runs on the same settings, the lookup costs one message, and the
# CSV has every row. Speed is not judged here (docs/BENCHMARKS.md has the figures).
# usage: bench_store.sh TRELLIS
set -euo pipefail
TRELLIS=$1
out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT
"$TRELLIS" bench store --micro --blocks 6 --block-bytes 65536 -r 2 --rounds 2 --servers 2 --lookups 30 -o "$out" >"$out/log" 2>&1 \
  || { cat "$out/log"; exit 1; }
csv=$out/store_micro.csv
for row in "get,bandwidth_median" "ucx_perftest_one_get,bandwidth" "ucx_perftest_block_gets,bandwidth" \
           "lookup,messages_per_lookup" "lookup,latency_p99"; do
  grep -q "^$row," "$csv" || { echo "no $row in $csv:"; cat "$csv" "$out/log"; exit 1; }
done
# Every bandwidth measured (ucx_perftest answered), and exactly one lookup message per lookup.
awk -F, '/bandwidth/ && $3 <= 0 { print "bad bandwidth: " $0; bad = 1 } END { exit bad }' "$csv"
awk -F, '$2 == "messages_per_lookup" && $3 != 1 { print "lookup took " $3 " messages"; bad = 1 } END { exit bad }' "$csv"
grep -q '^# cpu: ' "$csv" && grep -q '^# isa: ' "$csv"
cat "$out/log"
echo "store_bench_micro: ok"
