#!/usr/bin/env python3
"""Renders the tool-calling templates of tests/data/templates with jinja2 as Hugging Face's
apply_chat_template does (see render_chat_templates.py), for conversations with tools,
assistant tool calls and tool results, and writes tests/data/templates/golden_tools.json.

Each conversation is kept twice: as the request body an OpenAI client sends (tool-call
arguments as JSON strings), and rendered from what a template is given after
vLLM's and llama.cpp's conversion (arguments parsed into objects, key order kept). The C++
test (chat_template_test.cc) parses the request with the server's API reader and renders
it with the interpreter: the prompt must equal jinja2's. Not part of the build; needs
python3-jinja2.
"""
import copy
import json
import os
import sys

from render_chat_templates import HERE, TOKENS, raise_exception, tojson

import jinja2
from jinja2.ext import loopcontrols
from jinja2.sandbox import ImmutableSandboxedEnvironment

# Key order deliberately not alphabetical: templates write tools back with tojson, and HF
# keeps the order the client gave.
WEATHER = {"type": "function", "function": {
    "name": "get_weather", "description": "The weather now in a city.",
    "parameters": {"type": "object", "properties": {
        "location": {"type": "string", "description": "City name, e.g. Paris"},
        "unit": {"enum": ["celsius", "fahrenheit"], "type": "string"}},
        "required": ["location"]}}}
SEARCH = {"type": "function", "function": {
    "name": "search_docs", "parameters": {"properties": {
        "query": {"type": "string"}, "max_results": {"type": "integer", "minimum": 1}},
        "type": "object", "required": ["query", "max_results"], "additionalProperties": False},
    "description": "Search the documentation \u2014 caf\u00e9 \"quoted\"."}}

SYS = {"role": "system", "content": "You are a helpful assistant."}
USER = {"role": "user", "content": "What's the weather in Paris, and find docs on 'ssd cache'?"}
CALL1 = {"id": "call00001", "type": "function",
         "function": {"name": "get_weather", "arguments": "{\"location\": \"Paris\", \"unit\": \"celsius\"}"}}
CALL2 = {"id": "call00002", "type": "function",
         "function": {"name": "search_docs", "arguments": "{\"query\": \"ssd cache\", \"max_results\": 3}"}}
ASSIST1 = {"role": "assistant", "content": None, "tool_calls": [CALL1]}
ASSIST2 = {"role": "assistant", "content": None, "tool_calls": [CALL1, CALL2]}
RESULT1 = {"role": "tool", "tool_call_id": "call00001", "content": "{\"temperature\": 18, \"sky\": \"clear\"}"}
RESULT2 = {"role": "tool", "tool_call_id": "call00002", "content": "1. SSD tier\n2. GDSF eviction"}
DONE = {"role": "assistant", "content": "It is 18 \u00b0C and clear in Paris."}
# An answer after reasoning, as a client sends it back (vLLM's and llama.cpp's field name).
THOUGHT = {"role": "assistant", "content": "It is 18 \u00b0C.", "reasoning_content": "The tool said 18."}
THOUGHT_CALL = {"role": "assistant", "content": None, "reasoning_content": "I need the weather.",
                "tool_calls": [CALL1]}
USER2 = {"role": "user", "content": "Thanks. And in Lyon?"}

REQUESTS = {
    "tools_system_user": {"messages": [SYS, USER], "tools": [WEATHER, SEARCH]},
    "tools_user": {"messages": [USER], "tools": [WEATHER, SEARCH]},
    "tool_loop": {"messages": [SYS, USER, ASSIST1, RESULT1], "tools": [WEATHER, SEARCH]},
    "tool_loop_done": {"messages": [SYS, USER, ASSIST1, RESULT1, DONE, USER2], "tools": [WEATHER, SEARCH]},
    "parallel_calls": {"messages": [SYS, USER, ASSIST2, RESULT1, RESULT2], "tools": [WEATHER, SEARCH]},
    "thinking_history": {"messages": [SYS, USER, THOUGHT_CALL, RESULT1, THOUGHT, USER2],
                         "tools": [WEATHER, SEARCH]},
    "thinking_off": {"messages": [SYS, USER, ASSIST1, RESULT1], "tools": [WEATHER, SEARCH],
                     "chat_template_kwargs": {"enable_thinking": False}},
}

# Templates only this file renders (render_chat_templates.py cannot: no date_string).
# Phi-4-mini's bos / eos: its tokenizer_config.json ("<|endoftext|>" both).
TOOL_TOKENS = {"meta-llama-Llama-3.2": ("<|begin_of_text|>", "<|eot_id|>"),
               "microsoft-Phi-4-mini-instruct": ("<|endoftext|>", "<|endoftext|>")}

# Variables a template reads that Hugging Face fills from the clock (Llama 3.2's
# strftime_now default): fixed here so the rendering is the same every day.
TEMPLATE_KWARGS = {"meta-llama-Llama-3.2": {"date_string": "26 Jul 2024"}}

