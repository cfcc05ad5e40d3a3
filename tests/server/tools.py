#!/usr/bin/env python3
"""tools.py BASE_URL FORMAT: tool calling through `trellis serve` on a random model.

A random-weight model never writes a valid call by itself, so every call that parses and
validates was made so by the grammar: with tool_choice required or a named function, over
seeds and temperatures, streamed and not, every answer must be calls of the offered tools
whose arguments validate (python3-jsonschema) against the tool's schema. Then auto, a
tool loop (history with calls and results) whose second turn reuses the first's prefix,
and the 400s. FORMAT is what the server's template makes of calls (for the log).
"""
import json
import re
import sys
import urllib.error
import urllib.request

import jsonschema

BASE, FORMAT = sys.argv[1], sys.argv[2]

WEATHER = {"type": "function", "function": {
    "name": "get_weather", "description": "Current weather in a city.",
    "parameters": {"type": "object", "properties": {
        "city": {"type": "string", "maxLength": 24},
        "unit": {"enum": ["celsius", "fahrenheit"]},
        "days": {"type": "integer"}},
        "required": ["city", "unit"], "additionalProperties": False}}}
SEARCH = {"type": "function", "function": {
    "name": "search_docs", "description": "Search the docs.",
    "parameters": {"type": "object", "properties": {
        "query": {"type": "string", "maxLength": 30},
        "filters": {"type": "array", "maxItems": 3, "items": {"type": "object", "properties": {
            "field": {"enum": ["title", "body"]}, "value": {"type": "string", "maxLength": 10}},
            "required": ["field", "value"], "additionalProperties": False}}},
        "required": ["query"], "additionalProperties": False}}}
NOW = {"type": "function", "function": {"name": "now", "description": "The time."}}
TOOLS = [WEATHER, SEARCH, NOW]
SCHEMAS = {t["function"]["name"]: t["function"].get("parameters", {"type": "object", "additionalProperties": False})
           for t in TOOLS}


def post(body):
    req = urllib.request.Request(BASE + "/v1/chat/completions", data=json.dumps(body).encode(),
                                 headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=300) as r:
            return r.status, r.read().decode()
    except urllib.error.HTTPError as e:
        return e.code, e.read().decode()


def ask(extra, messages=None, stream=False):
    body = {"messages": messages or [{"role": "user", "content": "What's the weather in Oslo?"}],
            "tools": TOOLS, "max_tokens": 400}
    body.update(extra)
    if stream:
        body["stream"] = True
    code, raw = post(body)
    if code != 200:
        raise SystemExit(f"FAIL: {code} {raw[:300]} for {json.dumps(extra)[:200]}")
    if not stream:
        j = json.loads(raw)
        return j["choices"][0]["message"], j["choices"][0]["finish_reason"], j["usage"]
    # Assemble the deltas as an OpenAI client does: by index, arguments concatenated.
    msg, finish, usage = {"content": None, "tool_calls": []}, None, None
    for line in raw.splitlines():
        if not line.startswith("data: ") or line == "data: [DONE]":
            continue
        c = json.loads(line[6:])
        usage = c.get("usage") or usage
        for ch in c.get("choices", []):
            d = ch.get("delta", {})
            if d.get("content"):
                msg["content"] = (msg["content"] or "") + d["content"]
            for tc in d.get("tool_calls", []):
                while len(msg["tool_calls"]) <= tc["index"]:
                    msg["tool_calls"].append({"id": None, "type": "function", "function": {"name": "", "arguments": ""}})
                t = msg["tool_calls"][tc["index"]]
                t["id"] = tc.get("id") or t["id"]
                t["function"]["name"] += tc.get("function", {}).get("name", "")
                t["function"]["arguments"] += tc.get("function", {}).get("arguments", "")
            finish = ch.get("finish_reason") or finish
    if not msg["tool_calls"]:
        del msg["tool_calls"]
    return msg, finish, usage


def check_calls(msg, finish, allowed, what, single=False):
    calls = msg.get("tool_calls")
    if not calls or finish != "tool_calls":
        raise SystemExit(f"FAIL: {what}: no calls (finish {finish}): {json.dumps(msg)[:400]}")
    if single and len(calls) != 1:
        raise SystemExit(f"FAIL: {what}: {len(calls)} calls without parallel_tool_calls")
    for c in calls:
        good_id = re.fullmatch(r"[A-Za-z0-9]{9}" if FORMAT == "mistral" else r"call_[A-Za-z0-9]{24}", c["id"] or "")
        if not good_id or c["type"] != "function":
            raise SystemExit(f"FAIL: {what}: bad call envelope {c}")
        name = c["function"]["name"]
        if name not in allowed:
            raise SystemExit(f"FAIL: {what}: called {name!r}, allowed {allowed}")
        args = json.loads(c["function"]["arguments"])
        try:
            jsonschema.validate(args, SCHEMAS[name])
        except jsonschema.ValidationError as e:
            raise SystemExit(f"FAIL: {what}: arguments {args} invalid for {name}: {e.message}")
    if len({c["id"] for c in calls}) != len(calls):
        raise SystemExit(f"FAIL: {what}: repeated call ids")
    return calls


