#!/usr/bin/env bash
# cli_bad_input: bad files, bad arguments, oversize prompts and full pools. Each must
# end with a one-line "trellis: ..." error naming the problem, an exit code < 128 (no
# signal) and within 30 s; nothing may crash, hang or answer silently wrong.
# usage: bad_input.sh TRELLIS DATA_DIR
set -euo pipefail
TRELLIS=$1 DATA=$2
source "$(dirname "$0")/lib.sh"
here=$(dirname "$0")
T=$TRELLIS
ref=$DATA/reference/ref-a-q4_0.gguf
tiny=$tmp/tiny.gguf
timeout 30 "$T" gen-model --shape tiny --type q4_0 -o "$tiny" 2>/dev/null || die "gen-model failed"

# --- model files ----------------------------------------------------------------------
say "missing file"
expect_fail "cannot open.*no such file" -- "$T" run -m "$tmp/nope.gguf" --tokens 1,2 -n 2 -q
say "empty file"
: >"$tmp/empty.gguf"
expect_fail "empty\.gguf.*truncated.*magic" -- "$T" run -m "$tmp/empty.gguf" --tokens 1,2 -n 2 -q
say "text file"
printf 'hello world\nthis is not a model\n' >"$tmp/text.gguf"
expect_fail "not a GGUF file" -- "$T" run -m "$tmp/text.gguf" --tokens 1,2 -n 2 -q

read -r header_end meta_end tinfo_end data_offset size < <(python3 "$here/gguf_layout.py" "$ref")
say "reference model truncated at offsets in header, metadata, tensor infos, tensor data (layout: $header_end $meta_end $tinfo_end $data_offset $size)"
for off in 0 2 6 12 $header_end 300 $((meta_end / 2)) $meta_end $((meta_end + 9)) $(((meta_end + tinfo_end) / 2)) \
           $tinfo_end $data_offset $((data_offset + 1)) $((data_offset + (size - data_offset) / 2)) $((size - 1)); do
  head -c "$off" "$ref" >"$tmp/trunc.gguf"
  expect_fail "trunc|cannot fit|past the end|only [0-9]+ left" -- "$T" run -m "$tmp/trunc.gguf" --tokens 1,2 -n 2 -q
done
say "gguf-info, tokenize and bench speed on a model truncated in the middle of tensor data"
head -c $((data_offset + (size - data_offset) / 2)) "$ref" >"$tmp/trunc.gguf"
expect_fail "past the end of the file" -- "$T" gguf-info "$tmp/trunc.gguf"
expect_fail "past the end of the file" -- "$T" tokenize -m "$tmp/trunc.gguf" -p hi
expect_fail "past the end of the file" -- "$T" bench speed -m "$tmp/trunc.gguf" -p 8 -n 4 -r 1
head -c $(((meta_end + tinfo_end) / 2)) "$ref" >"$tmp/trunc.gguf"
expect_fail "trunc|cannot fit|only [0-9]+ left" -- "$T" bench speed -m "$tmp/trunc.gguf" -p 8 -n 4 -r 1

say "one byte flipped (xor 0xff) in the tensor-info area: fails cleanly or runs, never crashes or hangs"
# Every 5th byte of [meta_end, tinfo_end): names, n_dims, dims, types, offsets.
python3 - "$T" "$ref" "$meta_end" "$tinfo_end" "$tmp" <<'PY' || die "a byte flip crashed or hung trellis"
import subprocess, sys
t, ref, lo, hi, tmp = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4]), sys.argv[5]
data = open(ref, "rb").read()
counts = {"ran": 0, "clean error": 0}
bad = 0
for off in range(lo, hi, 5):
    b = bytearray(data); b[off] ^= 0xFF
    p = f"{tmp}/flip.gguf"; open(p, "wb").write(b)
    try:
        r = subprocess.run([t, "run", "-m", p, "--tokens", "1,2,3", "-n", "2", "-q", "--temp", "0", "--print-token-ids"],
                           capture_output=True, timeout=30)
    except subprocess.TimeoutExpired:
        print(f"  HANG at byte {off}"); bad += 1; continue
    err = r.stderr.decode(errors="replace").strip()
    if r.returncode == 0:
        counts["ran"] += 1
    elif 0 < r.returncode < 128 and err.startswith("trellis: ") and "\n" not in err:
        counts["clean error"] += 1
    else:
        print(f"  BAD at byte {off}: rc={r.returncode} stderr={err[:300]!r}"); bad += 1
print(f"  ok   {sum(counts.values())} flips: {counts}")
sys.exit(1 if bad else 0)
PY

say "a vocab-only GGUF as the model names the missing tensor"
expect_fail "tensor 'token_embd.weight' is missing" -- "$T" run -m "$DATA/vocab/ggml-vocab-llama-spm.gguf" --tokens 1,2 -n 2 -q
expect_fail "tensor 'token_embd.weight' is missing" -- "$T" run -m "$DATA/vocab/ggml-vocab-llama-spm.gguf" -p hello -n 2 -q
expect_fail "architecture 'gpt2' is not supported" -- "$T" run -m "$DATA/vocab/ggml-vocab-gpt-2.gguf" --tokens 1,2 -n 2 -q

