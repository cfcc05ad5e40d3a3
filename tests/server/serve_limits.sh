#!/usr/bin/env bash
# server_limits: API keys (Bearer, per-key cache namespaces), 503 + Retry-After when the
# queue is full, and a disconnecting client (streamed, non-streamed or queued request)
# cancelling its request and freeing its blocks.
# usage: serve_limits.sh TRELLIS DATA_DIR
set -euo pipefail
TRELLIS=$1 DATA=$2
source "$(dirname "$0")/lib.sh"

sys="You are a concise assistant. Answer in one short sentence, never more, and do not repeat the question back to the user."
chat='{"messages":[{"role":"system","content":"'$sys'"},{"role":"user","content":"Hello"}],"max_tokens":4}'

say "--api-key: missing or wrong keys get 401, right keys work; keys never share cached blocks"
start_server auth --api-key alpha-key --api-key beta-key
code=$(post /v1/chat/completions "$chat" "$tmp/a.json")
[[ $code == 401 && $(jget "$tmp/a.json" "j['error']['code']") == invalid_api_key ]] || die "no key -> $code $(cat "$tmp/a.json")"
[[ $(post /v1/chat/completions "$chat" "$tmp/a.json" -H 'Authorization: Bearer alpha-kez') == 401 ]] || die "wrong key accepted"
[[ $(post /v1/chat/completions "$chat" "$tmp/a.json" -H 'Authorization: Bearer alpha-key-and-more') == 401 ]] || die "longer key accepted"
[[ $(post /v1/chat/completions "$chat" "$tmp/a.json" -H 'Authorization: alpha-key') == 401 ]] || die "non-Bearer accepted"
[[ $(curl -s -o /dev/null -w '%{http_code}' "$base/v1/models") == 401 ]] || die "/v1/models open without a key"
[[ $(curl -s -o /dev/null -w '%{http_code}' "$base/health") == 200 ]] || die "/health needs a key"
ok "401 without, with a wrong, longer or non-Bearer key; /health open"
[[ $(post /v1/chat/completions "$chat" "$tmp/a1.json" -H 'Authorization: Bearer alpha-key') == 200 ]] || die "alpha: $(cat "$tmp/a1.json")"
[[ $(post /v1/chat/completions "$chat" "$tmp/a2.json" -H 'Authorization: Bearer alpha-key') == 200 ]] || die "alpha 2"
[[ $(post /v1/chat/completions "$chat" "$tmp/b1.json" -H 'Authorization: Bearer beta-key') == 200 ]] || die "beta: $(cat "$tmp/b1.json")"
a2=$(jget "$tmp/a2.json" "j['usage']['prompt_tokens_details']['cached_tokens']")
b1=$(jget "$tmp/b1.json" "j['usage']['prompt_tokens_details']['cached_tokens']")
[[ $a2 -gt 0 ]] || die "alpha's second call found nothing cached"
[[ $b1 == 0 ]] || die "beta's first call reused $b1 tokens cached by alpha"
ok "alpha again: $a2 cached; beta, same prompt: $b1 cached"
stop_server

say "--share-cache lets keys share prefixes"
start_server shared --api-key alpha-key --api-key beta-key --share-cache
post /v1/chat/completions "$chat" "$tmp/a1.json" -H 'Authorization: Bearer alpha-key' >/dev/null
post /v1/chat/completions "$chat" "$tmp/b1.json" -H 'Authorization: Bearer beta-key' >/dev/null
b1=$(jget "$tmp/b1.json" "j['usage']['prompt_tokens_details']['cached_tokens']")
[[ $b1 -gt 0 ]] || die "beta found nothing of alpha's prefix with --share-cache"
ok "beta: $b1 cached"
stop_server

say "a full queue answers 503 with Retry-After; the server keeps serving"
start_server busy --max-running 1 --max-queue 1 --ctx-size 8192 --kv-memory 33554432
pids=()
for i in $(seq 1 8); do
  curl -s -m 150 -o "$tmp/q$i.json" -D "$tmp/q$i.hdr" -w '%{http_code}\n' "$base/v1/completions" \
    -d '{"prompt":"busy '$i'","max_tokens":1000,"temperature":0}' >"$tmp/q$i.code" &
  pids+=($!)
