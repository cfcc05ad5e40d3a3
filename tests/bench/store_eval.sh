#!/usr/bin/env bash
# bench_store_eval: `trellis bench store --quick` end to end: two nodes (store and serve
# processes; in network namespaces on shaped links when run as root, else on loopback),
# both traces, the five configurations, single-flight, phi 0.9 and the miss-ratio curve.
# Checks what must hold whatever the speed: every request answered; no-cache reuses
# nothing; local-only reads nothing from the store; the store configurations read tokens
# from the store and reuse more than local-only; the cache receipt adds up (local + store
# + computed = prompt); the miss-ratio curve does not fall as memory grows past the
# working set; nothing of the emulated cluster is left behind. Speed is not judged here
# (docs/BENCHMARKS.md has the figures).
# usage: store_eval.sh TRELLIS [--loopback]
set -euo pipefail
TRELLIS=$1
out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT
export TRELLIS_CACHE=$out/cache
before=$(ip netns list 2>/dev/null | grep -c '^trellis-b' || true)
"$TRELLIS" bench store --quick --no-plots "${@:2}" -o "$out" >"$out/log" 2>&1 || { cat "$out/log"; tail -n 20 "$out"/logs/*; exit 1; }
# (The two variants hold one CTest resource lock, so no other run's namespaces are counted.)
after=$(ip netns list 2>/dev/null | grep -c '^trellis-b' || true)
[[ $after -le $before ]] || { echo "network namespaces left behind:"; ip netns list; exit 1; }
csv=$out/store_eval.csv
grep -q '^# cpu: ' "$csv" && grep -q '^# isa: ' "$csv" && grep -q '^# cluster: ' "$csv"
python3 - "$csv" "$out/store_eval_mrc.csv" <<'PY'
import csv, sys
rows = [r for r in csv.DictReader(l for l in open(sys.argv[1]) if not l.startswith('#'))]
assert rows, "no requests in the CSV"
bad = [r for r in rows if r['error']]
assert not bad, f"failed requests: {bad[:3]}"
by = {}
for r in rows:
    for k in ('prompt', 'cached', 'local', 'store', 'computed', 'store_remote', 'store_memory', 'store_replica'):
        r[k] = int(r[k])
    assert r['local'] + r['store'] + r['computed'] == r['prompt'], f"receipt does not add up: {r}"
    assert r['cached'] == r['local'] + r['store'], f"cached_tokens is not local + store: {r}"
    assert r['store'] == r['store_memory'] + r['store_replica'] + r['store_remote'], f"store tiers do not add up: {r}"
    by.setdefault((r['trace'], r['context'], r['nodes'], r['config']), []).append(r)
for (trace, ctx, nodes, config), rs in by.items():
    cached = sum(r['cached'] for r in rs)
    store = sum(r['store'] for r in rs)
    if config == 'no-cache':
        assert cached == 0, f"{trace} {ctx} {nodes}: no-cache reused {cached} tokens"
    if config == 'local':
        assert store == 0, f"{trace} {ctx} {nodes}: local-only read {store} tokens from a store"
    if config.startswith('store'):
        local = sum(r['cached'] for r in by[(trace, ctx, nodes, 'local')])
        assert store > 0, f"{trace} {ctx} {nodes} {config}: nothing read from the store"
        assert cached > local, f"{trace} {ctx} {nodes} {config}: reused {cached} tokens, local-only {local}"
mrc = [r for r in csv.DictReader(l for l in open(sys.argv[2]) if not l.startswith('#'))]
for trace in {r['trace'] for r in mrc}:
    pts = sorted((int(r['store_bytes']), float(r['hit_ratio'])) for r in mrc if r['trace'] == trace)
    full = [h for m, h in pts if m >= int(mrc[0]['working_set_bytes']) * 1.25]
    assert full and min(full) > 0, f"{trace}: no hits with the whole working set in memory: {pts}"
    # The miss-ratio curve: the hit ratio never falls as memory grows, and memory matters
    # (the smallest store hits less than the one holding the whole working set).
    for (m0, h0), (m1, h1) in zip(pts, pts[1:]):
        assert h1 >= h0, f"{trace}: hit ratio fell from {h0} at {m0} bytes to {h1} at {m1}: {pts}"
    assert pts[0][1] < pts[-1][1], f"{trace}: the hit ratio does not grow with memory: {pts}"
print(f"bench_store_eval: {len(rows)} requests checked")
PY
grep -q '### targets' "$out/log" || { echo "no targets table"; cat "$out/log"; exit 1; }
echo "bench_store_eval: ok"
