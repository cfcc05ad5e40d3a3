#!/usr/bin/env bash
# cli_reference: `trellis run --dump-logits` and greedy ids against llama.cpp's outputs
# for the reference models (tolerances: tests/data/README.md, reference/tolerances.json).
# usage: reference.sh TRELLIS DATA_DIR
set -euo pipefail
TRELLIS=$1 DATA=$2
source "$(dirname "$0")/lib.sh"
here=$(dirname "$0")
ref=$DATA/reference

check_model() {  # NAME PROMPT [extra run args...]
  local name=$1 p=$2; shift 2
  local json=$ref/$name.$p.json
  local ids; ids=$(python3 -c 'import json,sys; print(",".join(map(str, json.load(open(sys.argv[1]))["prompt"])))' "$json")
  say "$name $p ${*:-}: logits of every prompt row and 32 greedy ids vs llama.cpp"
  timeout 60 "$TRELLIS" run -m "$ref/$name.gguf" --tokens "$ids" -n 32 --temp 0 --print-token-ids \
    --dump-logits "$tmp/l.f32" -q "$@" >"$tmp/ids.txt" 2>"$tmp/err.txt" || die "run failed: $(cat "$tmp/err.txt")"
  python3 "$here/check_reference.py" "$json" "$ref/$name.$p.all_logits.f32" "$ref/tolerances.json" "$name" \
    "$tmp/l.f32" "$tmp/ids.txt" || die "$name $p does not match llama.cpp within tolerance"
  n_checks=$((n_checks + 1))
}

check_model ref-a-f16 p67
check_model ref-a-q4_0 p67
# The other reference types are as cheap; a wrong kernel for one type shows only there.
check_model ref-a-q8_0 p67
check_model ref-a-q4_k_m p67
check_model ref-b-bf16 p67
check_model ref-b-q6_k p67
# Same answers when the prompt is prefilled in odd chunks into small KV blocks.
check_model ref-a-f16 p67 -b 5 --block-size 8 -t 1
check_model ref-a-q4_0 p67 -b 13 --block-size 1

# Decode step by step: llama.cpp's greedy tokens forced one at a time (--force-tokens);
# the dump then holds the prompt rows and one row per forced token.
check_decode() {  # NAME PROMPT
  local name=$1 p=$2
  local json=$ref/$name.$p.json
  local ids forced
  ids=$(python3 -c 'import json,sys; print(",".join(map(str, json.load(open(sys.argv[1]))["prompt"])))' "$json")
  forced=$(python3 -c 'import json,sys; print(",".join(map(str, json.load(open(sys.argv[1]))["greedy"])))' "$json")
  say "$name $p: 32 forced decode steps vs llama.cpp's logits"
  timeout 60 "$TRELLIS" run -m "$ref/$name.gguf" --tokens "$ids" --force-tokens "$forced" --print-token-ids \
    --dump-logits "$tmp/d.f32" -q >"$tmp/dids.txt" 2>"$tmp/err.txt" || die "run failed: $(cat "$tmp/err.txt")"
  python3 "$here/check_reference.py" "$json" "$ref/$name.$p.all_logits.f32" "$ref/tolerances.json" "$name" \
    "$tmp/d.f32" "$tmp/dids.txt" "$ref/$name.$p.decode_logits.f32" || die "$name $p decode does not match llama.cpp"
  n_checks=$((n_checks + 1))
}
check_decode ref-a-q4_0 p67
check_decode ref-b-q6_k p67

say "the checker itself rejects a wrong dump (all zeros)"
head -c $((67 * 1024 * 4)) /dev/zero >"$tmp/zero.f32"
if python3 "$here/check_reference.py" "$ref/ref-a-f16.p67.json" "$ref/ref-a-f16.p67.all_logits.f32" \
    "$ref/tolerances.json" ref-a-f16 "$tmp/zero.f32" "$tmp/ids.txt" >"$tmp/chk.txt"; then
  die "check_reference.py accepted an all-zero dump: $(cat "$tmp/chk.txt")"
fi
ok "rejected"

echo "PASS cli_reference: $n_checks checks"
