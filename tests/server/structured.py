#!/usr/bin/env python3
"""structured.py BASE_URL: constrained output through `trellis serve`, checked by a real
JSON Schema validator (Debian's python3-jsonschema).

A random-weight model never writes valid JSON by itself, so every answer that validates
was made valid by the grammar: over schemas, seeds and temperatures, not one answer may
fail. Also json_object, GBNF, guided_choice, streaming, and the 400s.
"""
import json
import re
import sys
import time
import urllib.error
import urllib.request

import jsonschema

BASE = sys.argv[1]


def post(path, body, stream=False):
    req = urllib.request.Request(BASE + path, data=json.dumps(body).encode(), headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=120) as r:
            raw = r.read().decode()
            return r.status, raw
    except urllib.error.HTTPError as e:
        return e.code, e.read().decode()


def chat(extra, content="Answer in JSON.", stream=False):
    body = {"messages": [{"role": "user", "content": content}], "max_tokens": 600}
    body.update(extra)
    if stream:
        body["stream"] = True
    code, raw = post("/v1/chat/completions", body)
    if code != 200:
        raise SystemExit(f"FAIL: {code} {raw[:300]} for {json.dumps(extra)[:200]}")
    if not stream:
        j = json.loads(raw)
        return j["choices"][0]["message"]["content"], j["choices"][0]["finish_reason"]
    text, finish = "", None
    for line in raw.splitlines():
        if line.startswith("data: ") and line != "data: [DONE]":
            c = json.loads(line[6:])
            for ch in c.get("choices", []):
                text += ch.get("delta", {}).get("content") or ""
                finish = ch.get("finish_reason") or finish
    return text, finish


SCHEMAS = [
    {"type": "object", "properties": {"name": {"type": "string", "maxLength": 20}, "age": {"type": "integer"},
                                      "email": {"type": "string", "format": "email"}},
     "required": ["name", "age"], "additionalProperties": False},
    {"type": "object", "properties": {"items": {"type": "array", "minItems": 1, "maxItems": 4,
                                                "items": {"type": "object", "properties": {
                                                    "sku": {"type": "string", "format": "uuid"},
                                                    "qty": {"type": "integer"},
                                                    "kind": {"enum": ["book", "tool", "food"]}},
                                                    "required": ["sku", "qty", "kind"], "additionalProperties": False}}},
     "required": ["items"], "additionalProperties": False},
    {"$defs": {"node": {"type": "object", "properties": {"v": {"type": "number"},
                                                         "kids": {"type": "array", "maxItems": 2, "items": {"$ref": "#/$defs/node"}}},
                        "required": ["v"], "additionalProperties": False}},
     "anyOf": [{"$ref": "#/$defs/node"}, {"type": "null"}]},
    {"type": "object", "properties": {"when": {"type": "string", "format": "date-time"},
                                      "ok": {"type": "boolean"}, "tags": {"type": "array", "items": {"type": "string", "maxLength": 8}, "maxItems": 3}},
     "required": ["when", "ok"], "additionalProperties": False},
]

n = 0
for si, schema in enumerate(SCHEMAS):
    for seed in range(4):
        temp = [0.0, 0.7, 1.0, 1.5][seed]
        rf = {"type": "json_schema", "json_schema": {"name": f"s{si}", "strict": True, "schema": schema}}
        text, finish = chat({"response_format": rf, "seed": seed, "temperature": temp, "top_k": 0, "top_p": 1.0,
                             "min_p": 0.0}, stream=(seed == 3))
        if finish != "stop":
            raise SystemExit(f"FAIL: schema {si} seed {seed}: finish_reason {finish}: {text[:300]!r}")
        try:
            doc = json.loads(text)
            jsonschema.validate(doc, schema, format_checker=jsonschema.FormatChecker())
        except Exception as e:  # noqa: BLE001 - the message is the failure
            raise SystemExit(f"FAIL: schema {si} seed {seed} temp {temp}: {e}\n{text!r}")
        n += 1
print(f"ok: {n} answers over {len(SCHEMAS)} schemas, 4 seeds/temperatures (one streamed), all valid")

# json_object leaves strings open-ended, which a random model rarely closes: the tokens
# '"' and '}' get a logit bias so that answers end within max_tokens (the bias makes
# closing likely, only the grammar makes the answer valid).
code, raw = post("/tokenize", {"content": '"}'})
bias = {str(t): 6 for t in json.loads(raw)["tokens"]}
for seed in range(3):
    text, finish = chat({"response_format": {"type": "json_object"}, "seed": seed, "temperature": 1.0,
                         "logit_bias": bias})
    if finish != "stop" or not isinstance(json.loads(text), dict):
        raise SystemExit(f"FAIL: json_object gave {text!r} ({finish})")
