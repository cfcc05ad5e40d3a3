#!/usr/bin/env bash
# server_store: two nodes on the prefix store, as real processes. Two `trellis store`
# servers and two `trellis serve --store` engines on a tiny random model: node 1 computes
# a long prompt and publishes it; node 2, with an empty cache of its own, reads the prefix
# from the store (usage.cache.store > 0), computes only the rest, and answers the same
# greedy text. Then node 2's store is killed with SIGKILL while it indexes a prompt node 1
# published: node 2's request for it still succeeds, computed locally, with the miss
# counted as store_down or deadline (the dead store was asked), well inside the fetch
# timeout. Last, an engine started while its store is down serves, says so on /health,
# and joins the store (publishes to it) once it comes up on that address.
# usage: serve_store.sh TRELLIS DATA_DIR
set -euo pipefail
TRELLIS=$1 DATA=$2
source "$(dirname "$0")/lib.sh"
export UCX_NET_DEVICES=lo


say "two store servers; B knows A as its peer"
start_store store_a
a_addr=$store_addr
start_store store_b --peers "$a_addr" --metrics-listen 127.0.0.1:0
b_addr=$store_addr b_pid=$store_pid
b_metrics=http://127.0.0.1:$(wait_port store_b "$b_pid" '.*metrics on http://127\.0\.0\.1:\([0-9]*\)/metrics.*') || exit 1
b_keys() { curl -s -m 5 "$b_metrics/metrics" | awk '$1 == "trellis_store_index_keys" {print $2}'; }
# The engine at $base's published blocks, once above 0 (10 s at most; 0 then).
wait_published() {
  local n=0
  for _ in $(seq 1 100); do
    n=$(metric trellis_store_published_blocks_total)
    [[ ${n%.*} -gt 0 ]] && break
    sleep 0.1
  done
  echo "${n:-0}"
}
ok "A $a_addr, B $b_addr"

say "two engines: node 1 names both stores, node 2 only its own (it learns A from B)"
start_server node1 --store "$a_addr" --store-peers "$b_addr" --store-net-devices lo
base1=$base
start_server node2 --store "$b_addr" --store-net-devices lo --store-timeout-ms 1500
base2=$base
grep -q "prefix store $b_addr (2 members" "$tmp/node2.log" || die "node 2 did not learn the membership: $(cat "$tmp/node2.log")"
ok "$(grep 'prefix store' "$tmp/node2.log")"

text=$(python3 -c 'print(" ".join(["the keeper of the lighthouse counted the ships that passed the northern cape"] * 12))')
body="{\"prompt\":\"$text\",\"max_tokens\":6,\"temperature\":0}"

say "node 1 computes the prompt and publishes it"
base=$base1
[[ $(post /v1/completions "$body" "$tmp/r1.json") == 200 ]] || die "node 1: $(cat "$tmp/r1.json")"
[[ $(jget "$tmp/r1.json" "j['usage']['cache']['store']") == 0 ]] || die "node 1 read from an empty store: $(cat "$tmp/r1.json")"
published=$(wait_published)
[[ ${published%.*} -gt 0 ]] || die "node 1 published nothing"
ok "node 1: $(jget "$tmp/r1.json" "j['usage']['cache']"); published $published blocks"

say "node 2 reads the prefix from the store and answers the same text"
base=$base2
[[ $(post /v1/completions "$body" "$tmp/r2.json") == 200 ]] || die "node 2: $(cat "$tmp/r2.json")"
prompt=$(jget "$tmp/r2.json" "j['usage']['prompt_tokens']")
store=$(jget "$tmp/r2.json" "j['usage']['cache']['store']")
[[ $store -gt 0 && $store -ge $((prompt - 32)) ]] || die "node 2 read $store of $prompt tokens from the store: $(cat "$tmp/r2.json")"
[[ $(jget "$tmp/r2.json" "j['usage']['cache']['local']") == 0 ]] || die "node 2 had it locally?"
[[ $(jget "$tmp/r2.json" "j['usage']['prompt_tokens_details']['cached_tokens']") == "$store" ]] || die "cached_tokens != store"
[[ $(jget "$tmp/r2.json" "j['usage']['cache']['computed'] + j['usage']['cache']['store'] == j['usage']['prompt_tokens']") == True ]] \
  || die "receipt does not add up: $(cat "$tmp/r2.json")"
[[ $(jget "$tmp/r1.json" "j['choices'][0]['text']") == "$(jget "$tmp/r2.json" "j['choices'][0]['text']")" ]] \
  || die "texts differ: $(jget "$tmp/r1.json" "j['choices'][0]['text']") vs $(jget "$tmp/r2.json" "j['choices'][0]['text']")"
