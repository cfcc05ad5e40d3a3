#!/usr/bin/env bash
# server_openai_node: the official `openai` npm package, driven by node, against
# `trellis serve` with an API key (node/client_test.mjs); the other dialects with their own
# clients, @anthropic-ai/sdk (Messages), ollama (Ollama's API) and openai's Responses API
# (node/dialects_test.mjs); openai with zod for structured output and tool calls
# (node/agent_test.mjs); the Vercel AI SDK and LangChain.js against
# a server with Qwen 2.5's template (node/frameworks_test.mjs). Installs the packages pinned
# by node/package-lock.json with `npm ci` into tests/server/node/node_modules (git-ignored)
# when it is missing. usage: serve_openai_node.sh TRELLIS DATA_DIR
set -euo pipefail
TRELLIS=$1 DATA=$2
source "$(dirname "$0")/lib.sh"
node_dir=$(cd "$(dirname "$0")/node" && pwd)

command -v node >/dev/null || die "node is not installed (scripts/setup.sh installs nodejs and npm)"
if [[ ! -f $node_dir/node_modules/openai/package.json || ! -f $node_dir/node_modules/zod/package.json ||
      ! -f $node_dir/node_modules/ai/package.json || ! -f $node_dir/node_modules/@langchain/openai/package.json ||
      ! -f $node_dir/node_modules/@anthropic-ai/sdk/package.json || ! -f $node_dir/node_modules/ollama/package.json ]]; then
  say "npm ci (openai client, zod, the Vercel AI SDK, LangChain.js, the Anthropic SDK, ollama)"
  (cd "$node_dir" && timeout 300 npm ci --no-audit --no-fund --loglevel=error) >"$tmp/npm.log" 2>&1 \
    || die "npm ci failed: $(tail -5 "$tmp/npm.log")"
  ok "openai $(node -p "require('$node_dir/node_modules/openai/package.json').version")"
fi

start_server node --api-key node-test-key
say "openai npm client: chat, completions, streaming, usage, errors"
(cd "$node_dir" && timeout 60 node client_test.mjs "$base" node-test-key tiny-q4_0) | tee "$tmp/node.out" \
  || die "node client test failed"
say "anthropic, ollama and openai-responses npm clients: messages, ollama's API, responses"
(cd "$node_dir" && timeout 120 node dialects_test.mjs "$base" node-test-key tiny-q4_0) | tee -a "$tmp/node.out" \
  || die "node dialects test failed (server log: $tmp/node.log)"
say "openai npm client + zod: zodResponseFormat, a zodFunction tool loop, a streamed call"
(cd "$node_dir" && timeout 300 node agent_test.mjs "$base" node-test-key tiny-q4_0) | tee -a "$tmp/node.out" \
  || die "node agent test failed (server log: $tmp/node.log)"
stop_server
start_server node-qwen --api-key node-test-key --chat-template "$DATA/templates/Qwen-Qwen2.5-7B-Instruct.jinja"
say "the same with Qwen 2.5's template (calls in <tool_call> blocks)"
(cd "$node_dir" && timeout 300 node agent_test.mjs "$base" node-test-key tiny-q4_0) | tee -a "$tmp/node.out" \
  || die "node agent test (hermes) failed (server log: $tmp/node-qwen.log)"
say "the Vercel AI SDK and LangChain.js, unchanged: structured output, tools over several steps, streaming"
(cd "$node_dir" && timeout 300 node frameworks_test.mjs "$base" node-test-key tiny-q4_0) | tee -a "$tmp/node.out" \
  || die "node frameworks test failed (server log: $tmp/node-qwen.log)"
stop_server
echo "PASS server_openai_node"
