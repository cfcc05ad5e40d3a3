#!/usr/bin/env bash
# server_structured: constrained output (response_format, grammar, json_schema,
# guided_choice, ...) against a random model, every answer validated by python3-jsonschema
# (tests/server/structured.py).
# usage: serve_structured.sh TRELLIS DATA_DIR
set -euo pipefail
TRELLIS=$1 DATA=$2
source "$(dirname "$0")/lib.sh"

say "structured output validates against its schema on every seed and temperature"
start_server structured --ctx-size 2048
python3 "$(dirname "$0")/structured.py" "$base" || die "structured.py failed (server log: $tmp/structured.log)"
stop_server

# Tool calls in each family's syntax: the embedded model's template renders no tools
# (the generic syntax, written into the prompt), then real templates with their own.
say "tool calls are valid for their tools' schemas, in every family's syntax"
for spec in generic: hermes:Qwen-Qwen2.5-7B-Instruct llama3:meta-llama-Llama-3.1-8B-Instruct \
            mistral:mistralai-Mistral-Nemo-Instruct-2407 phi4:microsoft-Phi-4-mini-instruct; do
  fmt=${spec%%:*} file=${spec#*:}
  start_server "tools-$fmt" --ctx-size 2048 ${file:+--chat-template "$DATA/templates/$file.jinja"}
  grep -q "tool calls $fmt " "$tmp/tools-$fmt.log" || die "the server took another syntax than $fmt: $(head -3 "$tmp/tools-$fmt.log")"
  python3 "$(dirname "$0")/tools.py" "$base" "$fmt" || die "tools.py $fmt failed (server log: $tmp/tools-$fmt.log)"
  stop_server
done
ok "tool calls in five syntaxes"

say "chat_template_kwargs reach a real template (SmolLM3's); <think> blocks go to reasoning_content"
start_server reasoning --ctx-size 2048 --chat-template "$DATA/templates/HuggingFaceTB-SmolLM3-3B.jinja"
python3 "$(dirname "$0")/reasoning.py" "$base" "$DATA/templates/HuggingFaceTB-SmolLM3-3B.jinja" \
  || die "reasoning.py failed (server log: $tmp/reasoning.log)"
stop_server
start_server no-split --ctx-size 2048 --chat-template "$DATA/templates/HuggingFaceTB-SmolLM3-3B.jinja" --reasoning-format none
code=$(post /v1/chat/completions '{"messages":[{"role":"user","content":"x"}],"max_tokens":60,"grammar":"root ::= \"<think>\" [a-z]{1,5} \"</think>\" [a-z]{1,5}"}' "$tmp/none.json")
[[ $code == 200 ]] || die "reasoning-format none: $code $(cat "$tmp/none.json")"
[[ $(jget "$tmp/none.json" "j['choices'][0]['message']['content'].startswith('<think>') and 'reasoning_content' not in j['choices'][0]['message']") == True ]] \
  || die "reasoning-format none split the block: $(cat "$tmp/none.json")"
ok "--reasoning-format none leaves the block in content"
code=$(post /v1/chat/completions '{"messages":[{"role":"user","content":"x"}],"max_tokens":60,"reasoning_format":"deepseek","grammar":"root ::= \"<think>\" [a-z]{1,5} \"</think>\" [a-z]{1,5}"}' "$tmp/per-request.json")
[[ $code == 200 ]] || die "reasoning_format deepseek per request: $code $(cat "$tmp/per-request.json")"
[[ $(jget "$tmp/per-request.json" "len(j['choices'][0]['message'].get('reasoning_content') or '') > 0 and '<think>' not in j['choices'][0]['message']['content']") == True ]] \
  || die "a request's reasoning_format deepseek did not split the block: $(cat "$tmp/per-request.json")"
ok "a request's reasoning_format overrides the server's"
stop_server
ok "server_structured"
