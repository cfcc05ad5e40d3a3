#!/usr/bin/env python3
"""Tokenizes every string of a llama.cpp vocab test vector (VOCAB.inp / VOCAB.out) with
`trellis tokenize --ids --no-bos` and compares with llama.cpp's ids.

usage: check_vocab.py TRELLIS VOCAB.gguf   (exit 1 on any mismatch)
"""
import subprocess
import sys


def main(trellis, vocab):
    inp = open(vocab + ".inp", encoding="utf-8").read().split("\n__ggml_vocab_test__\n")
    out = open(vocab + ".out", encoding="utf-8").read().split("\n")
    inp[-1] = inp[-1].removesuffix("\n__ggml_vocab_test__").removesuffix("\n")
    n_bad = 0
    for text, want in zip(inp, out):
        want = [int(x) for x in want.split()]
        r = subprocess.run([trellis, "tokenize", "-m", vocab, "-p", text, "--ids", "--no-bos"],
                           capture_output=True, timeout=30)
        got = [int(x) for x in r.stdout.split()] if r.returncode == 0 else None
        if got != want:
            n_bad += 1
            print(f"  MISMATCH {text!r}: want {want}, got {got} rc={r.returncode} "
                  f"stderr={r.stderr.decode(errors='replace').strip()!r}")
    print(f"  {len(inp) - n_bad}/{len(inp)} strings tokenize as llama.cpp does ({vocab.rsplit('/', 1)[-1]})")
    return 1 if n_bad or len(inp) != len(out) else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1], sys.argv[2]))
