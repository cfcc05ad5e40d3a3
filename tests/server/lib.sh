# Shared helpers for the `trellis serve` end-to-end tests. Source after setting TRELLIS and
# DATA: TRELLIS=$1 DATA=$2; source "$(dirname "$0")/lib.sh"
# Gives everything tests/cli/lib.sh gives, plus a tiny model ($model), start_server /
# stop_server (servers bind port 0 and report the port they got, so parallel tests never
# collide), and jget (python3 stdlib JSON queries).
source "$(dirname "${BASH_SOURCE[0]}")/../cli/lib.sh"
srv_pids=()
trap 'for p in "${srv_pids[@]}"; do kill -9 "$p" 2>/dev/null || true; done; rm -rf "$tmp"' EXIT

model=$tmp/tiny-q4_0.gguf
timeout "$(scaled 30)" "$TRELLIS" gen-model --shape tiny --type q4_0 -o "$model" >/dev/null 2>"$tmp/gen.err" \
  || die "gen-model: $(cat "$tmp/gen.err")"

# start_server NAME [serve options...]: starts a server, waits for /health, sets $base
# (http://127.0.0.1:PORT) and $srv_pid; the log is $tmp/NAME.log.
# wait_port NAME PID SED_EXPR: the port a process prints in $tmp/NAME.log (SED_EXPR
# captures it as \1), waiting up to 20 s (scaled); dies if the process exits or prints none.
wait_port() {
  local name=$1 pid=$2 expr=$3 port=""
  for _ in $(seq 1 "$(scaled 200)"); do
    port=$(sed -n "s|$expr|\\1|p" "$tmp/$name.log" | head -1 || true)
    [[ -n $port ]] && break
    kill -0 "$pid" 2>/dev/null || die "$name exited at start-up: $(cat "$tmp/$name.log")"
    sleep 0.1
  done
  [[ -n $port ]] || die "$name printed no address: $(cat "$tmp/$name.log")"
  echo "$port"
}

start_server() {
  local name=$1; shift
  : >"$tmp/$name.log"
  "$TRELLIS" serve -m "$model" --port 0 "$@" >"$tmp/$name.log" 2>&1 &
  srv_pid=$!
  srv_pids+=("$srv_pid")
  local port
  port=$(wait_port "$name" "$srv_pid" '.*listening on http://127\.0\.0\.1:\([0-9]*\).*') || exit 1
  base=http://127.0.0.1:$port
  curl -sf --retry 20 --retry-delay 0 --retry-connrefused -m 5 "$base/health" >/dev/null || die "server $name: /health did not answer"
}

# stop_server: SIGTERM, then the server must exit 0 within 10 s (scaled).
stop_server() {
  local pid=${1:-$srv_pid} rc=0
  kill -TERM "$pid"
  for _ in $(seq 1 "$(scaled 100)"); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
  kill -0 "$pid" 2>/dev/null && die "server $pid did not exit within $(scaled 10) s of SIGTERM"
  wait "$pid" || rc=$?
  [[ $rc -eq 0 ]] || die "server exited with $rc after SIGTERM"
}

# jget FILE EXPR: prints the python expression EXPR over j = the JSON in FILE.
jget() { python3 -c "import json,sys; j=json.load(open(sys.argv[1])); print($2)" "$1"; }

# post PATH BODY OUT [curl args...]: POSTs JSON, writes the body to OUT, prints the status.
post() {
  local path=$1 body=$2 out=$3; shift 3
  curl -s -m 30 -o "$out" -w '%{http_code}' -H 'Content-Type: application/json' "$@" -d "$body" "$base$path"
}

# metric NAME: the value of an unlabelled metric from /metrics.
metric() { curl -s -m 5 "$base/metrics" | awk -v n="$1" '$1 == n {print $2}'; }

# start_store NAME [store options...]: sets $store_addr and $store_pid.
start_store() {
  local name=$1; shift
  "$TRELLIS" store --listen "127.0.0.1:${store_port:-0}" --mem 64M --net-devices lo "$@" >"$tmp/$name.log" 2>&1 &
  store_pid=$!
  srv_pids+=("$store_pid")
  local port
  port=$(wait_port "$name" "$store_pid" '.*listening on 127\.0\.0\.1:\([0-9]*\),.*') || exit 1
  store_addr=127.0.0.1:$port
}
