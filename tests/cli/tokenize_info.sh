#!/usr/bin/env bash
# cli_tokenize_info: `trellis tokenize` against llama.cpp's vocab test vectors, and
# `trellis gguf-info` on a reference model.
# usage: tokenize_info.sh TRELLIS DATA_DIR
set -euo pipefail
TRELLIS=$1 DATA=$2
source "$(dirname "$0")/lib.sh"
here=$(dirname "$0")
spm=$DATA/vocab/ggml-vocab-llama-spm.gguf

say "tokenize -p 'Hello world' --ids --no-bos gives llama.cpp's ids (15043 3186 in ggml-vocab-llama-spm.gguf.out)"
want=$(python3 - "$spm" <<'PY'
import sys
v = sys.argv[1]
inp = open(v + ".inp", encoding="utf-8").read().split("\n__ggml_vocab_test__\n")
out = open(v + ".out", encoding="utf-8").read().split("\n")
print(out[inp.index("Hello world")].strip())
PY
)
got=$(timeout 30 "$TRELLIS" tokenize -m "$spm" -p "Hello world" --ids --no-bos)
[[ $got == "$want" ]] || die "got '$got', llama.cpp '$want'"
ok "$got"

say "tokenize without --no-bos puts BOS (1) first"
got=$(timeout 30 "$TRELLIS" tokenize -m "$spm" -p "Hello world" --ids)
[[ $got == "1 $want" ]] || die "got '$got', expected '1 $want'"
ok "$got"

for v in ggml-vocab-llama-spm.gguf ggml-vocab-gpt-2.gguf; do
  say "every string of $v.inp tokenizes to the ids in $v.out"
  python3 "$here/check_vocab.py" "$TRELLIS" "$DATA/vocab/$v" || die "$v: tokenize differs from llama.cpp"
  n_checks=$((n_checks + 1))
done

m=$DATA/reference/ref-a-q4_0.gguf
say "gguf-info lists general.architecture and the tensor table"
timeout 30 "$TRELLIS" gguf-info "$m" >"$tmp/info.txt" 2>"$tmp/info.err" || die "gguf-info failed: $(cat "$tmp/info.err")"
grep -qE '^ +general\.architecture +"llama"' "$tmp/info.txt" || die "no general.architecture = llama: $(head -20 "$tmp/info.txt")"
grep -qE '^tensors \([0-9]+\):' "$tmp/info.txt" || die "no tensor table header"
grep -qE '^ +token_embd\.weight +q4_0 +\[256, 1024\]' "$tmp/info.txt" || die "token_embd.weight row missing or wrong"
grep -qE '^ +output\.weight +q6_K +\[256, 1024\]' "$tmp/info.txt" || die "output.weight row missing or wrong (llama.cpp keeps it q6_K)"
n_tensors=$(sed -nE 's/^tensors \(([0-9]+)\):/\1/p' "$tmp/info.txt")
[[ $n_tensors -eq $((3 + 2 * 9)) ]] || die "expected 21 tensors for 2 layers, table says $n_tensors"
ok "llama, $n_tensors tensors"

say "gguf-info on a vocab-only file shows its metadata and an empty tensor table"
timeout 30 "$TRELLIS" gguf-info "$spm" >"$tmp/info2.txt"
grep -q 'tokenizer.ggml.model' "$tmp/info2.txt" && grep -q '^tensors (0):' "$tmp/info2.txt" || die "unexpected: $(head "$tmp/info2.txt")"
ok "0 tensors"

echo "PASS cli_tokenize_info: $n_checks checks"