TEMPLATES = ["Qwen-Qwen2.5-7B-Instruct", "meta-llama-Llama-3.1-8B-Instruct", "mistralai-Mistral-Nemo-Instruct-2407",
             "Qwen-Qwen3", "meta-llama-Llama-3.2", "microsoft-Phi-4-mini-instruct"]

# Templates that read the tool definitions from the system message's own "tools" field (a
# JSON string) and render neither tool calls nor the tool role (Phi-4-mini's, as its model
# card describes: <|system|>...<|tool|>[...]<|/tool|><|end|>). Hugging Face leaves that
# field to the caller; the server fills it (docs/server.md, "Tools"), and this is the rule
# it follows: the function objects as tojson writes them, on the first system message (an
# empty one added first if there is none); calls written as <|tool_call|>[...]<|/tool_call|>
# in the assistant's content; results as user messages holding {"tool_response": ...}.
TOOLS_ON_SYSTEM = {"microsoft-Phi-4-mini-instruct"}


def tools_on_system(messages, tools):
    out = copy.deepcopy(messages)
    fns = tojson([t.get("function", t) for t in tools])
    if not out or out[0]["role"] != "system":
        out.insert(0, {"role": "system", "content": ""})
    out[0]["tools"] = fns
    for m in out:
        if m.get("tool_calls"):
            calls = tojson([{"name": c["function"]["name"], "arguments": c["function"]["arguments"]}
                            for c in m.pop("tool_calls")])
            text = "<|tool_call|>" + calls + "<|/tool_call|>"
            m["content"] = text if not m.get("content") else m["content"] + "\n" + text
        if m["role"] == "tool":
            r = {"tool_call_id": m.pop("tool_call_id")} if "tool_call_id" in m else {}
            if "name" in m:
                r["name"] = m.pop("name")
            r["content"] = m["content"]
            m["role"], m["content"] = "user", tojson({"tool_response": r})
    return out


def for_template(messages):
    """What vLLM and llama.cpp hand the template: arguments as objects."""
    out = copy.deepcopy(messages)
    for m in out:
        for c in m.get("tool_calls") or []:
            args = c["function"].get("arguments")
            if isinstance(args, str):
                try:
                    parsed = json.loads(args)
                except ValueError:
                    continue
                if isinstance(parsed, dict):
                    c["function"]["arguments"] = parsed
    return out


def null_content_as_empty(tmpl, bos, eos):
    """Whether the template fails on an assistant turn of only tool calls with content
    None (Qwen3's tests '</think>' in the content) and renders with "": llama.cpp's chat
    layer then hands it "" (its template capability probe), and so does Trellis."""
    probe = [{"role": "user", "content": "Hi"},
             {"role": "assistant", "content": None, "tool_calls": [
                 {"id": "c1", "type": "function", "function": {"name": "f", "arguments": {}}}]}]
    def ok(msgs):
        try:
            tmpl.render(messages=msgs, tools=None, add_generation_prompt=False, bos_token=bos, eos_token=eos,
                        date_string="26 Jul 2024")
            return True
        except (TypeError, jinja2.exceptions.TemplateError):
            return False
    empty = copy.deepcopy(probe)
    empty[1]["content"] = ""
    return not ok(probe) and ok(empty)


def main():
    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True, extensions=[loopcontrols])
    env.filters["tojson"] = tojson
    env.globals["raise_exception"] = raise_exception
    out = {"jinja2_version": jinja2.__version__, "requests": REQUESTS, "templates": {}}
    for name in TEMPLATES:
        bos, eos = TOKENS.get(name) or TOOL_TOKENS[name]
        with open(os.path.join(HERE, name + ".jinja"), encoding="utf-8") as f:
            tmpl = env.from_string(f.read())
        cases = {}
        as_empty = null_content_as_empty(tmpl, bos, eos)
        for key, req in REQUESTS.items():
            kwargs = dict(TEMPLATE_KWARGS.get(name, {}), **req.get("chat_template_kwargs", {}))
            messages = for_template(req["messages"])
            if name in TOOLS_ON_SYSTEM:
                messages = tools_on_system(messages, req["tools"])
            for m in messages if as_empty else []:
                if m.get("content") is None:
                    m["content"] = ""
            try:
                cases[key] = {"text": tmpl.render(messages=messages, tools=req["tools"],
                                                  add_generation_prompt=True, bos_token=bos, eos_token=eos,
                                                  **kwargs)}
            except jinja2.exceptions.TemplateError as e:
                cases[key] = {"error": str(e)}
        out["templates"][name] = {"bos_token": bos, "eos_token": eos, "kwargs": TEMPLATE_KWARGS.get(name, {}),
                                  "cases": cases}
    path = os.path.join(HERE, "golden_tools.json")
    with open(path, "w", encoding="utf-8") as f:
        json.dump(out, f, ensure_ascii=False, indent=1)
        f.write("\n")
    print("wrote", path, file=sys.stderr)


if __name__ == "__main__":
    main()