done
wait "${pids[@]}"
n503=$(cat "$tmp"/q*.code | grep -c '^503$' || true)
n200=$(cat "$tmp"/q*.code | grep -c '^200$' || true)
[[ $n503 -ge 1 ]] || die "no 503 among 8 concurrent requests with --max-queue 1: $(cat "$tmp"/q*.code | tr '\n' ' ')"
[[ $((n503 + n200)) -eq 8 ]] || die "codes other than 200/503: $(cat "$tmp"/q*.code | tr '\n' ' ')"
f=$(grep -l '^503$' "$tmp"/q*.code | head -1); f=${f%.code}
grep -qi '^Retry-After: 1' "$f.hdr" || die "503 without Retry-After: $(cat "$f.hdr")"
[[ $(jget "$f.json" "j['error']['type']") == server_error ]] || die "503 body: $(cat "$f.json")"
[[ $(post /v1/completions '{"prompt":"after","max_tokens":2}' "$tmp/after.json") == 200 ]] || die "not serving after 503s"
ok "$n200 x 200, $n503 x 503 (Retry-After: 1)"
stop_server

say "a client that disconnects mid-stream cancels its request and its blocks are freed"
start_server disc --ctx-size 32768 --kv-memory 67108864
curl -sN -m 1 "$base/v1/completions" -d '{"prompt":"never ending","max_tokens":30000,"temperature":0,"stream":true}' >"$tmp/d.sse" 2>/dev/null || true
[[ -s $tmp/d.sse ]] || die "no streamed data before the disconnect"
for _ in $(seq 1 50); do
  [[ $(metric trellis_requests_cancelled_total) == 1 && $(metric trellis_requests_running) == 0 ]] && break
  sleep 0.1
done
[[ $(metric trellis_client_disconnects_total) == 1 ]] || die "disconnect not counted: $(curl -s "$base/metrics" | grep -v '^#' | head -20)"
[[ $(metric trellis_requests_cancelled_total) == 1 ]] || die "request not cancelled"
[[ $(metric trellis_requests_running) == 0 ]] || die "request still running"
gen=$(metric trellis_generated_tokens_total)
[[ $gen -lt 30000 ]] || die "generated all $gen tokens: not cancelled"
# What may stay in use is the radix cache's copy of the full blocks (evictable), never
# the session's own: every used block is a cached one.
used=$(metric trellis_kv_blocks_used) cached=$(metric trellis_kv_blocks_cached)
[[ $used -gt 0 && $used == "$cached" ]] || die "kv_blocks_used $used != kv_blocks_cached $cached: a session still holds blocks"
[[ $(metric trellis_queue_depth) == 0 ]] || die "queue not empty"
ok "cancelled after $gen tokens; kv_blocks_used $used = the prefix cache's; running 0"
[[ $(post /v1/completions '{"prompt":"still alive","max_tokens":2}' "$tmp/alive.json") == 200 ]] || die "not serving after the disconnect"
stop_server

say "a client that disconnects while a non-streamed request runs or waits cancels it; its blocks are freed"
start_server ndisc --ctx-size 32768 --kv-memory 67108864 --max-running 1
# A plain answer keeps its shape: application/json with a Content-Length, not chunked.
curl -s -m 30 -D "$tmp/plain.hdr" -o "$tmp/plain.json" "$base/v1/completions" -d '{"prompt":"plain","max_tokens":4}'
grep -qi '^Content-Type: application/json' "$tmp/plain.hdr" || die "plain answer: $(cat "$tmp/plain.hdr")"
grep -qi '^Content-Length: ' "$tmp/plain.hdr" || die "plain answer without Content-Length: $(cat "$tmp/plain.hdr")"
grep -qi '^Transfer-Encoding' "$tmp/plain.hdr" && die "plain answer is chunked: $(cat "$tmp/plain.hdr")"
[[ $(jget "$tmp/plain.json" "j['usage']['completion_tokens']") == 4 ]] || die "plain answer: $(cat "$tmp/plain.json")"
ok "a non-streamed answer: application/json, Content-Length"
# wait_cancelled N: waits up to 2 s for N cancelled requests and none running or queued.
wait_cancelled() {
  local end=$(($(date +%s%N) + 2000000000))
  while (($(date +%s%N) < end)); do
    [[ $(metric trellis_requests_cancelled_total) == "$1" && $(metric trellis_requests_running) == 0 &&
       $(metric trellis_queue_depth) == 0 ]] && return 0
    sleep 0.05
  done
  die "$1 cancellation(s) expected within 2 s: $(curl -s "$base/metrics" | grep -E '^trellis_(requests|client|kv|queue)')"
}
curl -s -m 1 -o "$tmp/nd.json" "$base/v1/completions" \
  -d '{"prompt":"never ending","max_tokens":30000,"temperature":0}' && die "the 30000-token answer came within 1 s"