say "a model whose llama.block_count is lower than its layers (2 -> 1) is rejected"
python3 - "$ref" "$tmp/blocks.gguf" <<'PY'
import sys
b = bytearray(open(sys.argv[1], "rb").read())
key = b"llama.block_count"
i = b.index(key) + len(key)
assert b[i:i + 4] == b"\x04\0\0\0" and b[i + 4:i + 8] == b"\x02\0\0\0"  # uint32 2
b[i + 4] = 1
open(sys.argv[2], "wb").write(b)
PY
# (Model::Load once ran such a file silently as a 1-layer model; llama.cpp rejects it.)
expect_fail "tensor 'blk\.1\..*' belongs to layer 1, but llama\.block_count is 1" -- \
  "$T" run -m "$tmp/blocks.gguf" --tokens 1,2,3 -n 2 -q

# --- arguments ------------------------------------------------------------------------
say "--tokens: not an integer, out of vocabulary, empty, negative, empty item"
expect_fail "'abc' is not an integer" -- "$T" run -m "$tiny" --tokens 1,abc -n 2 -q
expect_fail "token id 99999999 is outside the vocabulary" -- "$T" run -m "$tiny" --tokens 99999999 -n 2 -q
expect_fail "give a prompt|empty" -- "$T" run -m "$tiny" --tokens "" -n 2 -q
expect_fail "'-5' is not a token id" -- "$T" run -m "$tiny" --tokens 1,-5 -n 2 -q
expect_fail "'' is not an integer" -- "$T" run -m "$tiny" --tokens 1,,2 -n 2 -q
expect_fail "is not an integer" -- "$T" run -m "$tiny" --tokens 99999999999999999999 -n 2 -q
expect_fail "mutually exclusive" -- "$T" run -m "$tiny" --tokens 1 -p hi -n 2 -q
expect_fail "give a prompt" -- "$T" run -m "$tiny" -n 2 -q

say "a prompt longer than --ctx-size 64"
long=$(python3 -c 'print(",".join(["5"] * 100))')
expect_fail "prompt of 100 tokens does not fit the context of 64" -- "$T" run -m "$tiny" --tokens "$long" --ctx-size 64 -n 2 -q
expect_fail "prompt of 64 tokens does not fit the context of 64" -- "$T" run -m "$tiny" --tokens "$(python3 -c 'print(",".join(["5"] * 64))')" --ctx-size 64 -n 2 -q
text=$(python3 -c 'print("hello world " * 100)')
expect_fail "does not fit the context of 64" -- "$T" run -m "$tiny" -p "$text" --ctx-size 64 -n 2 -q

say "KV pool and block size"
expect_fail "kv-memory 1000 bytes holds no KV block" -- "$T" run -m "$tiny" --tokens 1,2 --kv-memory 1000 -n 2 -q
expect_fail "kv-memory -5 must be >= 0" -- "$T" run -m "$tiny" --tokens 1,2 --kv-memory -5 -n 2 -q
expect_fail "block size 0 is not usable" -- "$T" run -m "$tiny" --tokens 1,2 --block-size 0 -n 2 -q
expect_fail "block size 5000 is not usable" -- "$T" run -m "$tiny" --tokens 1,2 --block-size 5000 -n 2 -q
# 7 is a valid block size for these models (7 x head_dim 64 is a multiple of 32): it must
# give the same answer as the default, not an error.
a=$(timeout 30 "$T" run -m "$tiny" --tokens 1,2,3 -n 40 --temp 0 --print-token-ids -q --ignore-eos)
b=$(timeout 30 "$T" run -m "$tiny" --tokens 1,2,3 -n 40 --temp 0 --print-token-ids -q --ignore-eos --block-size 7)
[[ $a == "$b" ]] || die "--block-size 7 changed the greedy ids: '$b' vs '$a'"
ok "--block-size 7 (valid here): same 40 greedy ids as --block-size 32"
expect_fail "max batch tokens must be >= 1" -- "$T" run -m "$tiny" --tokens 1,2 -b 0 -n 2 -q

