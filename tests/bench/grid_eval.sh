#!/usr/bin/env bash
# bench_grid_eval: `trellis bench grid --quick` end to end: one process, then grids of 2
# and 3 processes (head and nodes; on loopback, and in network namespaces on shaped links
# when run as root). Checks what must hold whatever the speed: every configuration
# measured on every link, with positive rates and TTFTs; the phi run reused its shared
# prefix; a grid moves 2 x n_embd x 4 bytes per token row and node (plus the steps'
# headers and tables), one process none; every process's memory was read; the pipeline
# model gave a prediction for every grid; with a prefix store, one process and every grid
# of 2 or more read most of each prompt from it on a new head; nothing of the emulated
# cluster is left behind.
# Speed is not judged here (docs/BENCHMARKS.md has the figures).
# usage: grid_eval.sh TRELLIS
set -euo pipefail
TRELLIS=$1
out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT
export TRELLIS_CACHE=$out/cache
before=$(ip netns list 2>/dev/null | grep -c '^trellis-b' || true)
"$TRELLIS" bench grid --quick --no-plots -o "$out" >"$out/log" 2>&1 || { cat "$out/log"; tail -n 20 "$out"/logs/*; exit 1; }
after=$(ip netns list 2>/dev/null | grep -c '^trellis-b' || true)
[[ $after -le $before ]] || { echo "network namespaces left behind:"; ip netns list; exit 1; }
grep -q '^### Targets' "$out/log" || { cat "$out/log"; exit 1; }
python3 - "$out/grid_eval.csv" "$out/grid_eval_summary.csv" "$out/grid_store.csv" <<'PY'
import csv, sys
rows = [r for r in csv.DictReader(l for l in open(sys.argv[1]) if not l.startswith('#'))]
links = {r['link'] for r in rows}
assert 'loopback' in links, links
configs = {r['config'] for r in rows}
assert configs == {'baseline-2t', '1-node', '2-nodes', '3-nodes'}, configs
assert len(rows) == len(links) * len(configs), len(rows)
E = 256  # the tiny model's width
for r in rows:
    for k in ('decode1_tok_s', 'decode8_tok_s', 'ttft_cold_ms', 'ttft_phi_ms'):
        assert float(r[k]) > 0, (k, r)
    assert float(r['hit']) > 0.8, f"the phi run reused too little: {r}"
    n = int(r['nodes'])
    bpt = float(r['bytes_per_token'])
    if n == 1:
        assert bpt == 0, r
    else:
        assert 2 * 4 * E * (n - 1) <= bpt <= 2 * 4 * E * (n - 1) * 1.5, f"bytes per token {bpt} for {n} processes"
    rss = [float(x) for x in r['rss_mib'].split()]
    assert len(rss) == n and all(x > 0 for x in rss), r
summary = [r for r in csv.DictReader(l for l in open(sys.argv[2]) if not l.startswith('#'))]
for r in summary:
    if r['link'] == 'prediction' or (r['config'] not in ('baseline-2t',)):
        assert float(r['pred_decode8']) > 0 and float(r['pred_ttft_ms']) > 0, r
store = [r for r in csv.DictReader(l for l in open(sys.argv[3]) if not l.startswith('#'))]
assert {r['config'] for r in store} == {'baseline-2t', '2-nodes', '3-nodes'}, store
assert len(store) == 3 * len(links), store
for r in store:
    assert float(r['ttft_cold_ms']) > 0 and float(r['ttft_store_ms']) > 0, r
    assert float(r['hit']) >= 0.5, f"a new head read too little from the store: {r}"
print(f"bench grid --quick: {len(rows)} runs on {sorted(links)} checked; {len(store)} store runs")
PY
