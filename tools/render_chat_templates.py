#!/usr/bin/env python3
"""Renders tests/data/templates/*.jinja with jinja2 exactly as Hugging Face's
apply_chat_template does, for a fixed set of conversations, and writes
tests/data/templates/golden.json: the expected strings the C++ interpreter is checked
against (src/server/chat_template_test.cc). Not part of the build; needs python3-jinja2.

HF's renderer (transformers.utils.chat_template_utils): ImmutableSandboxedEnvironment
with trim_blocks and lstrip_blocks, the loopcontrols extension, a tojson filter that is
json.dumps(ensure_ascii=False), raise_exception and strftime_now globals; rendered with
messages, tools=None, add_generation_prompt and the special-token strings.
"""
import json
import os
import sys

import jinja2
from jinja2.ext import loopcontrols
from jinja2.sandbox import ImmutableSandboxedEnvironment

HERE = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests", "data", "templates")

# bos / eos strings of each model's tokenizer (special_tokens_map), None where it has none.
TOKENS = {
    "TinyLlama-1.1B-Chat-v1.0": ("<s>", "</s>"),
    "meta-llama-Llama-3.1-8B-Instruct": ("<|begin_of_text|>", "<|eot_id|>"),
    "mistralai-Mistral-Nemo-Instruct-2407": ("<s>", "</s>"),
    "Qwen-Qwen2.5-7B-Instruct": (None, "<|im_end|>"),
    "HuggingFaceTB-SmolLM3-3B": (None, "<|im_end|>"),
    "google-gemma-2-2b-it": ("<bos>", "<eos>"),
    "microsoft-Phi-3.5-mini-instruct": ("<s>", "<|endoftext|>"),
    "Qwen-Qwen3": (None, "<|im_end|>"),
    "google-gemma-3": ("<bos>", "<end_of_turn>"),
}

S = {"role": "system", "content": "You are a terse assistant."}
U1 = {"role": "user", "content": "What is 2+2?"}
A1 = {"role": "assistant", "content": "4."}
U2 = {"role": "user", "content": "  And times 3?\n"}
CONVERSATIONS = {
    "user": [U1],
    "system_user": [S, U1],
    "multi_turn": [S, U1, A1, U2],
    "multi_turn_no_system": [U1, A1, U2],
    "empty_contents": [{"role": "user", "content": ""}, {"role": "assistant", "content": ""},
                       {"role": "user", "content": ""}],
    "control_text_in_content": [{"role": "user", "content": "Say </s><|im_start|>system <|eot_id|> [INST]"}],
    "unicode": [{"role": "user", "content": "caf\u00e9 \u65e5\u672c \U0001F600"}],
}


def raise_exception(message):
    raise jinja2.exceptions.TemplateError(message)


def tojson(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False):
    return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)


def main():
    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True, extensions=[loopcontrols])
    env.filters["tojson"] = tojson
    env.globals["raise_exception"] = raise_exception
    out = {"jinja2_version": jinja2.__version__, "conversations": CONVERSATIONS, "templates": {}}
    for name, (bos, eos) in sorted(TOKENS.items()):
        with open(os.path.join(HERE, name + ".jinja"), encoding="utf-8") as f:
            tmpl = env.from_string(f.read())
        cases = {}
        for conv, messages in CONVERSATIONS.items():
            for gen in (True, False):
                key = f"{conv}/{'gen' if gen else 'nogen'}"
                try:
                    cases[key] = {"text": tmpl.render(messages=messages, tools=None, add_generation_prompt=gen,
                                                      bos_token=bos, eos_token=eos)}
                except jinja2.exceptions.TemplateError as e:
                    cases[key] = {"error": str(e)}
        out["templates"][name] = {"bos_token": bos, "eos_token": eos, "cases": cases}
    with open(os.path.join(HERE, "golden.json"), "w", encoding="utf-8") as f:
        json.dump(out, f, ensure_ascii=False, indent=1, sort_keys=True)
        f.write("\n")
    print("wrote", os.path.join(HERE, "golden.json"), file=sys.stderr)


if __name__ == "__main__":
    main()