say "threads, counts and sampling values"
expect_fail "threads must be in 1\.\.1024" -- "$T" run -m "$tiny" --tokens 1,2 --threads -1 -n 2 -q
expect_fail "threads must be in 1\.\.1024" -- "$T" run -m "$tiny" --tokens 1,2 --threads 100000 -n 2 -q
expect_fail "-n -1: the number of tokens to generate must be >= 0" -- "$T" run -m "$tiny" --tokens 1,2 -n -1 -q
expect_fail "ctx-size -5 must be >= 0" -- "$T" run -m "$tiny" --tokens 1,2 --ctx-size -5 -n 2 -q
expect_fail "temp must be a finite number" -- "$T" run -m "$tiny" --tokens 1,2 --temp nan -n 2 -q
expect_fail "top-p must be in" -- "$T" run -m "$tiny" --tokens 1,2 --top-p 1.5 -n 2 -q
expect_fail "min-p must be in" -- "$T" run -m "$tiny" --tokens 1,2 --min-p -1 -n 2 -q
expect_fail "repeat-penalty must be > 0" -- "$T" run -m "$tiny" --tokens 1,2 --repeat-penalty 0 -n 2 -q
expect_fail "top-k must be >= 0" -- "$T" run -m "$tiny" --tokens 1,2 --top-k -3 -n 2 -q
expect_fail "could not convert.*n-predict.*abc" -- "$T" run -m "$tiny" --tokens 1,2 -n abc -q
expect_fail "not expected.*--bogus" -- "$T" run -m "$tiny" --tokens 1,2 --bogus
expect_fail "model is required" -- "$T" run --tokens 1,2
out=$(timeout 30 "$T" run -m "$tiny" --tokens 1,2 -n 0 --print-token-ids -q | od -An -c | tr -d ' ')
[[ $out == '\n' ]] || die "-n 0 printed '$out', expected one empty line"
ok "-n 0: exit 0, one empty line"

say "gen-model with an unknown --shape or --type"
expect_fail "unknown model shape 'huge'" -- "$T" gen-model --shape huge -o "$tmp/x.gguf"
expect_fail "unknown model type 'q5_1'" -- "$T" gen-model --shape tiny --type q5_1 -o "$tmp/x.gguf"
[[ ! -e $tmp/x.gguf ]] || die "a failed gen-model left $tmp/x.gguf behind"
ok "no output file left behind"

say "bench speed: bad counts"
expect_fail "reps >= 1" -- "$T" bench speed -m "$tiny" -r 0
expect_fail "reps >= 1" -- "$T" bench speed -m "$tiny" -p -1
expect_fail "nothing to measure" -- "$T" bench speed -m "$tiny" -p 0 -n 0 -r 1
expect_fail "must be <= 1048576" -- "$T" bench speed -m "$tiny" -p 2000000000 -n 4 -r 1
expect_fail "n-depth must be in" -- "$T" bench speed -m "$tiny" -p 8 -n 0 -r 1 -d -5
expect_fail "block size 0 is not usable" -- "$T" bench speed -m "$tiny" -p 8 -n 0 -r 1 --block-size 0
say "gen-model into a missing directory"
expect_fail "cannot create.*No such file" -- "$T" gen-model --shape tiny -o "$tmp/no/such/dir/x.gguf"

# --- running out ----------------------------------------------------------------------
say "generation stops at the context limit (-n 200 --ctx-size 64) and says so on stderr"
rc=0; timeout 30 "$T" run -m "$tiny" --tokens 1,2,3 -n 200 --ctx-size 64 --temp 0 --print-token-ids -q --ignore-eos \
  >"$tmp/o" 2>"$tmp/e" || rc=$?
[[ $rc -eq 0 ]] || die "context limit: rc=$rc, stderr: $(cat "$tmp/e")"
n=$(wc -w <"$tmp/o")
[[ $n -eq 62 ]] || die "expected 62 tokens (64 positions - 3 prompt + 1 sampled from the last), got $n"
grep -q "context limit" "$tmp/e" || die "-q run does not say it stopped at the context limit: $(cat "$tmp/e")"
ok "$n tokens; $(cat "$tmp/e")"
timeout 30 "$T" run -m "$tiny" --tokens 1,2,3 -n 200 --ctx-size 64 --temp 0 --ignore-eos >/dev/null 2>"$tmp/e"
grep -q "stopped: context full" "$tmp/e" || die "speed line does not say the context filled: $(cat "$tmp/e")"
ok "speed line: $(grep -o '(stopped.*' "$tmp/e")"

say "the KV pool runs out midway (--kv-memory = 2 blocks): an error, and the ids made so far are kept"
rc=0; timeout 30 "$T" run -m "$tiny" --tokens 1,2,3 -n 100 --kv-memory 131072 --temp 0 --print-token-ids -q --ignore-eos \
  >"$tmp/o" 2>"$tmp/e" || rc=$?
[[ $rc -gt 0 && $rc -lt 128 ]] || die "pool exhausted: rc=$rc, stderr: $(cat "$tmp/e")"
grep -q "^trellis: .*KV pool exhausted" "$tmp/e" || die "no pool-exhausted message: $(cat "$tmp/e")"
n=$(wc -w <"$tmp/o")
full=$(timeout 30 "$T" run -m "$tiny" --tokens 1,2,3 -n "$n" --temp 0 --print-token-ids -q --ignore-eos)
[[ $n -gt 0 && $(cat "$tmp/o") == "$full" ]] || die "the $n ids printed before the pool ran out are not the run's first $n ids"
ok "$n ids kept; $(cat "$tmp/e")"

echo "PASS cli_bad_input: $n_checks checks"