for seed in range(3):
    for field in ({"grammar": 'root ::= "answer: " [0-9]{1,3} ("." [0-9])?'},
                  {"guided_choice": ["yes", "no", "maybe later"]},
                  {"json_schema": {"type": "array", "items": {"type": "integer"}, "maxItems": 5}}):
        text, finish = chat(dict(field, seed=seed, temperature=1.0))
        if "grammar" in field:
            good = re.fullmatch(r"answer: [0-9]{1,3}(\.[0-9])?", text)
        elif "guided_choice" in field:
            good = text in field["guided_choice"]
        else:
            doc = json.loads(text)
            good = isinstance(doc, list) and len(doc) <= 5 and all(isinstance(x, int) for x in doc)
        if not good or finish != "stop":
            raise SystemExit(f"FAIL: {field} gave {text!r} ({finish})")
print("ok: json_object, GBNF, guided_choice and llama.cpp's json_schema")

# Regular expressions: the whole answer matches (checked by Python's re, whose syntax
# agrees with ECMAScript's on these); a schema's pattern matches the decoded string (anchored
# here: unanchored, the rest of the string is free text a random model never closes).
for seed in range(4):
    for field, pattern in (({"guided_regex": r"\d{3}-[a-z]{2,4}( [A-Z]\w{0,5})?"}, r"\d{3}-[a-z]{2,4}( [A-Z]\w{0,5})?"),
                           ({"regex": r"(yes|no|\\\"quoted\"){1,3}\."}, r"(yes|no|\\\"quoted\"){1,3}\."),
                           ({"structured_outputs": {"regex": r"[^ ]{1,6}"}}, r"[^ ]{1,6}")):
        text, finish = chat(dict(field, seed=seed, temperature=1.0))
        if not re.fullmatch(pattern, text) or finish != "stop":
            raise SystemExit(f"FAIL: {field} gave {text!r} ({finish})")
    schema = {"type": "object", "properties": {"code": {"type": "string", "pattern": "^[A-Z]{2}-\\d{2,4}$"},
                                               "note": {"type": "string", "pattern": "^(\"q\"|\\\\)$"}},
              "required": ["code", "note"], "additionalProperties": False}
    text, finish = chat({"json_schema": schema, "seed": seed, "temperature": 1.0})
    doc = json.loads(text)
    jsonschema.validate(doc, schema)
    if finish != "stop":
        raise SystemExit(f"FAIL: pattern schema gave {text!r} ({finish})")
print("ok: guided_regex, regex, structured_outputs.regex and schema patterns, every answer matching")

# Every constrained token was sampled under a mask, and /metrics counts them.
def metric(name):
    with urllib.request.urlopen(BASE + "/metrics", timeout=30) as r:
        for line in r.read().decode().splitlines():
            if line.startswith(name + " "):
                return float(line.split()[1])
    raise SystemExit(f"FAIL: /metrics has no {name}")


masks0, secs0 = metric("trellis_grammar_masks_total"), metric("trellis_grammar_mask_seconds_total")
code, raw = post("/v1/chat/completions", {"messages": [{"role": "user", "content": "JSON"}], "max_tokens": 300,
                                          "seed": 5, "temperature": 1.0, "json_schema": SCHEMAS[1]})
usage = json.loads(raw)["usage"]
# /metrics is a snapshot the engine refreshes: wait (bounded) for it to hold this answer.
for _ in range(100):
    masks = metric("trellis_grammar_masks_total") - masks0
    if masks >= usage["completion_tokens"]:
        break
    time.sleep(0.05)
if masks not in (usage["completion_tokens"], usage["completion_tokens"] + 1) or \
        metric("trellis_grammar_mask_seconds_total") <= secs0:
    raise SystemExit(f"FAIL: {masks} masks counted for {usage['completion_tokens']} constrained tokens")
print(f"ok: /metrics counted {masks:.0f} masks for {usage['completion_tokens']} constrained tokens")

# Completions take the same fields; the cache still serves the shared prompt.
code, raw = post("/v1/completions", {"prompt": "JSON:", "max_tokens": 200, "json_schema": {"type": "boolean"}})
assert code == 200 and json.loads(raw)["choices"][0]["text"] in ("true", "false"), raw

for bad, param in (({"json_schema": {"type": "string", "pattern": "(?!a)"}}, "json_schema"),
                   ({"grammar": "root ::= undefined-rule"}, "grammar"),
                   ({"guided_regex": "(a)\\1"}, "guided_regex"),
                   ({"grammar": 'root ::= "a"', "json_schema": {}}, "grammar"),
                   ({"chat_template_kwargs": {"enable_thinking": False}}, "chat_template_kwargs"),
                   ({"mirostat": 2}, "mirostat")):
    body = {"messages": [{"role": "user", "content": "x"}]}
    body.update(bad)
    code, raw = post("/v1/chat/completions", body)
    err = json.loads(raw).get("error", {})
    if code != 400 or err.get("param") != param:
        raise SystemExit(f"FAIL: {bad} -> {code} {raw[:200]}")
print("ok: unsupported schemas, bad grammars, unsupported regex and unimplemented fields are 400 naming the field")

# ignore_eos + n_predict: exactly n tokens.
code, raw = post("/v1/completions", {"prompt": "x", "n_predict": 24, "ignore_eos": True, "temperature": 1.0})
j = json.loads(raw)
assert code == 200 and j["usage"]["completion_tokens"] == 24 and j["choices"][0]["finish_reason"] == "length", raw
print("ok: n_predict with ignore_eos gives exactly 24 tokens")
