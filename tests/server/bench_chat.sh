#!/usr/bin/env bash
# server_bench_chat: `trellis bench chat` end to end on the tiny model, with a trellis
# serve it starts itself (-m) and against a running one (--url, two conversations): the
# table prints, no turn fails, and prefix reuse works to the token through HTTP and the
# chat template: every turn after the first finds at least the previous turn's whole
# prompt in the cache (less SLACK tokens for a template that re-renders the boundary
# differently). `trellis bench agent` the same way: each turn a forced tool call, the next
# carrying it and its result, the tool definitions shared by the agents.
# usage: bench_chat.sh TRELLIS DATA_DIR
set -euo pipefail
TRELLIS=$1 DATA=$2
source "$(dirname "$0")/lib.sh"
SLACK=3

# check_reuse CSV WHAT: no errors; turn t > 1 has cached >= prompt(t-1) - SLACK in every
# conversation.
check_reuse() {
  python3 - "$1" "$SLACK" <<'EOF' || die "$2: $(cat "$1")"
import csv, sys
rows = [r for r in csv.DictReader(l for l in open(sys.argv[1]) if not l.startswith("#"))]
slack = int(sys.argv[2])
assert rows, "no rows"
prev = {}
for r in rows:
    assert r["error"] == "", f"turn failed: {r}"
    c, t = r["conversation"], int(r["turn"])
    p, k, g = int(r["prompt_tokens"]), int(r["cached_tokens"]), int(r["completion_tokens"])
    assert g > 0 and float(r["ttft_ms"]) > 0, f"no reply or no TTFT: {r}"
    if t > 1:
        assert k >= prev[c] - slack, f"conversation {c} turn {t}: cached {k} < previous prompt {prev[c]} - {slack}"
        print(f"  conversation {c} turn {t}: prompt {p}, cached {k} (previous prompt {prev[c]})")
    prev[c] = p
EOF
  ok "$2: turns 2.. reuse the previous turn's prompt to within $SLACK tokens"
}

say "bench chat -m: starts its own trellis serve, 3 turns"
timeout 60 "$TRELLIS" bench chat -m "$model" -T 3 -o "$tmp/own" >"$tmp/own.md" 2>"$tmp/own.err" \
  || die "bench chat -m failed: $(cat "$tmp/own.md" "$tmp/own.err")"
cat "$tmp/own.md"
grep -q '^| turn | prompt tokens | cached trellis | cached llama-server | TTFT trellis ms | TTFT llama-server ms |$' \
  "$tmp/own.md" || die "no table header"
[[ $(grep -cE '^\| [123] \| [0-9]+ \| [0-9]+ \| - \| [0-9]+ \| - \|$' "$tmp/own.md") == 3 ]] || die "want 3 turn rows"
grep -q '^mean TTFT over turns 2..3: trellis [0-9.]* ms$' "$tmp/own.md" || die "no mean TTFT line"
ok "table with 3 turns and the mean TTFT"
grep -q '^# commit: ' "$tmp/own/chat.csv" && grep -q '^# isa: ' "$tmp/own/chat.csv" \
  && grep -q '^# command: .*bench chat' "$tmp/own/chat.csv" || die "chat.csv header: $(head "$tmp/own/chat.csv")"
[[ $(grep -vc '^#' "$tmp/own/chat.csv") == 4 ]] || die "chat.csv: want a header row and 3 rows"
ok "chat.csv: provenance and a row per turn"
check_reuse "$tmp/own/chat.csv" "own server"
if command -v gnuplot >/dev/null; then
  [[ -s $tmp/own/chat.png ]] || die "no chat.png"
  ok "chat.png"
fi
grep -q "stopped" "$tmp/own/trellis-serve.log" || die "the started server was not stopped cleanly"
ok "started server stopped"

say "bench chat --url: two conversations in parallel against a running server"
start_server chat
timeout 60 "$TRELLIS" bench chat --url "$base/v1" -C 2 -T 3 -S 40 -W 8 -M 6 --json -o "$tmp/url" \
  >"$tmp/url.json" 2>"$tmp/url.err" || die "bench chat --url failed: $(cat "$tmp/url.json" "$tmp/url.err")"
[[ $(jget "$tmp/url.json" "j['errors']") == 0 ]] || die "errors: $(cat "$tmp/url.json")"
[[ $(jget "$tmp/url.json" "[t['ok'] for t in j['servers'][0]['per_turn']]") == "[2, 2, 2]" ]] \
  || die "want 2 conversations x 3 turns: $(cat "$tmp/url.json")"
ok "JSON: 2 conversations x 3 turns"
check_reuse "$tmp/url/chat.csv" "--url"
stop_server

say "bench agent -m: two agents, 3 turns of a forced call and its result over shared tool definitions"
timeout 60 "$TRELLIS" bench agent -m "$model" -C 2 -T 3 -S 300 -M 160 -o "$tmp/agent" >"$tmp/agent.md" 2>"$tmp/agent.err" \
  || die "bench agent failed: $(cat "$tmp/agent.md" "$tmp/agent.err")"
grep -q '^bench agent: [0-9]* tools' "$tmp/agent.err" || die "no tools line: $(cat "$tmp/agent.err")"
check_reuse "$tmp/agent/chat.csv" "agent"
python3 - "$tmp/agent/chat.csv" <<'EOF' || die "agent: $(cat "$tmp/agent/chat.csv")"
import csv, sys
rows = [r for r in csv.DictReader(l for l in open(sys.argv[1]) if not l.startswith("#"))]
first = [r for r in rows if r["turn"] == "1"]
# The tool definitions are one shared prefix: whichever agent came second found them cached.
assert max(int(r["cached_tokens"]) for r in first) >= 300 * 0.8, first
EOF
ok "agent: the second agent's first turn found the tool definitions cached"
echo "PASS server_bench_chat: $n_checks checks"
