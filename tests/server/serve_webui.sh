#!/usr/bin/env bash
# server_webui: the chat page at / in headless Chromium (Debian's chromium, driven by the
# puppeteer-core npm package: node/webui_test.mjs), against a server without and one with
# an API key; curl checks of what the page may serve (no path escapes, --no-webui,
# --webui-path). Screenshots go to $TRELLIS_ARTIFACTS (default build/test-artifacts).
# usage: serve_webui.sh TRELLIS DATA_DIR
set -euo pipefail
TRELLIS=$1 DATA=$2
source "$(dirname "$0")/lib.sh"
node_dir=$(cd "$(dirname "$0")/node" && pwd)
shots=${TRELLIS_ARTIFACTS:-$(cd "$(dirname "$TRELLIS")" && pwd)/test-artifacts}
mkdir -p "$shots"

command -v node >/dev/null || die "node is not installed (scripts/setup.sh installs nodejs and npm)"
command -v chromium >/dev/null || die "chromium is not installed (scripts/setup.sh installs Debian's chromium)"
if [[ ! -f $node_dir/node_modules/puppeteer-core/package.json ]]; then
  say "npm ci (puppeteer-core and the other clients)"
  (cd "$node_dir" && timeout 300 npm ci --no-audit --no-fund --loglevel=error) >"$tmp/npm.log" 2>&1 \
    || die "npm ci failed: $(tail -5 "$tmp/npm.log")"
fi

start_server webui-keyed --api-key webui-key
keyed=$base
start_server webui
say "the page in headless Chromium: streams, cached tokens in the receipt, kept across a reload, the API key asked"
(cd "$node_dir" && timeout 120 node webui_test.mjs "$base" "$keyed" webui-key "$shots") | tee "$tmp/webui.out" \
  || die "webui test failed (server logs: $tmp/webui.log $tmp/webui-keyed.log)"

say "what the page serves: its two files, nothing else"
code=$(curl -s -o "$tmp/page.html" -w '%{http_code}' "$base/")
[[ $code == 200 ]] && grep -q '<title>Trellis</title>' "$tmp/page.html" || die "GET / gave $code"
curl -sI "$base/" | grep -qi '^content-security-policy: default-src .self.' || die "GET / has no Content-Security-Policy"
code=$(curl -s -o /dev/null -w '%{http_code}' "$keyed/") ; [[ $code == 200 ]] || die "GET / of a keyed server gave $code (the page asks for the key)"
for p in /webui/..%2F..%2Fetc%2Fpasswd /webui/.hidden /webui/nope.js "/webui/a/b" /webui/; do
  code=$(curl -s -o /dev/null -w '%{http_code}' "$base$p")
  [[ $code == 404 ]] || die "GET $p gave $code, not 404"
done
ok "GET / and /webui/marked.min.js; 404 for escapes, hidden and unknown files"
stop_server
stop_server "${srv_pids[0]}"

start_server webui-off --no-webui
code=$(curl -s -o /dev/null -w '%{http_code}' "$base/")
[[ $code == 404 ]] || die "--no-webui: GET / gave $code"
stop_server
mkdir -p "$tmp/ui"
echo '<!doctype html><title>mine</title>' >"$tmp/ui/index.html"
echo 'x' >"$tmp/ui/app.js"
start_server webui-path --webui-path "$tmp/ui"
curl -s "$base/" | grep -q '<title>mine</title>' || die "--webui-path: GET / is not the folder's index.html"
curl -sI "$base/webui/app.js" | grep -qi '^content-type: text/javascript' || die "--webui-path: /webui/app.js"
code=$(curl -s -o /dev/null -w '%{http_code}' "$base/webui/marked.min.js")
[[ $code == 404 ]] || die "--webui-path: a file the folder does not hold gave $code"
stop_server
ok "--no-webui answers 404 at /; --webui-path serves the folder instead"
echo "PASS server_webui"
