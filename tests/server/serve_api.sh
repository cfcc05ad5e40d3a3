#!/usr/bin/env bash
# server_api: `trellis serve` on a tiny random model, driven with curl: health, models,
# chat and completions (streamed and not), usage and cached tokens, stop strings,
# logprobs, tokenize/detokenize, bad input as OpenAI-style 4xx, clean SIGTERM shutdown.
# usage: serve_api.sh TRELLIS DATA_DIR
set -euo pipefail
TRELLIS=$1 DATA=$2
source "$(dirname "$0")/lib.sh"

say "an unknown --chat-template is an error at start-up"
expect_fail "'vicuna' is neither a template name .*zephyr.* nor a readable file" -- "$TRELLIS" serve -m "$model" --port 0 --chat-template vicuna
say "a Jinja file the interpreter cannot handle fails at start-up with its line and the construct"
printf 'line one\n{%% for m in messages %%}{{ m.content | frobnicate }}{%% endfor %%}\n' >"$tmp/bad.jinja"
expect_fail "bad.jinja: chat template line 2: unsupported filter 'frobnicate'" -- "$TRELLIS" serve -m "$model" --port 0 --chat-template "$tmp/bad.jinja"
printf '{{ raise_exception("this template refuses everything") }}' >"$tmp/raise.jinja"
expect_fail "line 1: the template raised: this template refuses everything.*probe" -- "$TRELLIS" serve -m "$model" --port 0 --chat-template "$tmp/raise.jinja"

start_server api
say "the start-up line names the address and the template"
grep -q "template zephyr (default" "$tmp/api.log" || die "no template in: $(cat "$tmp/api.log")"
ok "$(head -1 "$tmp/api.log")"

say "GET /health and /v1/models"
curl -sf "$base/health" >"$tmp/h.json" && [[ $(jget "$tmp/h.json" "j['status']") == ok ]] || die "health: $(cat "$tmp/h.json")"
curl -sf "$base/v1/models" >"$tmp/m.json"
[[ $(jget "$tmp/m.json" "j['data'][0]['id']") == tiny-q4_0 ]] || die "models: $(cat "$tmp/m.json")"
ok "$(cat "$tmp/m.json")"

sys="You are a concise assistant. Answer in one short sentence, never more, and do not repeat the question back to the user."
chat() { echo "{\"model\":\"tiny-q4_0\",\"messages\":[{\"role\":\"system\",\"content\":\"$sys\"},{\"role\":\"user\",\"content\":\"$1\"}],\"max_tokens\":${2:-8}${3:-}}"; }

say "non-streamed chat: first call has cached_tokens 0, a second sharing the system prompt > 0"
[[ $(post /v1/chat/completions "$(chat 'What is the capital of France?')" "$tmp/c1.json") == 200 ]] || die "chat: $(cat "$tmp/c1.json")"
[[ $(jget "$tmp/c1.json" "j['object']") == chat.completion ]] || die "object: $(cat "$tmp/c1.json")"
[[ $(jget "$tmp/c1.json" "j['choices'][0]['message']['role']") == assistant ]] || die "role"
[[ $(jget "$tmp/c1.json" "j['choices'][0]['finish_reason'] in ('stop','length')") == True ]] || die "finish_reason"
u=$(jget "$tmp/c1.json" "(j['usage']['prompt_tokens'], j['usage']['completion_tokens'], j['usage']['total_tokens'], j['usage']['prompt_tokens_details']['cached_tokens'])")
[[ $(jget "$tmp/c1.json" "j['usage']['prompt_tokens_details']['cached_tokens']") == 0 ]] || die "first call cached: $u"
[[ $(jget "$tmp/c1.json" "j['usage']['total_tokens'] == j['usage']['prompt_tokens'] + j['usage']['completion_tokens'] and j['usage']['completion_tokens'] <= 8") == True ]] || die "usage: $u"
ok "usage (prompt, completion, total, cached) = $u"
[[ $(post /v1/chat/completions "$(chat 'And of Spain?')" "$tmp/c2.json") == 200 ]] || die "chat 2: $(cat "$tmp/c2.json")"
c2=$(jget "$tmp/c2.json" "j['usage']['prompt_tokens_details']['cached_tokens']")
[[ $c2 -gt 0 ]] || die "second call cached_tokens = $c2: $(cat "$tmp/c2.json")"
ok "second call cached_tokens = $c2 of $(jget "$tmp/c2.json" "j['usage']['prompt_tokens']")"

