#!/usr/bin/env bash
# cli_roofline: `trellis bench roofline --quick` (~1 s) prints every figure and ceiling
# row with a positive number, --json and --csv agree, bad options fail cleanly.
# usage: roofline.sh TRELLIS DATA_DIR
set -euo pipefail
TRELLIS=$1 DATA=$2
source "$(dirname "$0")/lib.sh"

# Figure rows the table must have on this CPU (int8 and f32 peaks need AVX2 at least;
# TRELLIS_ISA=scalar|avx2 caps the paths as it caps the kernels).
isa=${TRELLIS_ISA:-avx512}
simd=0
grep -qw avx2 /proc/cpuinfo && [[ $isa != scalar ]] && simd=1
want=("DRAM read" "L2 read" "core clock")
[[ $simd == 1 ]] && want+=("int8 dot" "f32 FMA")
grep -qw avx512_bf16 /proc/cpuinfo && [[ $isa != avx2 && $isa != scalar ]] && want+=("bf16 dot")

say "bench roofline --quick --threads 2: a row per figure and thread count, every figure > 0"
timeout 60 "$TRELLIS" bench roofline --quick --threads 2 >"$tmp/md.txt" 2>"$tmp/md.err" ||
  die "bench roofline --quick failed: $(cat "$tmp/md.err")"
grep -q '^| what | threads | figure' "$tmp/md.txt" || die "no figure table header: $(head -5 "$tmp/md.txt")"
for w in "${want[@]}"; do
  for t in 1 2; do
    [[ $w == "core clock" && $t == 2 ]] && continue  # the clock is measured on one thread
    row=$(grep -E "^\| $w [^|]*\| $t \|" "$tmp/md.txt" | head -1) || die "no '$w' row for $t threads: $(cat "$tmp/md.txt")"
    v=$(awk -F'|' '{gsub(/ /, "", $4); print $4}' <<<"$row")
    awk -v v="$v" 'BEGIN { exit !(v + 0 > 0) }' || die "'$w', $t threads: figure '$v' is not positive"
  done
  ok "$w: positive"
done
for m in Q4_0 Q4_K_M F16; do
  for t in 1 2; do
    row=$(grep -E "^\| $m \| $t \|" "$tmp/md.txt") || die "no ceiling row for $m, $t threads: $(cat "$tmp/md.txt")"
    # columns: model, threads, MB per token, GOP per token, decode, prefill, 8 sessions;
    # prefill needs an arithmetic peak (AVX2 at least)
    awk -F'|' -v pp="$simd" '{
      for (i = 4; i <= 8; ++i) { v = $i; gsub(/ /, "", v); if (!(v + 0 > 0) && !(i == 7 && !pp)) exit 1 } }' <<<"$row" ||
      die "ceiling row has a non-positive figure: $row"
  done
  ok "$m ceilings positive"
done
grep -qE '^\| Q4_0 \| 1 \| 598\.8 \| 2\.069 \|' "$tmp/md.txt" || die "Q4_0 TinyLlama shape: expected 598.8 MB and 2.069 GOP per token: $(grep Q4_0 "$tmp/md.txt")"
ok "Q4_0: 598.8 MB and 2.069 GOP per token"

say "--json prints one object per line, --csv appends the same figures"
timeout 60 "$TRELLIS" bench roofline --quick --threads 2 --json --csv "$tmp/r.csv" >"$tmp/j.txt" 2>"$tmp/j.err" ||
  die "bench roofline --json failed: $(cat "$tmp/j.err")"
python3 - "$tmp/j.txt" "$tmp/r.csv" <<'PY' || die "JSON/CSV check failed"
import csv, json, sys
rows = [json.loads(l) for l in open(sys.argv[1])]
peaks = [r for r in rows if r["kind"] == "peak"]
ceil = [r for r in rows if r["kind"] == "ceiling"]
assert peaks and all(r["value"] > 0 and r["threads"] in (1, 2) and r["runs"] for r in peaks), peaks
assert any(r["what"].startswith("dram_read") for r in peaks), "no dram_read"
assert len(ceil) == 6 and all(r["tg_tok_s"] > 0 for r in ceil), ceil
c = list(csv.DictReader(open(sys.argv[2])))
assert len(c) == len(peaks) + 3 * len(ceil), (len(c), len(peaks), len(ceil))
assert all(float(r["value"]) >= 0 for r in c)
print(f"  {len(peaks)} figures, {len(ceil)} ceiling rows, {len(c)} CSV rows")
PY
n_checks=$((n_checks + 1))
ok "JSON lines and CSV rows agree"

say "bad options fail with one line"
expect_fail 'threads' -- "$TRELLIS" bench roofline --threads 0

echo "PASS cli_roofline: $n_checks checks"