tokens=$(curl -s -m 5 "$base2/metrics" | awk '$1 ~ /^trellis_store_tokens_total/ {s += $2} END {print s}')
[[ $tokens == "$store" ]] || die "metrics count $tokens store tokens, the receipt $store"
ok "node 2: $(jget "$tmp/r2.json" "j['usage']['cache']")"

say "a prompt node 1 publishes that B indexes (placement hashes each prompt's first block)"
base=$base1
on_b=""
for i in $(seq 1 12); do
  before=$(b_keys)
  t=$(python3 -c "import sys; print(' '.join(['passage $i about barges on the canal and the price of grain in winter'] * 12))")
  [[ $(post /v1/completions "{\"prompt\":\"$t\",\"max_tokens\":2,\"temperature\":0}" "$tmp/p$i.json") == 200 ]] || die "node 1: $(cat "$tmp/p$i.json")"
  for _ in $(seq 1 50); do
    [[ $(b_keys) -gt $before ]] && break
    sleep 0.1
  done
  if [[ $(b_keys) -gt $before ]]; then on_b=$t; break; fi
done
[[ -n $on_b ]] || die "none of 12 prompts was indexed on B"
ok "prompt $i is indexed on B"

say "node 2's store killed: the request is computed locally, the miss counted as the dead store's, no hang"
kill -9 "$b_pid"
base=$base2
t0=$(date +%s%N)
[[ $(post /v1/completions "{\"prompt\":\"$on_b\",\"max_tokens\":4,\"temperature\":0}" "$tmp/r3.json") == 200 ]] \
  || die "node 2 with its store dead: $(cat "$tmp/r3.json")"
ms=$(( ($(date +%s%N) - t0) / 1000000 ))
[[ $(jget "$tmp/r3.json" "j['usage']['cache']['store']") == 0 ]] || die "store tokens from a dead store"
[[ $(jget "$tmp/r3.json" "sum(j['usage']['cache']['miss_reasons'].get(k, 0) for k in ('store_down', 'deadline')) > 0") == True ]] \
  || die "the dead store was not asked, or its miss not counted as store_down/deadline: $(cat "$tmp/r3.json")"
[[ $ms -lt 10000 ]] || die "the request took $ms ms"
ok "node 2, store dead: $(jget "$tmp/r3.json" "j['usage']['cache']") in $ms ms"

say "an engine whose store is down at start serves, and joins the store when it comes up"
late_port=$(python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
start_server node3 --store "127.0.0.1:$late_port" --store-net-devices lo
base3=$base base3_pid=$srv_pid
grep -q "prefix store 127.0.0.1:$late_port is down: serving without it" "$tmp/node3.log" || die "node 3's banner: $(cat "$tmp/node3.log")"
[[ $(curl -s -m 5 "$base3/health" | jget /dev/stdin "j['status'] + ' ' + j['store']") == "ok down" ]] \
  || die "node 3 /health: $(curl -s -m 5 "$base3/health")"
[[ $(post /v1/completions "$body" "$tmp/r4.json") == 200 ]] || die "node 3 without its store: $(cat "$tmp/r4.json")"
[[ $(metric trellis_store_servers_reachable) == 0 ]] || die "node 3 counts a reachable store"
"$TRELLIS" store --listen "127.0.0.1:$late_port" --mem 64M --net-devices lo >"$tmp/store_late.log" 2>&1 &
srv_pids+=("$!")
wait_port store_late "$!" '.*listening on 127\.0\.0\.1:\([0-9]*\),.*' >/dev/null || exit 1
joined=""
for _ in $(seq 1 "$(scaled 50)"); do
  [[ $(curl -s -m 5 "$base3/health" | jget /dev/stdin "j['store']") == up ]] && { joined=1; break; }
  sleep 0.1
done
[[ -n $joined ]] || die "node 3 did not join its store within $(scaled 5) s: $(curl -s -m 5 "$base3/health")"
[[ $(post /v1/completions "{\"prompt\":\"$on_b\",\"max_tokens\":2,\"temperature\":0}" "$tmp/r5.json") == 200 ]] || die "node 3: $(cat "$tmp/r5.json")"
published=$(wait_published)
[[ ${published%.*} -gt 0 ]] || die "node 3 published nothing to the store that came up"
ok "node 3 joined the store: $published blocks published, /health $(curl -s -m 5 "$base3/health")"

say "both engines stop cleanly"
stop_server "${srv_pids[2]}"
stop_server "${srv_pids[3]}"
stop_server "$base3_pid"
echo "server_store: ok"