[[ -s $tmp/nd.json ]] && die "a body before the disconnect: $(head -c 200 "$tmp/nd.json")"
wait_cancelled 1
[[ $(metric trellis_client_disconnects_total) == 1 ]] || die "disconnect not counted"
gen=$(metric trellis_generated_tokens_total)
sleep 0.3
[[ $(metric trellis_generated_tokens_total) == "$gen" ]] || die "tokens still being generated after the cancel"
[[ $gen -lt 30000 ]] || die "generated all $gen tokens: not cancelled"
used=$(metric trellis_kv_blocks_used) cached=$(metric trellis_kv_blocks_cached)
[[ $used -gt 0 && $used == "$cached" ]] || die "kv_blocks_used $used != kv_blocks_cached $cached: a session still holds blocks"
ok "/v1/completions cancelled after $gen tokens; kv_blocks_used $used = the prefix cache's; running 0"
# A chat request queued behind a long one (--max-running 1) is cancelled while it waits.
# (The same prompt as above: greedy, it generates no end-of-text token for thousands of tokens.)
# -m 4: the checks below spawn several curls, slow on a loaded machine; the long one must outlive them.
curl -s -m 4 -o /dev/null "$base/v1/completions" -d '{"prompt":"never ending","max_tokens":30000,"temperature":0}' &
long=$!
sleep 0.3
curl -s -m 1 -o /dev/null "$base/v1/chat/completions" \
  -d '{"messages":[{"role":"user","content":"queued"}],"max_tokens":30000,"temperature":0}' && die "chat answered"
for _ in $(seq 1 10); do
  [[ $(metric trellis_requests_cancelled_total) == 2 ]] && break
  sleep 0.1
done
[[ $(metric trellis_requests_cancelled_total) == 2 && $(metric trellis_queue_depth) == 0 ]] \
  || die "queued chat request not cancelled: $(curl -s "$base/metrics" | grep -E '^trellis_(requests|queue)')"
[[ $(metric trellis_requests_running) == 1 ]] || die "the long request is not running any more"
ok "/v1/chat/completions cancelled while queued; the long one still runs"
wait "$long" && die "the long request answered"
wait_cancelled 3
[[ $(metric trellis_client_disconnects_total) == 3 ]] || die "disconnects: $(metric trellis_client_disconnects_total)"
used=$(metric trellis_kv_blocks_used) cached=$(metric trellis_kv_blocks_cached)
[[ $used == "$cached" ]] || die "kv_blocks_used $used != kv_blocks_cached $cached after the second disconnect"
[[ $(post /v1/chat/completions "$chat" "$tmp/alive2.json") == 200 ]] || die "not serving after the disconnects"
ok "the long one cancelled too; every block left is the cache's; the server still answers"
stop_server

say "-ctk/-ctv q8_0: the same --kv-memory holds ~1.9x the tokens, and the banner and /metrics say so"
start_server kvf16 --kv-memory 8388608
f16_tokens=$(metric trellis_kv_pool_tokens) f16_bpt=$(metric trellis_kv_bytes_per_token)
[[ $(metric trellis_kv_cache_type'{k="f16",v="f16"}') == 1 ]] || die "f16 server: no trellis_kv_cache_type{k=\"f16\",v=\"f16\"}"
stop_server
start_server kvq8 --kv-memory 8388608 -ctk q8_0 -ctv q8_0
q8_tokens=$(metric trellis_kv_pool_tokens) q8_bpt=$(metric trellis_kv_bytes_per_token)
[[ $(metric trellis_kv_cache_type'{k="q8_0",v="q8_0"}') == 1 ]] || die "q8_0 server: no trellis_kv_cache_type{k=\"q8_0\",v=\"q8_0\"}"
grep -q "kv q8_0/q8_0, .* = $q8_tokens tokens at $q8_bpt bytes each" "$tmp/kvq8.log" || die "banner: $(head -1 "$tmp/kvq8.log")"
python3 -c "import sys; a, b, c, d = map(float, sys.argv[1:]); sys.exit(0 if b / a >= 1.8 and c / d >= 1.8 else 1)" \
  "$f16_tokens" "$q8_tokens" "$f16_bpt" "$q8_bpt" || die "q8_0 holds $q8_tokens tokens ($q8_bpt B each) against f16's $f16_tokens ($f16_bpt B)"
[[ $(post /v1/chat/completions "$chat" "$tmp/q8.json") == 200 ]] || die "q8_0 chat: $(cat "$tmp/q8.json")"
stop_server
ok "8 MiB of KV: $f16_tokens tokens at $f16_bpt B (f16), $q8_tokens at $q8_bpt B (q8_0); q8_0 answers"
"$TRELLIS" serve -m "$model" --port 0 -ctk q5_0 >"$tmp/bad.log" 2>&1 && die "serve took -ctk q5_0"
grep -q "cache-type-k" "$tmp/bad.log" || die "-ctk q5_0: $(cat "$tmp/bad.log")"
ok "-ctk q5_0 refused by name"

echo "PASS server_limits: $n_checks checks"
