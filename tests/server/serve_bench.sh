#!/usr/bin/env bash
# server_bench: `trellis bench serve` end to end on the tiny model, against a running
# trellis serve (--url) and against one it starts itself (-m): no errors, and the shared
# system prompt comes from the prefix cache (cached share > 0).
# usage: serve_bench.sh TRELLIS DATA_DIR
set -euo pipefail
TRELLIS=$1 DATA=$2
source "$(dirname "$0")/lib.sh"

check_json() {  # check_json FILE WHAT
  [[ $(jget "$1" "j['errors']") == 0 ]] || die "$2: errors: $(cat "$1")"
  [[ $(jget "$1" "j['requests_ok']") == 6 ]] || die "$2: want 6 requests: $(cat "$1")"
  [[ $(jget "$1" "1 if (j['cached_share'] or 0) > 0 else 0") == 1 ]] || die "$2: nothing cached: $(cat "$1")"
  [[ $(jget "$1" "1 if j['req_s'] > 0 and j['ttft_ms_p50'] > 0 else 0") == 1 ]] || die "$2: no rates: $(cat "$1")"
  ok "$2: $(jget "$1" "'%d ok, cached share %.2f, TTFT p50 %.0f ms' % (j['requests_ok'], j['cached_share'], j['ttft_ms_p50'])")"
}

start_server bench
say "bench serve --url against a running server, chat and completions"
timeout 60 "$TRELLIS" bench serve --url "$base" -C 3 -R 2 -S 64 -M 4 --json -o "$tmp/out" >"$tmp/chat.json" \
  || die "bench serve (chat) failed: $(cat "$tmp/chat.json")"
check_json "$tmp/chat.json" chat
timeout 60 "$TRELLIS" bench serve --url "$base/v1" --completions -C 3 -R 2 -S 64 -M 4 --json -o "$tmp/out" \
  >"$tmp/compl.json" || die "bench serve (completions) failed: $(cat "$tmp/compl.json")"
check_json "$tmp/compl.json" completions
[[ $(wc -l <"$tmp/out/serve.csv") == 3 ]] || die "serve.csv: want a header and 2 rows"
ok "serve.csv has a row per run"
stop_server

say "bench serve -m: starts and stops its own trellis serve"
timeout 60 "$TRELLIS" bench serve -m "$model" -C 3 -R 2 -S 64 -M 4 --json -o "$tmp/own" >"$tmp/own.json" \
  || die "bench serve -m failed: $(cat "$tmp/own.json") $(cat "$tmp/own/server.log")"
check_json "$tmp/own.json" "own server"
grep -q "stopped" "$tmp/own/server.log" || die "the started server was not stopped cleanly: $(cat "$tmp/own/server.log")"
ok "started server stopped"
echo "PASS server_bench: $n_checks checks"