say "cache_salt (vLLM's): prefixes are shared only among requests with the same salt"
cached() { jget "$1" "j['usage']['prompt_tokens_details']['cached_tokens']"; }
[[ $(post /v1/chat/completions "$(chat 'And of Spain?' 8 ',"cache_salt":"tenant-a"')" "$tmp/s1.json") == 200 ]] || die "salted: $(cat "$tmp/s1.json")"
[[ $(cached "$tmp/s1.json") == 0 ]] || die "a new salt reused unsalted blocks: $(cat "$tmp/s1.json")"
[[ $(post /v1/chat/completions "$(chat 'And of Italy?' 8 ',"cache_salt":"tenant-b"')" "$tmp/s2.json") == 200 ]] || die "salted b"
[[ $(cached "$tmp/s2.json") == 0 ]] || die "tenant-b reused tenant-a's blocks: $(cat "$tmp/s2.json")"
[[ $(post /v1/chat/completions "$(chat 'And of Italy?' 8 ',"cache_salt":"tenant-a"')" "$tmp/s3.json") == 200 ]] || die "salted a again"
[[ $(cached "$tmp/s3.json") -gt 0 ]] || die "tenant-a did not reuse its own prefix: $(cat "$tmp/s3.json")"
ok "salt a: 0 cached, salt b: 0, salt a again: $(cached "$tmp/s3.json")"

say "repetition_penalty (vLLM's) is repeat_penalty over the whole sequence"
# A bias of +8 makes the "▁" token (29871, in the prompt) win every greedy step; a penalty
# of 5 on the tokens seen keeps it out.
rp() { post /v1/chat/completions "$(chat 'Say it again and again' 8 ",\"temperature\":0,\"logit_bias\":{\"29871\":8}$1")" "$2"; }
text() { jget "$1" "repr(j['choices'][0]['message']['content'])"; }
[[ $(rp ',"repetition_penalty":5' "$tmp/rp1.json") == 200 ]] || die "repetition_penalty: $(cat "$tmp/rp1.json")"
[[ $(rp ',"repeat_penalty":5,"repeat_last_n":-1' "$tmp/rp2.json") == 200 ]] || die "repeat_penalty: $(cat "$tmp/rp2.json")"
[[ $(rp '' "$tmp/rp0.json") == 200 ]] || die "no penalty: $(cat "$tmp/rp0.json")"
[[ $(jget "$tmp/rp0.json" "j['choices'][0]['message']['content'].strip() == ''") == True ]] \
  || die "the biased token did not win without a penalty: $(text "$tmp/rp0.json")"
[[ $(text "$tmp/rp1.json") == "$(text "$tmp/rp2.json")" ]] \
  || die "repetition_penalty $(text "$tmp/rp1.json") and repeat_penalty over the whole context $(text "$tmp/rp2.json") differ"
[[ $(jget "$tmp/rp1.json" "'  ' not in j['choices'][0]['message']['content']") == True ]] \
  || die "repetition_penalty 5 let the seen token repeat: $(text "$tmp/rp1.json")"
ok "without: $(text "$tmp/rp0.json"); with: $(text "$tmp/rp1.json"), as repeat_penalty with the whole sequence"

