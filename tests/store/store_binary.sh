#!/usr/bin/env bash
# store_binary: trellis-store, the store server as a binary of its own (no engine, no
# OpenAI server linked in), starts, serves a client (the examples' store_roundtrip, on
# the public interface) and stops on SIGTERM; bad flags are one clear line.
# usage: store_binary.sh TRELLIS_STORE STORE_ROUNDTRIP
set -euo pipefail
BIN=$1 ROUNDTRIP=$2
tmp=$(mktemp -d)
pid=
trap '[[ -n $pid ]] && kill -9 "$pid" 2>/dev/null; rm -rf "$tmp"' EXIT
die() { echo "FAIL: $*" >&2; exit 1; }

"$BIN" --listen 127.0.0.1:0 --mem 16M --net-devices lo >"$tmp/log" 2>&1 &
pid=$!
port=
for _ in $(seq 100); do
  port=$(sed -n 's/.*listening on 127\.0\.0\.1:\([0-9]*\),.*/\1/p' "$tmp/log" | head -1)
  [[ -n $port ]] && break
  kill -0 "$pid" 2>/dev/null || die "trellis-store exited: $(cat "$tmp/log")"
  sleep 0.1
done
[[ -n $port ]] || die "trellis-store did not say where it listens: $(cat "$tmp/log")"
echo "  ok   listening on $port"
UCX_NET_DEVICES=lo timeout 60 "$ROUNDTRIP" "127.0.0.1:$port" >"$tmp/rt" 2>&1 || die "store_roundtrip: $(cat "$tmp/rt")"
grep -q "^get: 2 of 2 blocks read back identical" "$tmp/rt" || die "$(cat "$tmp/rt")"
echo "  ok   $(head -1 "$tmp/rt")"
kill -TERM "$pid"
wait "$pid" || die "trellis-store exited non-zero on SIGTERM: $(tail -3 "$tmp/log")"
pid=
echo "  ok   stopped on SIGTERM"
rc=0
"$BIN" --mem nonsense >/dev/null 2>"$tmp/err" || rc=$?
[[ $rc -ne 0 && $rc -lt 128 && $(wc -l <"$tmp/err") -eq 1 ]] || die "bad --mem: rc $rc, $(cat "$tmp/err")"
echo "  ok   $(cat "$tmp/err")"
echo "PASS"
