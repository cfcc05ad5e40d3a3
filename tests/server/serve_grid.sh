#!/usr/bin/env bash
# server_grid: the grid as real processes (docs/grid.md). `trellis node` processes hold
# layer ranges of a tiny random model (4 layers) and a `trellis serve --grid` head serves
# the OpenAI API over them:
#   - with 3 nodes (the head runs no layer) and with 2 (the head runs layer 0), greedy
#     answers and their logprobs equal one process running the whole model, for single
#     and concurrent requests, and a repeated prompt is served from the head's cache;
#     the same for a llama.cpp reference model (tests/data/reference) over 3 nodes;
#   - a node started with other layers, or another model file, is refused at start-up;
#   - a node SIGKILLed in the middle of a long stream ends it with an error event and
#     [DONE] within the step deadline; then requests fail with 503 (and an SSE error
#     event), /health says 503 and names the node; restarted, it rejoins and answers are
#     right again, and the cache view (/trellis/v1/cache) shows each node's layers,
#     steps and the failure;
#   - a node that stops answering (SIGSTOP) fails requests within --grid-timeout;
#   - nodes registered in etcd (`node --etcd`) are found by `serve --grid-etcd`;
#   - with a prefix store (`trellis store`, nodes and head started with --store): a grid
#     publishes a long prompt, a restarted head reads it back with every node reading its
#     own layers (usage.cache.store), and the answers equal one process's; a
#     single-process engine reads the grid's blocks, and the grid a single process's;
#   - nodes started with --store while the store is down serve, and once it comes up on
#     that address they read their layers from it like the others.
# usage: serve_grid.sh TRELLIS DATA_DIR
set -euo pipefail
TRELLIS=$1 DATA=$2
source "$(dirname "$0")/lib.sh"
export UCX_NET_DEVICES=lo

# start_node NAME LAYERS [PORT [MODEL]]: sets $node_port and $node_pid. node_extra (an
# array) holds more options.
node_extra=()
start_node() {
  local name=$1 layers=$2 port=${3:-0} m=${4:-$model}
  "$TRELLIS" node -m "$m" --layers "$layers" --listen 127.0.0.1:"$port" --net-devices lo "${node_extra[@]}" >"$tmp/$name.log" 2>&1 &
  node_pid=$!
  srv_pids+=("$node_pid")
  node_port=$(wait_port "$name" "$node_pid" '.*listening on 127\.0\.0\.1:\([0-9]*\) .*') || exit 1
}

# A prompt of several whole blocks (what the store keeps).
long_prompt=$(python3 -c 'print(" ".join(["the keeper of the lighthouse counted the ships that passed the northern cape"] * 8))')

# ask NAME PROMPT [STATUS]: a greedy completion with logprobs into $tmp/NAME.json.
ask() {
  local want=${3:-200}
  local body="{\"prompt\":\"$2\",\"max_tokens\":10,\"temperature\":0,\"logprobs\":3}"
  local got
  got=$(post /v1/completions "$body" "$tmp/$1.json")
  [[ $got == "$want" ]] || die "$1: status $got, expected $want: $(cat "$tmp/$1.json")"
}

# same A B: the two answers have the same text and logprobs within 1e-3.
same() {
  python3 - "$tmp/$1.json" "$tmp/$2.json" <<'EOF' || die "$1 and $2 differ"
import json, sys
a, b = (json.load(open(p))["choices"][0] for p in sys.argv[1:3])
assert a["text"] == b["text"], (a["text"], b["text"])
la, lb = a["logprobs"]["token_logprobs"], b["logprobs"]["token_logprobs"]
assert len(la) == len(lb) and all(abs(x - y) < 1e-3 for x, y in zip(la, lb)), (la, lb)
EOF
}

prompts=("the keeper of the lighthouse counted the ships" "once upon a time in a quiet village by the sea there lived"
         "one two three four five six seven eight nine ten eleven twelve")

say "one process with the whole model: the reference"
start_server whole
whole_base=$base
for i in "${!prompts[@]}"; do ask "ref$i" "${prompts[$i]}"; done
ask refL "$long_prompt"
stop_server

