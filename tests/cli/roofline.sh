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
# AVX-512 VNNI: the packed tiles' instruction mix too (int8_tile_mix; not compared with the
# peak here: --quick's short loops put the two within noise of each other)
vnni512=0
grep -qw avx512_vnni /proc/cpuinfo && [[ $isa != avx2 && $isa != scalar ]] && vnni512=1 && want+=("int8 dot in the Q4_0")
# and, for one core, the int8 dot beside 8 of each instruction the tiles mix in (which of
# them share vpdpbusd's pipes differs between CPUs, so only their presence is checked)
shares=(vmulps vfmadd231ps vpmulld vpdpwssd vcvtdq2ps vpaddd)

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
if [[ $vnni512 == 1 ]]; then
  for op in "${shares[@]}"; do
    row=$(grep -E "^\| int8 dot with 8 $op per 16 vpdpbusd \| 1 \|" "$tmp/md.txt" | head -1) ||
      die "no 'int8 dot with 8 $op' row: $(cat "$tmp/md.txt")"
    v=$(awk -F'|' '{gsub(/ /, "", $4); print $4}' <<<"$row")
    awk -v v="$v" 'BEGIN { exit !(v + 0 > 0) }' || die "'int8 dot with 8 $op': figure '$v' is not positive"
  done
  ok "the int8 dot beside ${#shares[@]} other instructions: positive"
  for src in "dwords as broadcast memory operands" "8 dwords broadcast to registers"; do
    row=$(grep -F "| int8 dot, $src" "$tmp/md.txt" | head -1) || die "no 'int8 dot, $src' row: $(cat "$tmp/md.txt")"
    v=$(awk -F'|' '{gsub(/ /, "", $4); print $4}' <<<"$row")
    awk -v v="$v" 'BEGIN { exit !(v + 0 > 0) }' || die "'int8 dot, $src': figure '$v' is not positive"
  done
  ok "the int8 dot with its dwords from memory and from registers: positive"
fi
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

say "bench speed --limits: each figure as a fraction of the limits measured in the same run"
timeout "$(scaled 60)" "$TRELLIS" gen-model --shape tiny --type q4_0 -o "$tmp/tiny.gguf" >/dev/null 2>"$tmp/gen.err" ||
  die "gen-model: $(cat "$tmp/gen.err")"
timeout "$(scaled 60)" "$TRELLIS" bench speed -m "$tmp/tiny.gguf" -t 2 -p 32 -n 4 -r 1 -s 2 --limits-quick --json \
  >"$tmp/speed.json" 2>"$tmp/speed.err" || die "bench speed --limits failed: $(cat "$tmp/speed.err")"
python3 - "$tmp/speed.json" "$simd" <<'PY' || die "bench speed --limits: $(cat "$tmp/speed.json")"
import json, sys
j = json.load(open(sys.argv[1])); simd = sys.argv[2] == "1"
l = j["limits"]
assert l["dram_bytes_per_s"] > 0 and l["macs_per_token"] > 0 and l["weight_bytes_per_token"] > 0, l
assert (l["int8_ops_per_s"] > 0) == simd, l
if simd:
    limit = l["int8_ops_per_s"] / (2 * l["macs_per_token"])
    assert abs(j["pp_limit_tok_s"] - limit) <= 1e-6 * limit, (j["pp_limit_tok_s"], limit)
    assert abs(j["pp_fraction"] - j["pp_tok_s"] / limit) <= 1e-9 + 1e-6 * j["pp_fraction"], j
# The bandwidth is the larger of the read loop's and what the decode itself streamed (its
# tokens/s times the weight bytes; a batched step reads them once for all sessions).
decode = max(j["tg_tok_s"], j["tg_batched_tok_s"] / j["sessions"]) * l["weight_bytes_per_token"]
assert abs(l["dram_bytes_per_s_decode"] - decode) <= 1e-6 * decode, (l, decode)
assert abs(l["dram_bytes_per_s_loop"] - (l["dram_bytes_per_s_before"] + l["dram_bytes_per_s_after"]) / 2) <= 1e-6 * l["dram_bytes_per_s_loop"], l
assert l["dram_bytes_per_s"] == max(l["dram_bytes_per_s_loop"], l["dram_bytes_per_s_decode"]), l
assert j["tg_fraction"] <= 1 + 1e-9 or (simd and j["tg_limit_tok_s"] < l["dram_bytes_per_s"] / l["weight_bytes_per_token"]), j
tg_limit = min(l["dram_bytes_per_s"] / l["weight_bytes_per_token"], l["int8_ops_per_s"] / (2 * l["macs_per_token"]) if simd else 1e30)
assert abs(j["tg_limit_tok_s"] - tg_limit) <= 1e-6 * tg_limit, (j["tg_limit_tok_s"], tg_limit)
assert 0 < j["tg_fraction"] and 0 < j["tg_batched_fraction"], j
print(f"  ok   pp {j['pp_tok_s']:.0f} of {j['pp_limit_tok_s']:.0f} tok/s ({j['pp_fraction']:.2f}), tg {j['tg_tok_s']:.0f} of "
      f"{j['tg_limit_tok_s']:.0f} ({j['tg_fraction']:.2f}), 2 sessions {j['tg_batched_fraction']:.2f}")
PY
timeout "$(scaled 60)" "$TRELLIS" bench speed -m "$tmp/tiny.gguf" -t 2 -p 32 -n 4 -r 1 --thread-sweep --json \
  >"$tmp/sweep.json" 2>"$tmp/sweep.err" || die "bench speed --thread-sweep failed: $(cat "$tmp/sweep.err")"
