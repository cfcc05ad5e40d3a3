#!/usr/bin/env bash
# cli_generate: gen-model + run on tiny random models; ids format, vocab range,
# determinism (greedy and seeded sampling), streamed text and the speed line.
# usage: generate.sh TRELLIS DATA_DIR
set -euo pipefail
TRELLIS=$1 DATA=$2
source "$(dirname "$0")/lib.sh"

for type in q4_0 q8_0 f16 q4_k_m q5_k_m; do
  m=$tmp/tiny-$type.gguf
  say "gen-model --shape tiny --type $type"
  timeout 30 "$TRELLIS" gen-model --shape tiny --type "$type" -o "$m" 2>"$tmp/gen.err" || die "gen-model $type: $(cat "$tmp/gen.err")"
  [[ -s $m ]] || die "gen-model $type wrote no file"
  n_vocab=$("$TRELLIS" gguf-info "$m" | awk '$1 == "llama.vocab_size" {print $2}')
  [[ $n_vocab =~ ^[0-9]+$ ]] || die "gguf-info shows no llama.vocab_size for $type"
  ok "$type model written ($(stat -c %s "$m") bytes, vocab $n_vocab)"

  say "$type: run --tokens 1,2,3 -n 8 --temp 0 --print-token-ids -q prints one line of 8 in-vocab ids"
  run=(timeout 30 "$TRELLIS" run -m "$m" --tokens 1,2,3 -n 8 --temp 0 --print-token-ids -q --ignore-eos)
  "${run[@]}" >"$tmp/a.txt" 2>"$tmp/a.err" || die "run failed: $(cat "$tmp/a.err")"
  [[ ! -s $tmp/a.err ]] || die "-q run wrote to stderr: $(cat "$tmp/a.err")"
  [[ $(wc -l <"$tmp/a.txt") -eq 1 ]] || die "expected one stdout line, got: $(cat "$tmp/a.txt")"
  read -ra ids <"$tmp/a.txt"
  [[ ${#ids[@]} -eq 8 ]] || die "expected 8 ids, got ${#ids[@]}: ${ids[*]}"
  for id in "${ids[@]}"; do
    [[ $id =~ ^[0-9]+$ && $id -lt $n_vocab ]] || die "id '$id' is not in [0, $n_vocab)"
  done
  ok "${ids[*]}"

  say "$type: the same ids on a second run (greedy is deterministic)"
  "${run[@]}" >"$tmp/b.txt" 2>/dev/null
  cmp -s "$tmp/a.txt" "$tmp/b.txt" || die "second run differs: $(cat "$tmp/b.txt") vs $(cat "$tmp/a.txt")"
  ok "identical"

  say "$type: same ids with another KV block size, prefill chunk and thread count (no silent change)"
  timeout 30 "$TRELLIS" run -m "$m" --tokens 1,2,3 -n 8 --temp 0 --print-token-ids -q --ignore-eos \
    --block-size 1 -b 1 -t 1 >"$tmp/c.txt"
  cmp -s "$tmp/a.txt" "$tmp/c.txt" || die "--block-size 1 -b 1 -t 1 gives $(cat "$tmp/c.txt"), default $(cat "$tmp/a.txt")"
  ok "identical"
done

m=$tmp/tiny-q4_0.gguf
say "text prompt with -p streams the prompt + text on stdout and the speed line on stderr"
timeout 30 "$TRELLIS" run -m "$m" -p "The capital of France is" -n 8 --temp 0 --ignore-eos >"$tmp/t.out" 2>"$tmp/t.err" \
  || die "run -p failed: $(cat "$tmp/t.err")"
grep -q "^The capital of France is" "$tmp/t.out" || die "stdout does not start with the prompt: $(cat "$tmp/t.out")"
[[ $(wc -c <"$tmp/t.out") -gt 26 ]] || die "no generated text after the prompt: $(cat "$tmp/t.out")"
grep -q "tok/s" "$tmp/t.err" || die "no tok/s on stderr: $(cat "$tmp/t.err")"
grep -q "TTFT" "$tmp/t.err" || die "no TTFT on stderr: $(cat "$tmp/t.err")"
grep -q "generation: 8 tokens" "$tmp/t.err" || die "speed line does not report 8 generated tokens: $(cat "$tmp/t.err")"
ok "$(head -c 80 "$tmp/t.out" | tr '\n' ' ') / $(grep TTFT "$tmp/t.err")"

say "--seed with --temp 0.8 is reproducible for one seed and differs across seeds"
sample() { timeout 30 "$TRELLIS" run -m "$m" --tokens 1,2,3 -n 16 --temp 0.8 --seed "$1" --print-token-ids -q --ignore-eos; }
s1=$(sample 7); s2=$(sample 7); s3=$(sample 8)
[[ $s1 == "$s2" ]] || die "seed 7 gave '$s1' then '$s2'"
[[ $s1 != "$s3" ]] || die "seeds 7 and 8 gave the same 16 sampled ids: $s1"
ok "seed 7: $s1"

say "-n 0 generates nothing and prints an empty line"
out=$(timeout 30 "$TRELLIS" run -m "$m" --tokens 1,2,3 -n 0 --temp 0 --print-token-ids -q | od -An -c | tr -d ' ')
[[ $out == '\n' ]] || die "-n 0 printed '$out', expected a single newline"
ok "empty line"

say "threads default to the physical cores the process may use: its affinity mask (taskset) is respected"
timeout 30 "$TRELLIS" run -m "$m" --tokens 1,2,3 -n 1 --temp 0 >/dev/null 2>"$tmp/t0.err"
grep -Eq "\| [0-9]+ threads? \(default: [0-9]+ physical cores? of [0-9]+ CPUs? allowed" "$tmp/t0.err" || die "no default thread count: $(cat "$tmp/t0.err")"
timeout 30 taskset -c 0 "$TRELLIS" run -m "$m" --tokens 1,2,3 -n 1 --temp 0 >/dev/null 2>"$tmp/t1.err"
grep -q "| 1 thread (default: 1 physical core of 1 CPU allowed" "$tmp/t1.err" || die "taskset -c 0: $(head -2 "$tmp/t1.err")"
timeout 30 "$TRELLIS" run -m "$m" --tokens 1,2,3 -n 1 --temp 0 -t 3 >/dev/null 2>"$tmp/t3.err"
grep -q "| 3 threads$" "$tmp/t3.err" || die "-t 3 not used as given: $(head -2 "$tmp/t3.err")"
ok "$(grep -o '[0-9]* threads\? (default.*' "$tmp/t0.err"); under taskset -c 0: 1"

say "bench speed names the CPU and the kernel path it took (TRELLIS_ISA caps the path)"
for want in scalar native; do
  if [[ $want == scalar ]]; then env=(TRELLIS_ISA=scalar); else env=(); fi
  env "${env[@]}" timeout 60 "$TRELLIS" bench speed -m "$m" -p 8 -n 2 -r 1 -t 1 --json 2>/dev/null >"$tmp/speed.json" \
    || die "bench speed ($want) failed"
  isa=$(python3 -c 'import json,sys; j=json.load(open(sys.argv[1])); assert j["cpu"] and j["cpu"] != "unknown", j; print(j["isa"])' "$tmp/speed.json") \
    || die "bench speed --json: $(cat "$tmp/speed.json")"
  if [[ $want == scalar ]]; then [[ $isa == scalar ]] || die "TRELLIS_ISA=scalar ran '$isa'"; fi
  ok "$want: $isa"
done

say "bench speed at a depth: the pp and tg tests run after that many cached tokens"
timeout 60 "$TRELLIS" bench speed -m "$m" -p 8 -n 2 -r 1 -t 1 -d 40 --json 2>/dev/null >"$tmp/depth.json" \
  || die "bench speed -d 40 failed"
python3 -c 'import json,sys; j=json.load(open(sys.argv[1])); assert j["depth"] == 40 and j["pp_tok_s"] > 0 and j["tg_tok_s"] > 0, j' \
  "$tmp/depth.json" || die "bench speed -d: $(cat "$tmp/depth.json")"
ok "depth 40"

say "bench prefix (the RadixAttention figures) at toy sizes: its TTFT table and CSV, prefix hits within the bound"
timeout 120 "$TRELLIS" bench prefix -m "$m" --quick --only ttft -L 64 -D 2 -N 2 -r 1 -t 1 -o "$tmp/prefix" \
  >"$tmp/prefix.out" 2>"$tmp/prefix.err" || die "bench prefix failed: $(tail -3 "$tmp/prefix.err")"
[[ $(wc -l <"$tmp/prefix/ttft.csv") -eq 8 ]] || die "ttft.csv: $(cat "$tmp/prefix/ttft.csv")"
python3 - "$tmp/prefix/ttft.csv" <<'PY' || die "bench prefix: the full-prefix probe did not hit the cache: $(cat "$tmp/prefix/ttft.csv")"
import csv, sys
rows = list(csv.DictReader(open(sys.argv[1])))
assert float(rows[0]["hit"]) == 0 and float(rows[-1]["hit"]) > 0.4, rows
PY
ok "$(grep -c '' "$tmp/prefix/ttft.csv") lines; phi 1 hit $(tail -1 "$tmp/prefix/ttft.csv" | cut -d, -f7)"

say "bench grammar --compile-schemas: schema text to the first mask, refused keywords counted"
mkdir -p "$tmp/schemas"
echo '{"type":"object","properties":{"a":{"type":"integer"}},"required":["a"]}' >"$tmp/schemas/one.json"
echo '[{"description":"suite layout","schema":{"enum":["x","y"]},"tests":[]},{"schema":{"type":"array","uniqueItems":true}}]' \
  >"$tmp/schemas/suite.json"
timeout 60 "$TRELLIS" bench grammar --vocab "$DATA/vocab/ggml-vocab-llama-spm.gguf" --compile-schemas "$tmp/schemas" \
  >"$tmp/compile.txt" 2>&1 || die "bench grammar --compile-schemas: $(cat "$tmp/compile.txt")"
awk '$1 == "ggml-vocab-llama-spm.gguf" && $2 == 32000 && $3 == 2 && $4 == 1 && $7 > 0 {found = 1} END {exit !found}' \
  "$tmp/compile.txt" || die "want 2 schemas compiled, 1 refused: $(cat "$tmp/compile.txt")"
ok "$(grep '^ggml-vocab' "$tmp/compile.txt" | tr -s ' ')"

echo "PASS cli_generate: $n_checks checks"
