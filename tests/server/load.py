"""64 concurrent clients against `trellis serve`, sharing a system prompt.

usage: load.py BASE_URL [N_CLIENTS] [REQUESTS_PER_CLIENT]
Each client sends chat requests (alternately streamed and not) and checks every answer:
HTTP 200, a well-formed body or stream ending in [DONE], and usage fields. Prints one
summary line; exits 1 on any error. Python stdlib only.
"""
import json
import sys
import threading
import time
import urllib.request

BASE = sys.argv[1]
N = int(sys.argv[2]) if len(sys.argv) > 2 else 64
PER = int(sys.argv[3]) if len(sys.argv) > 3 else 2
SYSTEM = ("You are the support assistant of a small bakery. Be friendly, answer in one or two "
          "sentences, mention opening hours (8 to 18) when relevant and never invent prices.")

errors, usages, ttfts = [], [], []
lock = threading.Lock()


def one(client, k):
    stream = (client + k) % 2 == 1
    body = {"messages": [{"role": "system", "content": SYSTEM},
                         {"role": "user", "content": f"Client {client} question {k}: are you open?"}],
            "max_tokens": 12, "temperature": 0.7, "seed": client}
    if stream:
        body["stream"] = True
        body["stream_options"] = {"include_usage": True}
    req = urllib.request.Request(BASE + "/v1/chat/completions", data=json.dumps(body).encode(),
                                 headers={"Content-Type": "application/json"})
    t0 = time.time()
    with urllib.request.urlopen(req, timeout=120) as r:
        if r.status != 200:
            raise RuntimeError(f"HTTP {r.status}")
        if not stream:
            j = json.load(r)
            assert j["choices"][0]["finish_reason"] in ("stop", "length"), j
            return j["usage"], time.time() - t0
        first, usage, done = None, None, False
        for raw in r:
            line = raw.decode().rstrip("\n")
            if not line.startswith("data: "):
                continue
            if line == "data: [DONE]":
                done = True
                break
            ev = json.loads(line[6:])
            if "error" in ev:
                raise RuntimeError(ev["error"])
            if first is None:
                first = time.time() - t0
            if ev.get("usage"):
                usage = ev["usage"]
        assert done and usage, "stream ended without usage or [DONE]"
        return usage, first


def client(i):
    for k in range(PER):
        try:
            u, t = one(i, k)
            assert u["total_tokens"] == u["prompt_tokens"] + u["completion_tokens"], u
            assert 0 <= u["prompt_tokens_details"]["cached_tokens"] <= u["prompt_tokens"], u
            with lock:
                usages.append(u)
                ttfts.append(t)
        except Exception as e:  # noqa: BLE001 - every failure is reported
            with lock:
                errors.append(f"client {i} request {k}: {e!r}")


t0 = time.time()
threads = [threading.Thread(target=client, args=(i,)) for i in range(N)]
for t in threads:
    t.start()
for t in threads:
    t.join()
wall = time.time() - t0
prompt = sum(u["prompt_tokens"] for u in usages)
cached = sum(u["prompt_tokens_details"]["cached_tokens"] for u in usages)
ttfts.sort()
p50 = ttfts[len(ttfts) // 2] if ttfts else 0
p99 = ttfts[min(len(ttfts) - 1, int(len(ttfts) * 0.99))] if ttfts else 0
print(f"load: {len(usages)}/{N * PER} ok, {len(errors)} errors in {wall:.1f} s ({len(usages) / wall:.1f} req/s); "
      f"cached {cached}/{prompt} prompt tokens ({100.0 * cached / max(prompt, 1):.0f}%); "
      f"TTFT p50 {p50 * 1e3:.0f} ms p99 {p99 * 1e3:.0f} ms")
for e in errors[:10]:
    print("  " + e)
if errors or len(usages) != N * PER:
    sys.exit(1)
if cached == 0:
    print("  no prompt token was ever served from the cache")
    sys.exit(1)
