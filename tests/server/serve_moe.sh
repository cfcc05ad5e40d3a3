#!/usr/bin/env bash
# server_moe: `trellis serve` on a mixture of experts (a random qwen3moe, docs/moe.md):
# chat completions plain and streamed, the second call sharing the system prompt served
# from the prefix cache, and greedy completions equal to `trellis run` on the same file.
# usage: serve_moe.sh TRELLIS DATA_DIR
set -euo pipefail
TRELLIS=$1 DATA=$2
source "$(dirname "$0")/lib.sh"

model=$tmp/qwen3moe-q4_0.gguf
timeout "$(scaled 60)" "$TRELLIS" gen-model --shape moe-tiny --arch qwen3moe --type q4_0 -o "$model" >/dev/null 2>"$tmp/gen.err" \
  || die "gen-model: $(cat "$tmp/gen.err")"
start_server moe
say "the banner names the mixture"
grep -q "q4_0" "$tmp/moe.log" || die "banner: $(cat "$tmp/moe.log")"
ok "$(head -1 "$tmp/moe.log")"

sys="You are a concise assistant. Answer in one short sentence, never more, and do not repeat the question back to the user."
chat() { echo "{\"messages\":[{\"role\":\"system\",\"content\":\"$sys\"},{\"role\":\"user\",\"content\":\"$1\"}],\"max_tokens\":8,\"temperature\":0${2:-}}"; }
cached() { jget "$1" "j['usage']['prompt_tokens_details']['cached_tokens']"; }

say "chat twice with one system prompt: the second reuses it"
[[ $(post /v1/chat/completions "$(chat 'What is the capital of France?')" "$tmp/c1.json") == 200 ]] || die "chat: $(cat "$tmp/c1.json")"
[[ $(cached "$tmp/c1.json") == 0 ]] || die "first call cached: $(cat "$tmp/c1.json")"
[[ $(post /v1/chat/completions "$(chat 'And of Spain?')" "$tmp/c2.json") == 200 ]] || die "chat 2: $(cat "$tmp/c2.json")"
[[ $(cached "$tmp/c2.json") -gt 0 ]] || die "second call reused nothing: $(cat "$tmp/c2.json")"
ok "second call cached_tokens = $(cached "$tmp/c2.json") of $(jget "$tmp/c2.json" "j['usage']['prompt_tokens']")"

say "streamed: the same greedy text as the plain call"
curl -sN -m 30 "$base/v1/chat/completions" -d "$(chat 'And of Spain?' ',"stream":true')" >"$tmp/s.sse"
streamed=$(python3 - "$tmp/s.sse" <<'PY'
import json, sys
lines = [l[6:] for l in open(sys.argv[1]).read().splitlines() if l.startswith("data: ")]
assert lines[-1] == "[DONE]", lines[-1]
print(repr("".join(json.loads(l)["choices"][0]["delta"].get("content") or "" for l in lines[:-1] if json.loads(l)["choices"])))
PY
) || die "bad stream: $(head -c 2000 "$tmp/s.sse")"
plain=$(jget "$tmp/c2.json" "repr(j['choices'][0]['message']['content'])")
[[ $streamed == "$plain" ]] || die "streamed $streamed, plain $plain"
ok "both $plain"

say "the greedy completion equals trellis run's (which prints the prompt first)"
[[ $(post /v1/completions '{"prompt":"The keeper of the lighthouse","max_tokens":12,"temperature":0,"logprobs":1}' "$tmp/k.json") == 200 ]] ||
  die "completions: $(cat "$tmp/k.json")"
served=$(jget "$tmp/k.json" "repr(j['choices'][0]['text'])")
ran=$(timeout 60 "$TRELLIS" run -m "$model" -p "The keeper of the lighthouse" -n 12 --temp 0 -q 2>/dev/null | python3 -c 'import sys; t = sys.stdin.read().rstrip("\n"); p = "The keeper of the lighthouse"; assert t.startswith(p), t; print(repr(t[len(p):]))')
[[ $served == "$ran" ]] || die "served $served, run $ran"
ok "$served"
stop_server
echo "PASS server_moe: $n_checks checks"