say "greedy, and sampling with a seed, are deterministic: the same request twice gives the same text"
# same_twice NAME BODY: both answers must be 200 with non-empty content before they are
# compared (two failed requests would otherwise compare equal: two empty strings).
same_twice() {
  local name=$1 body=$2 i code text
  for i in 1 2; do
    code=$(post /v1/chat/completions "$body" "$tmp/$name$i.json")
    [[ $code == 200 ]] || die "$name request $i -> $code: $(head -c 300 "$tmp/$name$i.json")"
    text=$(jget "$tmp/$name$i.json" "j['choices'][0]['message']['content']") || die "$name request $i: $(head -c 300 "$tmp/$name$i.json")"
    [[ -n $text ]] || die "$name request $i: empty content: $(head -c 300 "$tmp/$name$i.json")"
  done
  local a b
  a=$(jget "$tmp/${name}1.json" "j['choices'][0]['message']['content']")
  b=$(jget "$tmp/${name}2.json" "j['choices'][0]['message']['content']")
  [[ $a == "$b" ]] || die "$name differs: '$a' vs '$b'"
  ok "$name: the same ${#a} characters twice"
}
same_twice greedy "$(chat 'Say something.' 12 ',"temperature":0')"
same_twice seeded "$(chat 'Say something.' 12 ',"temperature":1,"seed":7')"

say "streamed chat: role chunk, content chunks, finish_reason, usage chunk, [DONE]"
curl -sN -m 30 "$base/v1/chat/completions" -d "$(chat 'Stream please.' 6 ',"stream":true,"stream_options":{"include_usage":true}')" >"$tmp/s.sse"
python3 - "$tmp/s.sse" <<'PY' || die "bad stream: $(head -c 2000 "$tmp/s.sse")"
import json, sys
lines = [l for l in open(sys.argv[1]).read().split("\n\n") if l.strip() and not l.startswith(":")]
assert all(l.startswith("data: ") for l in lines), lines
assert lines[-1] == "data: [DONE]", lines[-1]
ev = [json.loads(l[6:]) for l in lines[:-1]]
assert ev[0]["object"] == "chat.completion.chunk" and ev[0]["choices"][0]["delta"]["role"] == "assistant"
assert len({e["id"] for e in ev}) == 1
fin = [e for e in ev if e["choices"] and e["choices"][0]["finish_reason"]]
assert len(fin) == 1 and fin[0]["choices"][0]["finish_reason"] in ("stop", "length")
assert ev[-1]["choices"] == [] and ev[-1]["usage"]["completion_tokens"] <= 6
assert "cached_tokens" in ev[-1]["usage"]["prompt_tokens_details"]
assert all(e["usage"] is None for e in ev[:-1])
print("  ok   %d events, text %r, usage %s" % (len(ev), "".join(e["choices"][0]["delta"].get("content", "") for e in ev if e["choices"]), ev[-1]["usage"]))
PY