sampling = lambda seed, temp: {"seed": seed, "temperature": temp, "top_k": 0, "top_p": 1.0, "min_p": 0.0}
n = 0
for seed in range(6):
    temp = [0.0, 0.6, 1.0, 1.3, 0.9, 1.5][seed]
    # Greedy on random weights may repeat ", {call}" until max_tokens (a forced answer may
    # hold any number of calls): parallel calls are asked for where the draw is random.
    msg, finish, _ = ask({"tool_choice": "required", "parallel_tool_calls": temp > 0, **sampling(seed, temp)},
                         stream=seed % 2 == 1)
    check_calls(msg, finish, SCHEMAS.keys(), f"required seed {seed} temp {temp}")
    n += 1
    msg, finish, _ = ask({"tool_choice": {"type": "function", "function": {"name": "search_docs"}},
                          "parallel_tool_calls": False, **sampling(seed, temp)}, stream=seed % 3 == 0)
    check_calls(msg, finish, ["search_docs"], f"named seed {seed} temp {temp}", single=True)
    n += 1
print(f"ok: {n} forced answers ({FORMAT}), every call valid for its tool's schema")

# auto: text or calls; whatever calls come, they are valid.
# The definitions reach the prompt, however the template takes them (the tools variable,
# the system message's own field, or written in by the server): a prompt with the tools
# holds at least their names' and descriptions' tokens more than one without.
code, raw = post({"messages": [{"role": "user", "content": "Hi"}], "max_tokens": 1})
bare = json.loads(raw)["usage"]["prompt_tokens"]
code, raw = post({"messages": [{"role": "user", "content": "Hi"}], "max_tokens": 1, "tools": TOOLS, "tool_choice": "none"})
with_tools = json.loads(raw)["usage"]["prompt_tokens"]
if with_tools < bare + 40:
    raise SystemExit(f"FAIL: the tools did not reach the prompt: {bare} tokens without, {with_tools} with")
print(f"ok: the tool definitions reach the prompt ({bare} -> {with_tools} tokens)")

calls = 0
for seed in range(4):
    msg, finish, _ = ask({"tool_choice": "auto", **sampling(seed, 1.0)}, stream=seed == 2)
    if msg.get("tool_calls"):
        check_calls(msg, finish, SCHEMAS.keys(), f"auto seed {seed}")
        calls += 1
    elif finish not in ("stop", "length"):
        raise SystemExit(f"FAIL: auto seed {seed}: finish {finish}")
print(f"ok: auto, {calls} of 4 answers were calls, all valid")
if FORMAT in ("generic", "llama3"):
    # Where the call is the whole answer, a '{' first makes it one: push the model there.
    req = urllib.request.Request(BASE + "/tokenize", data=json.dumps({"content": "{"}).encode(),
                                 headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=60) as r:
        brace = json.loads(r.read())["tokens"][-1]
    for seed in range(3):
        msg, finish, _ = ask({"tool_choice": "auto", "logit_bias": {str(brace): 100}, **sampling(seed, 1.0)},
                             stream=seed == 1)
        check_calls(msg, finish, SCHEMAS.keys(), f"auto pushed to a call, seed {seed}")
    print("ok: auto answers that open a call are held to valid calls")

# A tool loop: the call and its result go back; the second turn reuses the first's prompt.
first = [{"role": "system", "content": "You answer with tools. " * 40},
         {"role": "user", "content": "What's the weather in Oslo?"}]
msg, finish, usage1 = ask({"tool_choice": "required", "parallel_tool_calls": False, **sampling(7, 0.0)}, first)
calls = check_calls(msg, finish, SCHEMAS.keys(), "loop turn 1", single=True)
second = first + [{"role": "assistant", "content": None, "tool_calls": calls},
                  {"role": "tool", "tool_call_id": calls[0]["id"], "content": json.dumps({"temp": 3, "sky": "snow"})}]
msg, finish, usage2 = ask({"tool_choice": "none", "max_tokens": 8, **sampling(7, 0.0)}, second)
if "tool_calls" in msg or finish not in ("stop", "length"):
    raise SystemExit(f"FAIL: tool_choice none made calls: {msg}")
cached = usage2.get("prompt_tokens_details", {}).get("cached_tokens", 0)
if cached < usage1["prompt_tokens"] // 2:
    raise SystemExit(f"FAIL: turn 2 reused {cached} tokens of turn 1's {usage1['prompt_tokens']}: {usage2}")
print(f"ok: tool loop; turn 2 reused {cached} of {usage2['prompt_tokens']} prompt tokens")

# The 400s.
for extra, param in [({"tool_choice": {"type": "function", "function": {"name": "nope"}}}, "tool_choice"),
                     ({"tools": [{"type": "function", "function": {"name": "bad name"}}]}, "tools[0].function.name"),
                     ({"tools": [], "tool_choice": "required"}, "tool_choice"),
                     ({"tool_choice": "required", "ignore_eos": True}, "ignore_eos")]:
    body = {"messages": [{"role": "user", "content": "x"}], "tools": TOOLS}
    body.update(extra)
    code, raw = post(body)
    if code != 400 or json.loads(raw)["error"]["param"] != param:
        raise SystemExit(f"FAIL: {extra}: {code} {raw[:200]}")
print("ok: bad tool requests are 400 naming the field")
