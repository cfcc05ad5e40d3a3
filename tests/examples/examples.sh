#!/usr/bin/env bash
# examples: the programs in examples/, built on include/trellis alone, do what they say.
# generate's answers are the ids `trellis run` gives for the same prompts (greedy), the
# ones decoded side by side on threads too, and the later prompts find the shared
# instructions in the prefix cache; store_roundtrip stores, finds and reads back blocks
# through a real `trellis store` server.
# usage: examples.sh TRELLIS EXAMPLES_DIR DATA_DIR
set -euo pipefail
TRELLIS=$1 EXAMPLES=$2 DATA=$3
source "$(dirname "$0")/../server/lib.sh"

m=$tmp/tiny.gguf
timeout 30 "$TRELLIS" gen-model --shape tiny --type q4_0 -o "$m" 2>/dev/null || die "gen-model failed"

say "generate: three questions behind shared instructions, two of them on threads at once"
questions=("What is a prefix cache?" "Why batch decoding?" "Name a colour.")
timeout 60 "$EXAMPLES/generate" "$m" "${questions[@]}" >"$tmp/gen.out" 2>"$tmp/gen.err" \
  || die "generate failed: $(cat "$tmp/gen.err") $(cat "$tmp/gen.out")"
for i in 0 1 2; do
  prompt=$(python3 -c 'import sys; print("You are a careful assistant. Answer in one short sentence. " + "Think about the question before you answer it. " * 8 + sys.argv[1], end="")' "${questions[$i]}")
  want=$(timeout 30 "$TRELLIS" run -m "$m" -p "$prompt" -n 16 --temp 0 --print-token-ids -q)
  got=$(awk -v q="question $i:" '$0 ~ "^"q {getline; sub(/^ids: ?/, ""); print; exit}' "$tmp/gen.out")
  [[ -n $want && $got == "$want" ]] || die "question $i: the example gave '$got', trellis run '$want'"
  ok "question $i: $got"
done
for i in 1 2; do
  cached=$(sed -n "s/^question $i: .* \([0-9]*\) cached.*/\1/p" "$tmp/gen.out")
  [[ ${cached:-0} -gt 0 ]] || die "question $i found nothing in the prefix cache: $(grep "^question $i" "$tmp/gen.out")"
done
ok "questions 1 and 2 took the instructions from the cache: $(grep -c ' cached' "$tmp/gen.out") receipts"
grep -q "^streamed: stop after 4 pieces" "$tmp/gen.out" || die "a sink returning false did not stop the stream: $(tail -2 "$tmp/gen.out")"
ok "a sink returning false stops the generation"

say "generate: a model that is not there is a clear error"
rc=0
timeout 30 "$EXAMPLES/generate" "$tmp/missing.gguf" >/dev/null 2>"$tmp/miss.err" || rc=$?
[[ $rc -eq 1 ]] && grep -q "NOT_FOUND" "$tmp/miss.err" || die "rc $rc: $(cat "$tmp/miss.err")"
ok "$(cat "$tmp/miss.err")"

say "store_roundtrip against a trellis store server"
start_store store
timeout 60 "$EXAMPLES/store_roundtrip" "$store_addr" >"$tmp/st.out" 2>"$tmp/st.err" \
  || die "store_roundtrip failed: $(cat "$tmp/st.err") $(cat "$tmp/st.out")"
grep -q "^put: 3 blocks stored" "$tmp/st.out" || die "$(cat "$tmp/st.out")"
grep -q "^lookup: 2 blocks" "$tmp/st.out" || die "$(cat "$tmp/st.out")"
grep -q "^get: 2 of 2 blocks read back identical" "$tmp/st.out" || die "$(cat "$tmp/st.out")"
ok "$(tr '\n' ';' <"$tmp/st.out")"

say "store_roundtrip: no server there is a clear error, not a hang"
rc=0
timeout 30 "$EXAMPLES/store_roundtrip" 127.0.0.1:1 >/dev/null 2>"$tmp/st2.err" || rc=$?
[[ $rc -eq 1 ]] || die "rc $rc: $(cat "$tmp/st2.err")"
ok "$(cat "$tmp/st2.err")"
echo "PASS: $n_checks checks"