[[ $(python3 -c 'import json, sys; print([json.loads(l)["threads"] for l in open(sys.argv[1])])' "$tmp/sweep.json") == "[1, 2]" ]] \
  || die "--thread-sweep -t 2 did not run 1 and 2 threads: $(cat "$tmp/sweep.json")"
ok "--thread-sweep: one result per thread count, 1 and 2"

say "bench/ab.py: two binaries in alternating rounds (A B, then B A), every figure of both, medians, B/A"
ln -s "$(realpath "$TRELLIS")" "$tmp/a"
ln -s "$(realpath "$TRELLIS")" "$tmp/b"
src=$(cd "$(dirname "$0")/../.." && pwd)
timeout "$(scaled 120)" python3 "$src/bench/ab.py" --a "$tmp/a" --b "$tmp/b" --rounds 2 --csv "$tmp/ab.csv" -- \
  -m "$tmp/tiny.gguf" -t 2 -p 16 -n 2 -r 1 -s 2 --budget >"$tmp/ab.md" 2>"$tmp/ab.err" || die "ab.py failed: $(cat "$tmp/ab.err")"
python3 - "$tmp/ab.md" "$tmp/ab.csv" "$tmp/a" "$tmp/b" <<'PY' || die "ab.py output: $(cat "$tmp/ab.md")"
import csv, statistics, sys
md, rows, a, b = open(sys.argv[1]).read(), list(csv.DictReader(open(sys.argv[2]))), sys.argv[3], sys.argv[4]
for fig in ("pp_tok_s", "tg_tok_s", "tg_batched_tok_s", "pp:attention", "tg_batched:logits"):
    line = next((l for l in md.splitlines() if l.startswith(f"| {fig} |")), None)
    assert line, f"no row for {fig}"
    cells = [c.strip() for c in line.strip("|").split("|")]
    assert len(cells) == 6 and len(cells[1].split(" / ")) == 2 and len(cells[2].split(" / ")) == 2, line
    # B/A of the medians of the CSV's own values (the table's medians are rounded to 3
    # significant digits, too coarse for a ratio near 1), as printed to 3 decimals.
    med = {x: statistics.median(float(r["value"]) for r in rows if r["figure"] == fig and r["binary"] == x) for x in (a, b)}
    assert abs(float(cells[5]) - med[b] / med[a]) <= 5.01e-4, (line, med)
order = [(r["round"], r["binary"]) for r in rows if r["figure"] == "pp_tok_s"]
assert order == [("1", a), ("1", b), ("2", b), ("2", a)], order
print(f"  ok   {len(rows)} values in 2 rounds, A B then B A; medians and B/A in the table")
PY
expect_ab_fail() {
  local rc=0
  python3 "$src/bench/ab.py" "$@" >/dev/null 2>"$tmp/abf.err" || rc=$?
  [[ $rc -ne 0 && $(wc -l <"$tmp/abf.err") -eq 1 && $(cat "$tmp/abf.err") == ab.py:* ]] ||
    die "ab.py $*: expected one 'ab.py: ...' error line, got rc $rc: $(cat "$tmp/abf.err")"
}
expect_ab_fail --a "$tmp/a" --b "$tmp/missing" -- -m "$tmp/tiny.gguf" -p 8 -n 0 -r 1
expect_ab_fail --a "$tmp/a" --b "$tmp/b" -- -m "$tmp/missing.gguf" -p 8 -n 0 -r 1
expect_ab_fail --a "$tmp/a" --b "$tmp/b" --env-a NOEQUALS -- -m "$tmp/tiny.gguf" -p 8 -n 0 -r 1
ok "ab.py: a missing binary, a failing run and a bad --env-a are one-line errors"

say "bench speed --budget: each test's phases, their times adding up to the test's, the products against their limits"
timeout "$(scaled 60)" "$TRELLIS" bench speed -m "$tmp/tiny.gguf" -t 2 -p 32 -n 4 -r 1 -s 2 --limits-quick --budget --json \
  >"$tmp/budget.json" 2>"$tmp/budget.err" || die "bench speed --budget failed: $(cat "$tmp/budget.err")"
python3 - "$tmp/budget.json" "$simd" <<'PY' || die "bench speed --budget: $(cat "$tmp/budget.json")"
import json, sys
j = json.load(open(sys.argv[1])); simd = sys.argv[2] == "1"
b = j["budget"]
assert j["limits"]["clock_hz"] > 0, j["limits"]
want = {"pp": (1, 32, 1 / j["pp_tok_s"] * 32), "tg": (4, 4, 4 / j["tg_tok_s"]), "tg_batched": (4, 8, 8 / j["tg_batched_tok_s"])}
products = ["q/k/v products", "output projection", "gate/up products", "down product", "logits"]
for test, (passes, tokens, seconds) in want.items():
    t = b[test]
    assert (t["passes"], t["tokens"]) == (passes, tokens), (test, t["passes"], t["tokens"])
    phases = {p["phase"]: p for p in t["phases"]}
    for name in products + ["attention", "norms", "activation conversion (of the products)"]:
        assert name in phases and phases[name]["ns_per_pass"] > 0, (test, name, sorted(phases))
    if simd:
        for name in products + ["attention"]:
            assert phases[name]["limit_ns_per_pass"] > 0, (test, name, phases[name])
    total = sum(p["ns_per_pass"] for p in t["phases"]) * passes * 1e-9
    # pp times one pass: the phases add up to it; tg's timed work also samples between
    # passes (on this tiny model as long as the passes): the phases fit within it
    assert (0.9 * seconds if test == "pp" else 0) < total <= 1.01 * seconds, (test, total, seconds)
    assert abs(sum(p["share"] for p in t["phases"]) - 1) < 1e-6, test
print(f"  ok   pp32: {len(b['pp']['phases'])} phases adding up to the pass; products and attention against their limits")
PY

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
