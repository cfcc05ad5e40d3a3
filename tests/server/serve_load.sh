#!/usr/bin/env bash
# server_load: 64 concurrent clients sharing a system prompt (load.py): no errors, the
# shared prefix is served from the cache, and afterwards nothing is left running or queued.
# usage: serve_load.sh TRELLIS DATA_DIR [N_CLIENTS]
set -euo pipefail
TRELLIS=$1 DATA=$2 N=${3:-64}
source "$(dirname "$0")/lib.sh"

start_server load --max-running 16
say "$N clients x 2 chat requests (half streamed)"
timeout "$(scaled 120)" python3 "$(dirname "$0")/load.py" "$base" "$N" 2 | tee "$tmp/load.out" || die "load test failed"
ok "$(head -1 "$tmp/load.out")"
say "afterwards: nothing running or queued, every request counted"
# The engine publishes its metrics after each step: give the last one a moment.
for _ in $(seq 1 "$(scaled 50)"); do
  [[ $(metric trellis_requests_finished_total) == $((N * 2)) && $(metric trellis_requests_running) == 0 ]] && break
  sleep 0.1
done
[[ $(metric trellis_requests_running) == 0 && $(metric trellis_queue_depth) == 0 ]] || die "left running/queued"
[[ $(metric trellis_requests_finished_total) == $((N * 2)) ]] || die "finished $(metric trellis_requests_finished_total), want $((N * 2))"
ok "hit rate $(metric trellis_cache_hit_rate), preemptions $(metric trellis_preemptions_total)"
stop_server
echo "PASS server_load: $n_checks checks"
