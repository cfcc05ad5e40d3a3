#!/usr/bin/env bash
# The main job: set up, build, and run Trellis on a model.
#   MODEL=path/to/model.gguf scripts/run.sh     # your model
#   scripts/run.sh                              # embedded default (see below)
# With no MODEL, a random-weight model with TinyLlama-1.1B's exact architecture and the
# LLaMA SentencePiece vocab (shipped in tests/data/vocab) is generated once, in Q4_0 as
# llama-quantize makes it, and cached in ${TRELLIS_CACHE:-~/.cache/trellis}. Random
# weights cost exactly what trained ones cost, so the speed figures are real; the text
# is gibberish.
# Then: a short generation (text streamed, speed printed), the speed benchmark
# (pp512 / tg64, 2 threads, median of 5) printed as a table, and `trellis serve` with two
# chat requests sharing a system prompt (the second reports its cached tokens), and two
# nodes on the prefix store (the second reads what the first computed).
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh
scripts/build.sh release trellis >&2
THREADS=${THREADS:-2}
if [[ -z "${MODEL:-}" ]]; then
  cache=${TRELLIS_CACHE:-$HOME/.cache/trellis}
  mkdir -p "$cache"
  MODEL="$cache/tinyllama-shape-q4_0.gguf"
  if [[ ! -s "$MODEL" ]]; then
    echo "run: generating the default model (TinyLlama-1.1B shape, Q4_0, random weights) -> $MODEL" >&2
    build/trellis gen-model --shape tinyllama --type q4_0 -o "$MODEL" --threads "$THREADS"
  fi
fi
echo "== trellis run ($MODEL)" >&2
build/trellis run -m "$MODEL" -p "${PROMPT:-Once upon a time, in a village by the sea,}" -n 32 \
  --threads "$THREADS" --seed 1
echo "== trellis bench speed" >&2
mkdir -p results
build/trellis bench speed -m "$MODEL" --threads "$THREADS" -p 512 -n 64 -r 5 --csv results/speed.csv

echo "== trellis serve: two chat requests sharing a system prompt" >&2
PORT=${PORT:-18080}
build/trellis serve -m "$MODEL" --port "$PORT" --threads "$THREADS" >/tmp/trellis-serve.log 2>&1 &
SERVE_PID=$!
trap 'kill $SERVE_PID 2>/dev/null || true' EXIT
for _ in $(seq 1 300); do
  curl -sf "http://127.0.0.1:$PORT/health" >/dev/null 2>&1 && break
  sleep 0.2
done
MODEL_ID=$(curl -sf "http://127.0.0.1:$PORT/v1/models" | python3 -c 'import json,sys; print(json.load(sys.stdin)["data"][0]["id"])')
SYSTEM="You are Trellis, a private assistant running on this machine. Answer in one short sentence, plainly and politely, and never invent facts you do not know."
for question in "What is a radix tree?" "Why cache the prompt prefix?"; do
  body=$(printf '{"model":"%s","max_tokens":16,"temperature":0,"messages":[{"role":"system","content":"%s"},{"role":"user","content":"%s"}]}' "$MODEL_ID" "$SYSTEM" "$question")
  curl -sf "http://127.0.0.1:$PORT/v1/chat/completions" -H 'Content-Type: application/json' -d "$body" |
    python3 -c 'import json,sys; r=json.load(sys.stdin); u=r["usage"]; print("  %-30s prompt_tokens=%d cached_tokens=%d completion_tokens=%d" % (sys.argv[1], u["prompt_tokens"], u["prompt_tokens_details"]["cached_tokens"], u["completion_tokens"]))' "$question"
done
kill $SERVE_PID 2>/dev/null || true
wait $SERVE_PID 2>/dev/null || true

echo "== two nodes on the prefix store: node 2 reads the prefix node 1 computed" >&2
# Two `trellis store` servers (one per node, B knowing A) and two engines, each naming its
# own store; on one machine they talk UCX over loopback. Node 1 answers a long prompt
# and publishes its KV blocks; node 2 has never seen the prompt, reads them from the
# store, and computes only the tail (its usage.cache receipt says so).
export UCX_NET_DEVICES=lo
SA=${STORE_PORT_A:-19601} SB=${STORE_PORT_B:-19602} P1=$((PORT + 1)) P2=$((PORT + 2))
build/trellis store --listen 127.0.0.1:$SA --mem 1G --net-devices lo >/tmp/trellis-store-a.log 2>&1 &
STORE_A=$!
build/trellis store --listen 127.0.0.1:$SB --mem 1G --net-devices lo --peers 127.0.0.1:$SA >/tmp/trellis-store-b.log 2>&1 &
STORE_B=$!
trap 'kill $SERVE_PID $STORE_A $STORE_B ${NODE1:-} ${NODE2:-} 2>/dev/null || true' EXIT
sleep 0.5
build/trellis serve -m "$MODEL" --port "$P1" --threads "$THREADS" --store 127.0.0.1:$SA --store-peers 127.0.0.1:$SB \
  --store-net-devices lo >/tmp/trellis-node1.log 2>&1 &
NODE1=$!
build/trellis serve -m "$MODEL" --port "$P2" --threads "$THREADS" --store 127.0.0.1:$SB \
  --store-net-devices lo >/tmp/trellis-node2.log 2>&1 &
NODE2=$!
for port in $P1 $P2; do
  for _ in $(seq 1 300); do
    curl -sf "http://127.0.0.1:$port/health" >/dev/null 2>&1 && break
    sleep 0.2
  done
done
DOC=$(python3 -c 'print(" ".join(["The harbour master kept a ledger of every ship, its cargo, its crew and the tide it sailed on."] * 16))')
for port in $P1 $P2; do
  body=$(printf '{"model":"%s","max_tokens":8,"temperature":0,"messages":[{"role":"system","content":"%s"},{"role":"user","content":"Summarise the ledger."}]}' "$MODEL_ID" "$DOC")
  start=$(date +%s%N)
  answer=$(curl -sf "http://127.0.0.1:$port/v1/chat/completions" -H 'Content-Type: application/json' -d "$body")
  ms=$(( ($(date +%s%N) - start) / 1000000 ))
  python3 -c 'import json,sys; r=json.loads(sys.argv[3]); u=r["usage"]; c=u["cache"]; print("  node %s: prompt_tokens=%d local=%d store=%d computed=%d, answered in %s ms" % (sys.argv[1], u["prompt_tokens"], c["local"], c["store"], c["computed"], sys.argv[2]))' \
    "$([[ $port == "$P1" ]] && echo 1 || echo 2)" "$ms" "$answer"
  # Let node 1's publish land before node 2 asks (publishing is asynchronous).
  [[ $port == "$P1" ]] && sleep 1
done
kill $NODE1 $NODE2 $STORE_A $STORE_B 2>/dev/null || true
wait $NODE1 $NODE2 $STORE_A $STORE_B 2>/dev/null || true