say "completions, non-streamed and streamed (no include_usage: no usage field)"
[[ $(post /v1/completions '{"prompt":"Once upon a time","max_tokens":5,"temperature":0}' "$tmp/p.json") == 200 ]] || die "completion: $(cat "$tmp/p.json")"
[[ $(jget "$tmp/p.json" "j['object']") == text_completion ]] || die "object"
[[ $(jget "$tmp/p.json" "j['usage']['completion_tokens']") == 5 && $(jget "$tmp/p.json" "j['choices'][0]['finish_reason']") == length ]] || die "usage: $(cat "$tmp/p.json")"
ptext=$(jget "$tmp/p.json" "j['choices'][0]['text']")
curl -sN -m 30 "$base/v1/completions" -d '{"prompt":"Once upon a time","max_tokens":5,"temperature":0,"stream":true}' >"$tmp/p.sse"
stext=$(python3 -c "
import json,sys
ev=[json.loads(l[6:]) for l in open(sys.argv[1]).read().split('\n\n') if l.startswith('data: {')]
assert all('usage' not in e for e in ev)
print(''.join(e['choices'][0]['text'] for e in ev))" "$tmp/p.sse") || die "bad completion stream: $(cat "$tmp/p.sse")"
[[ $stext == "$ptext" ]] || die "streamed '$stext' != non-streamed '$ptext'"
grep -q '^data: \[DONE\]$' "$tmp/p.sse" || die "no [DONE]"
ok "'$ptext' both ways; cached $(jget "$tmp/p.json" "j['usage']['prompt_tokens_details']['cached_tokens']")"

say "prompt as token ids, and a stop string cuts the text before it (greedy text known)"
[[ $(post /v1/completions '{"prompt":[1,450,7483],"max_tokens":16,"temperature":0}' "$tmp/t.json") == 200 ]] || die "token prompt: $(cat "$tmp/t.json")"
full=$(jget "$tmp/t.json" "j['choices'][0]['text']")
[[ ${#full} -ge 6 ]] || die "too little text to test stops: '$full'"
stop=${full:3:3}
python3 -c "import json,sys; print(json.dumps({'prompt':[1,450,7483],'max_tokens':16,'temperature':0,'stop':[sys.argv[1]]}))" "$stop" >"$tmp/stop.body"
[[ $(post /v1/completions "$(cat "$tmp/stop.body")" "$tmp/st.json") == 200 ]] || die "stop: $(cat "$tmp/st.json")"
cut=$(jget "$tmp/st.json" "j['choices'][0]['text']")
want=${full%%"$stop"*}
[[ $cut == "$want" && $(jget "$tmp/st.json" "j['choices'][0]['finish_reason']") == stop ]] || die "stop '$stop': got '$cut' want '$want'"
ok "full '$full', stop '$stop' -> '$cut' (finish stop)"

say "logprobs: chat top_logprobs and legacy completions logprobs"
post /v1/chat/completions "$(chat 'x' 3 ',"logprobs":true,"top_logprobs":3')" "$tmp/lp.json" >/dev/null
[[ $(jget "$tmp/lp.json" "len(j['choices'][0]['logprobs']['content']) == 3 and all(len(t['top_logprobs']) == 3 and t['logprob'] <= 0 and t['top_logprobs'][0]['logprob'] >= t['top_logprobs'][2]['logprob'] for t in j['choices'][0]['logprobs']['content'])") == True ]] \
  || die "chat logprobs: $(head -c 1500 "$tmp/lp.json")"
post /v1/completions '{"prompt":"Hi","max_tokens":2,"logprobs":2,"temperature":0}' "$tmp/lp2.json" >/dev/null
[[ $(jget "$tmp/lp2.json" "(lambda l: len(l['tokens']) == 2 and len(l['top_logprobs'][0]) == 2 and abs(l['token_logprobs'][0] - max(l['top_logprobs'][0].values())) < 1e-6)(j['choices'][0]['logprobs'])") == True ]] \
  || die "completion logprobs: $(cat "$tmp/lp2.json")"

say "logit_bias: banning the ids of the greedy reply changes it; object and array forms agree"
post /v1/completions '{"prompt":"Hi","max_tokens":4,"temperature":0}' "$tmp/lb0.json" >/dev/null
t0=$(jget "$tmp/lb0.json" "j['choices'][0]['text']")
curl -s "$base/tokenize" -d "$(python3 -c 'import json,sys; print(json.dumps({"content": sys.argv[1]}))' "$t0")" >"$tmp/lbt.json"
obj=$(jget "$tmp/lbt.json" "json.dumps({str(t): -100 for t in j['tokens']})")
arr=$(jget "$tmp/lbt.json" "json.dumps([[t, False] for t in j['tokens']])")
[[ $obj != "{}" ]] || die "'$t0' tokenizes to nothing"
[[ $(post /v1/completions "{\"prompt\":\"Hi\",\"max_tokens\":4,\"temperature\":0,\"logit_bias\":$obj}" "$tmp/lb1.json") == 200 ]] || die "$(cat "$tmp/lb1.json")"
[[ $(post /v1/completions "{\"prompt\":\"Hi\",\"max_tokens\":4,\"temperature\":0,\"logit_bias\":$arr}" "$tmp/lb2.json") == 200 ]] || die "$(cat "$tmp/lb2.json")"
t1=$(jget "$tmp/lb1.json" "j['choices'][0]['text']")
[[ "$t0" != "$t1" ]] || die "logit_bias $obj changed nothing: '$t0'"
[[ $(jget "$tmp/lb2.json" "j['choices'][0]['text']") == "$t1" ]] || die "the array form differs: $(cat "$tmp/lb1.json" "$tmp/lb2.json")"
ok "greedy '$t0' -> with $obj '$t1'"
ok "greedy token is the top entry"

say "tokenize / detokenize round trip"
post /tokenize '{"content":"Hello world","add_special":true,"with_pieces":false}' "$tmp/tk.json" >/dev/null
[[ $(jget "$tmp/tk.json" "j['tokens'][0]") == 1 ]] || die "no BOS: $(cat "$tmp/tk.json")"
ids=$(jget "$tmp/tk.json" "json.dumps(j['tokens'][1:])")
post /detokenize "{\"tokens\":$ids}" "$tmp/dt.json" >/dev/null
[[ $(jget "$tmp/dt.json" "j['content']") == "Hello world" ]] || die "detokenize: $(cat "$tmp/dt.json")"
ok "$ids"

say "bad input: 4xx with an OpenAI error body"
long=$(python3 -c "print('word ' * 2100)")
bad() {  # bad STATUS PARAM PATH BODY
  local code; code=$(post "$3" "$4" "$tmp/e.json")
  [[ $code == "$1" ]] || die "$3 $4 -> $code (want $1): $(head -c 300 "$tmp/e.json")"
  python3 -c "
import json,sys; e=json.load(open(sys.argv[1]))['error']
assert isinstance(e['message'], str) and e['message'] and 'type' in e and 'code' in e and 'param' in e
assert sys.argv[2] == '-' or e['param'] == sys.argv[2], e" "$tmp/e.json" "$2" || die "error body: $(cat "$tmp/e.json")"
  ok "$1 $(jget "$tmp/e.json" "j['error']['message']" | head -c 100)"
}
bad 400 - /v1/chat/completions '{"messages": [oops'
bad 400 - /v1/chat/completions '[]'
bad 400 messages /v1/chat/completions '{"messages":"hi"}'
bad 400 temperature /v1/chat/completions '{"messages":[{"role":"user","content":"x"}],"temperature":3}'
bad 400 top_p /v1/chat/completions '{"messages":[{"role":"user","content":"x"}],"top_p":0}'
bad 400 max_tokens /v1/chat/completions '{"messages":[{"role":"user","content":"x"}],"max_tokens":-1}'
bad 400 max_tokens /v1/chat/completions '{"messages":[{"role":"user","content":"x"}],"max_tokens":"8"}'
bad 400 n /v1/chat/completions '{"messages":[{"role":"user","content":"x"}],"n":3}'
bad 404 model /v1/chat/completions '{"model":"gpt-4o","messages":[{"role":"user","content":"x"}]}'
bad 400 prompt /v1/completions "{\"prompt\":\"$long\",\"max_tokens\":1}"
bad 400 prompt /v1/completions '{"prompt":[1,99999]}'
bad 404 - /v1/nothing '{}'

say "SIGTERM while a long stream runs: clean exit 0"
curl -sN -m 30 "$base/v1/completions" -d '{"prompt":"x","max_tokens":2000,"stream":true}' >/dev/null 2>&1 &
cpid=$!
sleep 0.3
stop_server
grep -q "stopped" "$tmp/api.log" || die "no shutdown line: $(cat "$tmp/api.log")"
wait "$cpid" || true
ok "$(tail -1 "$tmp/api.log")"

say "a Jinja template FILE (Gemma 2's) is run by the interpreter; its own rules apply"
start_server jinja --chat-template "$DATA/templates/google-gemma-2-2b-it.jinja"
grep -q "template jinja" "$tmp/jinja.log" || die "template not jinja: $(cat "$tmp/jinja.log")"
[[ $(post /v1/chat/completions '{"messages":[{"role":"user","content":"Hi"},{"role":"assistant","content":"Hello."},{"role":"user","content":"Bye"}],"max_tokens":2}' "$tmp/j1.json") == 200 ]] ||
  die "gemma chat: $(cat "$tmp/j1.json")"
ok "user/assistant/user: 200, prompt_tokens $(jget "$tmp/j1.json" "j['usage']['prompt_tokens']")"
code=$(post /v1/chat/completions '{"messages":[{"role":"system","content":"x"},{"role":"user","content":"Hi"}],"max_tokens":2}' "$tmp/j2.json")
[[ $code == 400 ]] && grep -q "System role not supported" "$tmp/j2.json" || die "system role: $code $(cat "$tmp/j2.json")"
ok "system role: 400 $(jget "$tmp/j2.json" "j['error']['message']")"
stop_server

echo "PASS server_api: $n_checks checks"
