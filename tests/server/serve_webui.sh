#!/usr/bin/env bash
# server_webui: the chat page at / in headless Chromium (Debian's chromium, driven by the
# puppeteer-core npm package: node/webui_test.mjs), against a server without and one with
# an API key, and on a store-backed pair (node/webui_store_test.mjs); curl checks of what
# the page may serve (no path escapes, --no-webui, --webui-path). Screenshots go to
# $TRELLIS_ARTIFACTS (default build/test-artifacts).
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

say "the cache view's endpoint: each key sees its own prefixes' text, only counts and hashes of another's"
start_server webui-tenants --api-key key-a --api-key key-b
python3 - "$base" <<'PY' || die "cache view tenant isolation failed (server log: $tmp/webui-tenants.log)"
import json, sys, urllib.request, urllib.error
base = sys.argv[1]
def call(path, key, body=None):
    req = urllib.request.Request(base + path, data=json.dumps(body).encode() if body else None,
                                 headers={"Content-Type": "application/json", **({"Authorization": "Bearer " + key} if key else {})})
    try:
        with urllib.request.urlopen(req, timeout=60) as r:
            return r.status, json.loads(r.read())
    except urllib.error.HTTPError as e:
        return e.code, json.loads(e.read() or b"{}")
words = " ".join(["lorem ipsum dolor sit amet"] * 12)  # over a block or two
for key, secret in (("key-a", "zebra alpha secret"), ("key-b", "yak beta secret")):
    for shared in ("the same shared opening words " + words, secret + " " + words):
        code, _ = call("/v1/chat/completions", key, {"messages": [{"role": "user", "content": shared}], "max_tokens": 2})
        assert code == 200, code
code, _ = call("/trellis/v1/cache", None)
assert code == 401, f"no key: {code}"
views = {k: call("/trellis/v1/cache", k)[1] for k in ("key-a", "key-b")}
for key, own, other in (("key-a", "zebra", "yak"), ("key-b", "yak", "zebra")):
    v = views[key]
    assert v["version"] == 1 and v["pool"]["blocks"] > 0, v
    mine = [n for n in v["nodes"] if n["mine"]]
    theirs = [n for n in v["nodes"] if not n["mine"]]
    assert mine and theirs, (key, v["nodes"])
    text = " ".join(n.get("text", "") for n in v["nodes"])
    assert own in text and other not in text, (key, text[:300])
    assert all("text" not in n for n in theirs), theirs
# The same text cached under both keys: different hashes (a hash must not confirm a guess).
a_hashes = {n["hash"] for n in views["key-a"]["nodes"] if n["mine"]}
b_hashes = {n["hash"] for n in views["key-b"]["nodes"] if n["mine"]}
assert not (a_hashes & b_hashes), "a node hash is the same under two keys"
print(f"  ok   {len(views['key-a']['nodes'])} nodes; each key reads its own text only; hashes differ across keys")
PY
stop_server

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

say "a store-backed pair in the browser: node 2 reads node 1's conversation from the store; its cache view shows the store"
export UCX_NET_DEVICES=lo
start_store webui-store-a
a_addr=$store_addr
start_store webui-store-b --peers "$a_addr"
start_server webui-node1 --store "$a_addr" --store-peers "$store_addr" --store-net-devices lo
base1=$base
start_server webui-node2 --store "$store_addr" --store-net-devices lo
(cd "$node_dir" && timeout 120 node webui_store_test.mjs "$base1" "$base" "$shots") | tee "$tmp/webui-store.out" \
  || die "webui store test failed (server logs: $tmp/webui-node1.log $tmp/webui-node2.log)"
echo "PASS server_webui"
