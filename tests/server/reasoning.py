#!/usr/bin/env python3
"""reasoning.py BASE_URL TEMPLATE: chat_template_kwargs and reasoning through `trellis serve`
started with --chat-template TEMPLATE (SmolLM3's real template, which writes <think>
blocks and reads enable_thinking).

- chat_template_kwargs reach the template: the prompt the server counts equals the token
  count of what jinja2 renders with the same kwargs (and differs without them).
- A <think> block in the answer is split into reasoning_content (streamed: delta
  reasoning_content), the rest into content. A random model never writes one itself, so a
  GBNF grammar makes it: the split is then checked against the grammar's known shape.
"""
import json

import jsonschema
import re
import sys
import urllib.error
import urllib.request

import jinja2

BASE, TEMPLATE = sys.argv[1], sys.argv[2]


def post(path, body):
    req = urllib.request.Request(BASE + path, data=json.dumps(body).encode(), headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=120) as r:
            return r.status, r.read().decode()
    except urllib.error.HTTPError as e:
        return e.code, e.read().decode()


msgs = [{"role": "user", "content": "What is 2+2?"}]
env = jinja2.Environment(trim_blocks=True, lstrip_blocks=True)
tmpl = env.from_string(open(TEMPLATE).read())
wants = {}
for kwargs in ({}, {"enable_thinking": False}):
    text = tmpl.render(messages=msgs, tools=None, add_generation_prompt=True, bos_token="<s>", eos_token="</s>", **kwargs)
    code, raw = post("/tokenize", {"content": text, "add_special": True})
    want = len(json.loads(raw)["tokens"])
    body = {"messages": msgs, "max_tokens": 1}
    if kwargs:
        body["chat_template_kwargs"] = kwargs
    code, raw = post("/v1/chat/completions", body)
    assert code == 200, raw
    got = json.loads(raw)["usage"]["prompt_tokens"]
    wants[bool(kwargs)] = want
    if got != want:
        raise SystemExit(f"FAIL: kwargs {kwargs}: the server's prompt has {got} tokens, jinja2's {want}")
    print(f"ok: kwargs {kwargs or '{}'}: {got} prompt tokens, as jinja2 renders")

# Anthropic's thinking disabled reaches a thinking template as enable_thinking false.
code, raw = post("/v1/messages/count_tokens", {"messages": msgs, "thinking": {"type": "disabled"}})
assert code == 200 and json.loads(raw)["input_tokens"] == wants[True], (raw, wants)
code, raw = post("/v1/messages", {"messages": msgs, "max_tokens": 1, "thinking": {"type": "disabled"}})
u = json.loads(raw)["usage"]
assert code == 200 and u["input_tokens"] + u["cache_read_input_tokens"] == wants[True], (raw, wants)
code, raw = post("/v1/messages/count_tokens", {"messages": msgs})
assert code == 200 and json.loads(raw)["input_tokens"] == wants[False], (raw, wants)
print(f"ok: anthropic thinking disabled: {wants[True]} prompt tokens, as jinja2 renders with enable_thinking false")

grammar = 'root ::= "<think>" [a-z ]{1,30} "</think>" "\\n\\n"? [a-z ]{1,30}'
for stream in (False, True):
    body = {"messages": msgs, "max_tokens": 200, "grammar": grammar, "temperature": 1.0, "seed": 7}
    if stream:
        body["stream"] = True
    code, raw = post("/v1/chat/completions", body)
    assert code == 200, raw
    if stream:
        reasoning, content = "", ""
        for line in raw.splitlines():
            if line.startswith("data: ") and line != "data: [DONE]":
                for ch in json.loads(line[6:]).get("choices", []):
                    reasoning += ch.get("delta", {}).get("reasoning_content") or ""
                    content += ch.get("delta", {}).get("content") or ""
    else:
        m = json.loads(raw)["choices"][0]["message"]
        reasoning, content = m.get("reasoning_content", ""), m["content"]
    if not re.fullmatch(r"[a-z ]{1,30}", reasoning) or not re.fullmatch(r"[a-z ]{0,30}", content) or "<think>" in content:
        raise SystemExit(f"FAIL: stream={stream}: reasoning {reasoning!r}, content {content!r}")
    print(f"ok: stream={stream}: reasoning {reasoning!r} apart from content {content!r}")

# The reasoning switches of the other servers' clients, per request: llama-server's
# reasoning_format none and SGLang's separate_reasoning false leave the block in content;
# vLLM's include_reasoning false splits it off and drops it. Same seed, same grammar: the
# same tokens, so the three answers are the one above, arranged differently.
base = {"messages": msgs, "max_tokens": 200, "grammar": grammar, "temperature": 1.0, "seed": 7}
code, raw = post("/v1/chat/completions", base)
m = json.loads(raw)["choices"][0]["message"]
split_reasoning, split_content = m.get("reasoning_content", ""), m["content"]
for extra in ({"reasoning_format": "none"}, {"separate_reasoning": False}):
    code, raw = post("/v1/chat/completions", {**base, **extra})
    assert code == 200, raw
    m = json.loads(raw)["choices"][0]["message"]
    if m.get("reasoning_content") or not m["content"].startswith("<think>" + split_reasoning + "</think>"):
        raise SystemExit(f"FAIL: {extra}: the block should stay in content: {m}")
    print(f"ok: {extra}: the block stays in content")
for stream in (False, True):
    code, raw = post("/v1/chat/completions", {**base, "include_reasoning": False, **({"stream": True} if stream else {})})
    assert code == 200, raw
    if stream:
        content = ""
        for line in raw.splitlines():
            if line.startswith("data: ") and line != "data: [DONE]":
                for ch in json.loads(line[6:]).get("choices", []):
                    if ch.get("delta", {}).get("reasoning_content"):
                        raise SystemExit(f"FAIL: include_reasoning false streamed reasoning: {line}")
                    content += ch.get("delta", {}).get("content") or ""
    else:
        m = json.loads(raw)["choices"][0]["message"]
        if m.get("reasoning_content"):
            raise SystemExit(f"FAIL: include_reasoning false, yet reasoning: {m}")
        content = m["content"]
    if content != split_content:
        raise SystemExit(f"FAIL: include_reasoning false: content {content!r}, want {split_content!r}")
    print(f"ok: include_reasoning false (stream={stream}): reasoning dropped, content kept")

# A schema with thinking off: the answer validates at once; with it on, the grammar lets
# the model reason first (a random model seldom closes the block, so only the split's
# shape is checked there).
schema = {"type": "object", "properties": {"sum": {"type": "integer"}, "why": {"enum": ["math", "guess"]}},
          "required": ["sum", "why"], "additionalProperties": False}
rf = {"type": "json_schema", "json_schema": {"name": "s", "schema": schema}}
for seed in range(3):
    code, raw = post("/v1/chat/completions", {"messages": msgs, "max_tokens": 200, "response_format": rf, "seed": seed,
                                              "temperature": 1.0, "chat_template_kwargs": {"enable_thinking": False}})
    assert code == 200, raw
    m = json.loads(raw)["choices"][0]
    jsonschema.validate(json.loads(m["message"]["content"]), schema)
    if m["message"].get("reasoning_content"):
        raise SystemExit(f"FAIL: thinking off, yet reasoning: {m}")
print("ok: json_schema with thinking off: every answer validates")

code, raw = post("/v1/chat/completions", {"messages": msgs, "max_tokens": 1, "chat_template_kwargs": {"messages": []}})
assert code == 400 and json.loads(raw)["error"]["param"] == "chat_template_kwargs.messages", raw
print("ok: kwargs may not replace the template's own variables")
