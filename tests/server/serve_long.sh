#!/usr/bin/env bash
# server_long: a 32k-token prompt end to end through `trellis serve` (issue 31): a one-layer
# model of the tiny shape trained (so it says) for 32,768 positions, the cache in q8_0, a
# prompt of 32,000 token ids prefilled in chunks; the answer comes, the server's peak RSS
# grows by what its pool and chunks need and not by anything of the prompt's square; the
# same prompt again is served from the prefix cache.
# usage: serve_long.sh TRELLIS DATA_DIR
set -euo pipefail
TRELLIS=$1 DATA=$2
source "$(dirname "$0")/lib.sh"

long=$tmp/long-q4_0.gguf
timeout "$(scaled 60)" "$TRELLIS" gen-model --shape tiny --layers 1 --ctx 32768 --type q4_0 -o "$long" >/dev/null 2>"$tmp/gen.err" \
  || die "gen-model: $(cat "$tmp/gen.err")"
model=$long
start_server long --ctx-size 32768 -ctk q8_0 -ctv q8_0 --kv-blocks 2048
hwm() { awk '/^VmHWM/ {print $2}' "/proc/$srv_pid/status"; }  # KiB
before=$(hwm)

say "a prompt of 32,000 tokens, prefilled in chunks over a q8_0 cache"
python3 -c "import json, random; random.seed(7); print(json.dumps({'prompt': [random.randrange(3, 32000) for _ in range(32000)], 'max_tokens': 4, 'temperature': 0}))" >"$tmp/req.json"
code=$(curl -s -m "$(scaled 240)" -o "$tmp/r1.json" -w '%{http_code}' "$base/v1/completions" -H 'Content-Type: application/json' -d @"$tmp/req.json")
[[ $code == 200 ]] || die "32k prompt -> $code $(head -c 300 "$tmp/r1.json")"
[[ $(jget "$tmp/r1.json" "j['usage']['prompt_tokens']") == 32000 ]] || die "prompt_tokens: $(jget "$tmp/r1.json" "j['usage']")"
[[ $(jget "$tmp/r1.json" "j['usage']['completion_tokens']") == 4 ]] || die "completion_tokens: $(jget "$tmp/r1.json" "j['usage']")"
after=$(hwm)
# The pool (2048 blocks of 32 tokens at 272 B a token: 17 MiB) and 512-row chunks; a
# [32k x 32k] score matrix alone would be 4 GiB.
(( after - before < 200 * 1024 )) || die "peak RSS grew by $(( (after - before) / 1024 )) MiB over a 32k prompt"
ok "answered; peak RSS $(( before / 1024 )) -> $(( after / 1024 )) MiB"

say "the same prompt again: from the prefix cache"
code=$(curl -s -m "$(scaled 60)" -o "$tmp/r2.json" -w '%{http_code}' "$base/v1/completions" -H 'Content-Type: application/json' -d @"$tmp/req.json")
[[ $code == 200 ]] || die "again -> $code"
cached=$(jget "$tmp/r2.json" "j['usage'].get('prompt_tokens_details', {}).get('cached_tokens', 0)")
(( cached >= 31968 )) || die "cached_tokens $cached of 32000"
[[ $(jget "$tmp/r2.json" "j['choices'][0]['text']") == "$(jget "$tmp/r1.json" "j['choices'][0]['text']")" ]] || die "another answer from the cache"
ok "$cached of 32000 cached, the same answer"
stop_server

echo "PASS server_long: $n_checks checks"