for layout in 3 2; do
  say "grid of $layout nodes"
  if [[ $layout == 3 ]]; then
    start_node n1 0-1; p1=$node_port
    start_node n2 2-2; p2=$node_port
    start_node n3 3-3; p3=$node_port; pid3=$node_pid
    spec=127.0.0.1:$p1=0-1,127.0.0.1:$p2=2-2,127.0.0.1:$p3=3-3
  else
    start_node n1 1-2; p1=$node_port
    start_node n3 3-3; p3=$node_port; pid3=$node_pid
    spec=127.0.0.1:$p1=1-2,127.0.0.1:$p3=3-3
  fi
  start_server head$layout --grid "$spec" --grid-net-devices lo --grid-timeout 3
  head_pid=$srv_pid
  grep -q "grid head with" "$tmp/head$layout.log" || die "no grid banner: $(cat "$tmp/head$layout.log")"
  for i in "${!prompts[@]}"; do ask "g$layout-$i" "${prompts[$i]}"; same "ref$i" "g$layout-$i"; done
  ok "the same answers and logprobs as the whole model"
  # Concurrent requests: micro-batches of different sessions in flight together.
  for i in "${!prompts[@]}"; do ask "c$layout-$i" "${prompts[$i]}" & done
  wait_all=0
  for job in $(jobs -p); do
    [[ " ${srv_pids[*]} " == *" $job "* ]] && continue
    wait "$job" || wait_all=1
  done
  [[ $wait_all == 0 ]] || die "a concurrent request failed"
  for i in "${!prompts[@]}"; do same "ref$i" "c$layout-$i"; done
  cached=$(jget "$tmp/c$layout-0.json" "j['usage']['prompt_tokens_details']['cached_tokens']")
  [[ $cached -gt 0 ]] || die "a repeated prompt found nothing in the grid's cache: $(cat "$tmp/c$layout-0.json")"
  ok "concurrent requests the same; a repeated prompt reused $cached cached tokens"

  if [[ $layout == 3 ]]; then
    say "node 3 SIGKILLed during a long stream: an error event and [DONE]; 503, /health names it; restarted: it rejoins"
    curl -sN -m 60 -H 'Content-Type: application/json' \
      -d "{\"prompt\":\"${prompts[2]}\",\"max_tokens\":2000,\"ignore_eos\":true,\"temperature\":0,\"stream\":true}" \
      "$base/v1/completions" >"$tmp/long.txt" &
    curl_pid=$!
    for _ in $(seq 1 "$(scaled 300)"); do
      [[ $(grep -c '^data: {"choices"' "$tmp/long.txt") -ge 20 ]] && break
      sleep 0.02
    done
    [[ $(grep -c '^data: {"choices"' "$tmp/long.txt") -ge 20 ]] || die "the long stream did not start: $(head -c 600 "$tmp/long.txt")"
    kill -9 "$pid3"
    t0=$(date +%s.%N)
    wait "$curl_pid" || die "the stream did not end after its node died (curl: $?): $(tail -c 600 "$tmp/long.txt")"
    t1=$(date +%s.%N)
    got=$(grep -c '^data: {"choices"' "$tmp/long.txt")
    [[ $got -lt 2000 ]] || die "all 2000 tokens streamed: the node died after the stream"
    grep -q '^data: {"error"' "$tmp/long.txt" && [[ $(tail -n 2 "$tmp/long.txt" | head -1) == 'data: [DONE]' ]] \
      || die "the stream did not end with an error event and [DONE]: $(tail -c 600 "$tmp/long.txt")"
    python3 -c "import sys; sys.exit(0 if $t1 - $t0 < $(scaled 5) else 1)" || die "the stream took $(python3 -c "print($t1 - $t0)") s to end"
    ok "the stream ended $(python3 -c "print(round($t1 - $t0, 2))") s after the kill, $got tokens in: $(grep -o '"message":"[^"]*"' "$tmp/long.txt" | head -1)"
    ask dead "${prompts[0]}" 503
    grep -q "127.0.0.1:$p3" "$tmp/dead.json" || die "the error does not name the node: $(cat "$tmp/dead.json")"
    code=$(curl -s -o "$tmp/health.json" -w '%{http_code}' "$base/health")
    [[ $code == 503 ]] && grep -q "127.0.0.1:$p3" "$tmp/health.json" || die "/health: $code $(cat "$tmp/health.json")"
    curl -sN -m 30 -H 'Content-Type: application/json' \
      -d "{\"prompt\":\"${prompts[1]}\",\"max_tokens\":4,\"stream\":true}" "$base/v1/completions" >"$tmp/sse.txt"
    grep -q '^data: {"error"' "$tmp/sse.txt" && grep -q '^data: \[DONE\]' "$tmp/sse.txt" \
      || die "streamed request: no error event: $(cat "$tmp/sse.txt")"
    ok "503: $(jget "$tmp/dead.json" "j['error']['message']")"
    start_node n3b 3-3 "$p3"; pid3=$node_pid
    for _ in $(seq 1 100); do
      [[ $(curl -s -o /dev/null -w '%{http_code}' "$base/health") == 200 ]] && break
      sleep 0.1
    done
    [[ $(curl -s -o /dev/null -w '%{http_code}' "$base/health") == 200 ]] || die "the head did not recover: $(tail -5 "$tmp/head3.log")"
    for i in "${!prompts[@]}"; do ask "r$i" "${prompts[$i]}"; same "ref$i" "r$i"; done
    ok "rejoined without restarting the head; answers right again"
    curl -s -m 10 "$base/trellis/v1/cache" >"$tmp/view.json"
    python3 - "$tmp/view.json" "127.0.0.1:$p3" <<'PY' || die "the cache view's grid section: $(cat "$tmp/view.json")"
import json, sys
g = json.load(open(sys.argv[1]))["grid"]
assert g["healthy"] and g["head"]["layers"] is None and g["node_failures"] == 1 and g["rejoins"] == 1, g
assert [n["layers"] for n in g["nodes"]] == [[0, 1], [2, 2], [3, 3]], g["nodes"]
for n in g["nodes"]:
    assert n["up"] and n["steps"] > 0 and n["step_seconds"] > 0 and n["rtt_seconds"] > 0, n
    assert n["failures"] == (1 if n["address"] == sys.argv[2] else 0), n
print("  ok   cache view: " + "; ".join(f"{n['address']} layers {n['layers']} {n['steps']} steps, "
      f"{1000 * n['step_seconds'] / n['steps']:.2f} ms each, {n['failures']} failures" for n in g["nodes"]))
PY

    say "node 3 stops answering (SIGSTOP): requests fail within --grid-timeout"
    kill -STOP "$pid3"
    t0=$(date +%s.%N)
    ask stopped "${prompts[2]}" 503
    t1=$(date +%s.%N)
    kill -CONT "$pid3"
    python3 -c "import sys; d = $t1 - $t0; sys.exit(0 if d < 10 else 1)" || die "a stopped node took $(python3 -c "print($t1 - $t0)") s to fail the request"
    ok "503 after $(python3 -c "print(round($t1 - $t0, 1))") s: $(jget "$tmp/stopped.json" "j['error']['message']")"
  fi
  stop_server "$head_pid"
  for p in $(jobs -p); do kill -TERM "$p" 2>/dev/null || true; done
  wait 2>/dev/null || true
  srv_pids=()
done

say "a llama.cpp reference model (ref-b-q6_k, 3 layers) over 3 nodes: the same as one process"
tiny=$model
model=$DATA/reference/ref-b-q6_k.gguf
start_server refwhole
for i in "${!prompts[@]}"; do ask "rw$i" "${prompts[$i]}"; done
stop_server
start_node r1 0-0; q1=$node_port
start_node r2 1-1; q2=$node_port
start_node r3 2-2; q3=$node_port
start_server refgrid --grid 127.0.0.1:$q1=0-0,127.0.0.1:$q2=1-1,127.0.0.1:$q3=2-2 --grid-net-devices lo
for i in "${!prompts[@]}"; do ask "rg$i" "${prompts[$i]}"; same "rw$i" "rg$i"; done
ok "ref-b-q6_k: the same answers and logprobs over 3 nodes"
stop_server
for p in $(jobs -p); do kill -TERM "$p" 2>/dev/null || true; done
wait 2>/dev/null || true
srv_pids=()
model=$tiny

say "the store: a grid publishes; a new head reads it back, every node its own layers"
start_store gstore
saddr=$store_addr
node_extra=(--store "$saddr" --store-net-devices lo)
start_node s1 1-2; s1=$node_port
start_node s2 3-3; s2=$node_port
node_extra=()
sspec=127.0.0.1:$s1=1-2,127.0.0.1:$s2=3-3
# wait_published: until the server's publishes landed.
wait_published() {
  local n=0
  for _ in $(seq 1 100); do
    n=$(metric trellis_store_published_blocks_total)
    [[ ${n%.*} -gt 0 ]] && break
    sleep 0.1
  done
  [[ ${n%.*} -gt 0 ]] || die "$1 published nothing"
}
start_server shead1 --grid "$sspec" --grid-net-devices lo --store "$saddr" --store-net-devices lo
ask sg1 "$long_prompt"
same refL sg1
wait_published "the grid"
gathered=$(metric trellis_grid_store_gathered_bytes_total)
[[ ${gathered%.*} -gt 0 ]] || die "the grid published without gathering the nodes' layers"
ok "grid 1: computed $(jget "$tmp/sg1.json" "j['usage']['cache']['computed']") tokens, published $(metric trellis_store_published_blocks_total) blocks ($gathered bytes gathered from the nodes)"
stop_server
start_server shead2 --grid "$sspec" --grid-net-devices lo --store "$saddr" --store-net-devices lo
ask sg2 "$long_prompt"
same refL sg2
prompt=$(jget "$tmp/sg2.json" "j['usage']['prompt_tokens']")
stored=$(jget "$tmp/sg2.json" "j['usage']['cache']['store']")
[[ $stored -ge $((prompt - 32)) ]] || die "the new head read $stored of $prompt tokens from the store: $(cat "$tmp/sg2.json")"
fetches=$(metric trellis_grid_store_node_fetches_total)
[[ ${fetches%.*} -ge 2 ]] || die "the nodes ran no fetch ($fetches)"
ok "grid 2 (fresh pools): $stored of $prompt prompt tokens from the store, read by the head and $fetches node fetches"
stop_server
start_server swhole --store "$saddr" --store-net-devices lo
ask sw "$long_prompt"
same refL sw
[[ $(jget "$tmp/sw.json" "j['usage']['cache']['store']") -gt 0 ]] || die "one process read nothing the grid published: $(cat "$tmp/sw.json")"
other_prompt="a different story: $long_prompt"
ask swo "$other_prompt"
wait_published "one process"
stop_server
start_server shead3 --grid "$sspec" --grid-net-devices lo --store "$saddr" --store-net-devices lo
ask sg3 "$other_prompt"
same swo sg3
[[ $(jget "$tmp/sg3.json" "j['usage']['cache']['store']") -gt 0 ]] || die "the grid read nothing one process published: $(cat "$tmp/sg3.json")"
ok "one process reads the grid's blocks, and the grid one process's, with the same answers"
stop_server
for p in $(jobs -p); do kill -TERM "$p" 2>/dev/null || true; done
wait 2>/dev/null || true
grep -q "store: [1-9][0-9]* fetches (0 failed)" "$tmp/s2.log" || die "node 2's stop line: $(tail -2 "$tmp/s2.log")"
ok "$(grep -o 'store: .*' "$tmp/s2.log")"
srv_pids=()

say "nodes started while their store is down serve, and join it when it comes up"
down_port=$(python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
node_extra=(--store "127.0.0.1:$down_port" --store-net-devices lo)
start_node d1 1-2; d1=$node_port
start_node d2 3-3; d2=$node_port
node_extra=()
grep -q "store" "$tmp/d1.log" || die "node 1 said nothing of its store: $(cat "$tmp/d1.log")"
dspec=127.0.0.1:$d1=1-2,127.0.0.1:$d2=3-3
start_server dhead0 --grid "$dspec" --grid-net-devices lo
ask dg0 "$long_prompt"
same refL dg0
stop_server
ok "the grid serves with its nodes' store down: $(grep -m1 -o 'store.*' "$tmp/d1.log")"
store_port=$down_port start_store dstore
start_server dhead1 --grid "$dspec" --grid-net-devices lo --store "127.0.0.1:$down_port" --store-net-devices lo
ask dg1 "$long_prompt"
same refL dg1
wait_published "the grid on the late store"
stop_server
start_server dhead2 --grid "$dspec" --grid-net-devices lo --store "127.0.0.1:$down_port" --store-net-devices lo
ask dg2 "$long_prompt"
same refL dg2
stored=$(jget "$tmp/dg2.json" "j['usage']['cache']['store']")
fetches=$(metric trellis_grid_store_node_fetches_total)
[[ $stored -gt 0 && ${fetches%.*} -ge 2 ]] || die "the nodes did not join the late store: $stored tokens from it, $fetches node fetches: $(cat "$tmp/dg2.json")"
ok "the store came up: $stored prompt tokens read back by $fetches node fetches"
stop_server
for p in $(jobs -p); do kill -TERM "$p" 2>/dev/null || true; done
wait 2>/dev/null || true
srv_pids=()

say "a node with other layers, or another model file, is refused at start-up"
start_node wrong 1-3; pw=$node_port
if "$TRELLIS" serve -m "$model" --port 0 --grid 127.0.0.1:$pw=2-3 --grid-net-devices lo --grid-start-timeout 5 >"$tmp/refused.log" 2>&1; then
  die "a head started on a node with other layers"
fi
grep -q "refused" "$tmp/refused.log" && grep -q "layers" "$tmp/refused.log" || die "unclear refusal: $(cat "$tmp/refused.log")"
ok "$(grep -o 'refused.*' "$tmp/refused.log" | head -1)"
other=$tmp/other.gguf
"$TRELLIS" gen-model --shape tiny --type q4_0 --seed 7 -o "$other" >/dev/null 2>&1
start_node othermodel 1-3 0 "$other"; po=$node_port
if "$TRELLIS" serve -m "$model" --port 0 --grid 127.0.0.1:$po=1-3 --grid-net-devices lo --grid-start-timeout 5 >"$tmp/refused2.log" 2>&1; then
  die "a head started on a node with another model"
fi
grep -q "refused" "$tmp/refused2.log" && grep -q "model" "$tmp/refused2.log" || die "unclear refusal: $(cat "$tmp/refused2.log")"
ok "$(grep -o 'refused.*' "$tmp/refused2.log" | head -1)"
say "nodes registered in etcd; the head finds them with --grid-etcd"
command -v etcd >/dev/null || die "etcd is not installed (Debian etcd-server; scripts/setup.sh installs it)"
# Ports below Linux's ephemeral range (32768-60999), where the other tests' connections
# cannot take them; an etcd that exits (its port taken after all) is retried on new ones,
# and one that never turns healthy fails the test with its log, not later with the node's.
# (A CI run had a node find no etcd at 127.0.0.1:37232: a port in the ephemeral range, or
# an etcd slower than the old 10 s wait; its log was not kept.)
etcd_up=
for attempt in 1 2 3 4 5; do
  eport=$((10000 + RANDOM % 20000)); pport=$((eport + 1))
  etcd --name g --data-dir "$tmp/etcd$attempt" --listen-client-urls http://127.0.0.1:$eport \
    --advertise-client-urls http://127.0.0.1:$eport --listen-peer-urls http://127.0.0.1:$pport \
    --initial-advertise-peer-urls http://127.0.0.1:$pport --initial-cluster g=http://127.0.0.1:$pport \
    >"$tmp/etcd.log" 2>&1 &
  etcd_pid=$!
  srv_pids+=("$etcd_pid")
  for _ in $(seq 1 300); do  # 30 s
    curl -s -m 1 "http://127.0.0.1:$eport/health" | grep -q true && { etcd_up=1; break; }
    kill -0 "$etcd_pid" 2>/dev/null || break
    sleep 0.1
  done
  [ -n "$etcd_up" ] && break
  kill -0 "$etcd_pid" 2>/dev/null && die "etcd on port $eport not healthy after 30 s: $(tail -5 "$tmp/etcd.log")"
done
[ -n "$etcd_up" ] || die "etcd exited on 5 pairs of ports: $(tail -5 "$tmp/etcd.log")"
start_node_etcd() {  # NAME LAYERS
  "$TRELLIS" node -m "$model" --layers "$2" --listen 127.0.0.1:0 --net-devices lo --etcd http://127.0.0.1:$eport \
    --etcd-ttl 2 >"$tmp/$1.log" 2>&1 &
  srv_pids+=("$!")
  for _ in $(seq 1 100); do grep -q "registered in etcd" "$tmp/$1.log" && return; sleep 0.1; done
  die "node $1 did not register: $(cat "$tmp/$1.log")"
}
start_node_etcd e1 1-2
start_node_etcd e2 3-3
start_server etcdhead --grid-etcd http://127.0.0.1:$eport --grid-net-devices lo --grid-start-timeout 10
grep -q "grid head with layers 0-0 here" "$tmp/etcdhead.log" || die "the head did not take layers 1-3 from etcd: $(cat "$tmp/etcdhead.log")"
for i in "${!prompts[@]}"; do ask "e$i" "${prompts[$i]}"; same "ref$i" "e$i"; done
ok "$(grep -o 'nodes 127.*' "$tmp/etcdhead.log" | cut -d'|' -f1)"
stop_server
if "$TRELLIS" serve -m "$model" --port 0 --grid-etcd http://127.0.0.1:$((eport + 7)) --grid-start-timeout 1 >"$tmp/noetcd.log" 2>&1; then
  die "a head started without an etcd"
fi
grep -q "no grid after" "$tmp/noetcd.log" || die "unclear error without etcd: $(cat "$tmp/noetcd.log")"
ok "no etcd: $(grep -o 'no grid after.*' "$tmp/noetcd.log")"

say "grid: all checks passed"
