#!/usr/bin/env python3
"""llama.cpp server's prompt cache on the `trellis bench prefix` grid. Starts an
llama-server you built elsewhere on 127.0.0.1, sends token-id prompts, and measures:

  ttft        concurrency 1, -np 1: warm with S (L tokens), then a probe sharing the first
              round(phi*L/32)*32 tokens, n_predict 1; wall time of the probe (median).
  concurrent  -np N: warm S[0:P] once, then N sessions (S[0:P] + own suffix, L tokens,
              D generated) sent at once; wall time and prompt tokens computed.

Not a like-for-like comparison with `trellis bench prefix` (docs/BENCHMARKS.md): the ids
come from this script's RNG, not the ones trellis draws (only lengths and shared
fractions match), and times here are HTTP round trips, trellis's are in process.

Random-weight models need byte/control tokens banned (logit_bias on ids 0..258) or the
server fails on un-decodable output (it answers 500 on broken UTF-8).

  bench/llamacpp_server_prefix.py --server ~/llama.cpp/build/bin/llama-server \\
      -m tinyllama-q4_0.gguf --mode ttft --csv results/llamacpp_ttft.csv
"""
import argparse, concurrent.futures, csv, json, os, random, statistics, subprocess, sys, time, urllib.request

BAN = [[i, False] for i in range(259)]


def post(port, body, timeout=600):
    req = urllib.request.Request(f"http://127.0.0.1:{port}/completion", data=json.dumps(body).encode(),
                                 headers={"Content-Type": "application/json"})
    t0 = time.time()
    with urllib.request.urlopen(req, timeout=timeout) as r:
        out = json.loads(r.read())
    return time.time() - t0, out


def start(server, model, port, threads, n_parallel, ctx):
    p = subprocess.Popen([server, "-m", model, "-t", str(threads), "-c", str(ctx), "-np", str(n_parallel),
                          "--host", "127.0.0.1", "--port", str(port), "--no-webui"],
                         stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    for _ in range(600):
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=1) as r:
                if r.status == 200:
                    return p
        except Exception:
            time.sleep(0.2)
    p.kill()
    sys.exit("llama-server did not become healthy")


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--server", required=True)
    ap.add_argument("-m", "--model", required=True)
    ap.add_argument("--mode", choices=["ttft", "concurrent"], default="ttft")
    ap.add_argument("-L", type=int, default=512)
    ap.add_argument("-D", type=int, default=64)
    ap.add_argument("-N", type=int, default=4)
    ap.add_argument("-B", type=int, default=32)
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--port", type=int, default=18931)
    ap.add_argument("--csv")
    a = ap.parse_args()
    rng = random.Random(1234)
    system = [rng.randrange(300, 32000) for _ in range(4096)]
    phis = [0, 0.1, 0.25, 0.5, 0.75, 0.9]
    rows = []
    n_par = 1 if a.mode == "ttft" else a.N
    srv = start(a.server, a.model, a.port, a.threads, n_par, 8192 if a.mode == "ttft" else 8192 * n_par // 2)
    try:
        for phi in phis:
            P = min(round(phi * a.L / a.B) * a.B, a.L)
            if a.mode == "ttft":
                times, cached = [], []
                for r in range(a.reps):
                    warm = system[: a.L]
                    post(a.port, {"prompt": warm, "n_predict": 1, "cache_prompt": True, "logit_bias": BAN})
                    probe = system[:P] + [rng.randrange(300, 32000) for _ in range(a.L - P)]
                    dt, out = post(a.port, {"prompt": probe, "n_predict": 1, "cache_prompt": True, "logit_bias": BAN})
                    times.append(dt * 1e3)
                    cached.append(out.get("tokens_cached", 0) - out.get("timings", {}).get("prompt_n", 0))
                row = {"phi": phi, "prefix_tokens": P, "ttft_ms": round(statistics.median(times), 1),
                       "prompt_tokens_computed": a.L - statistics.median(cached) if cached else None}
            else:
                post(a.port, {"prompt": system[:P] if P else system[:1], "n_predict": 1, "cache_prompt": True, "logit_bias": BAN})
                prompts = [system[:P] + [rng.randrange(300, 32000) for _ in range(a.L - P)] for _ in range(a.N)]
                t0 = time.time()
                with concurrent.futures.ThreadPoolExecutor(a.N) as ex:
                    outs = list(ex.map(lambda p: post(a.port, {"prompt": p, "n_predict": a.D, "cache_prompt": True,
                                                                "ignore_eos": True, "logit_bias": BAN})[1], prompts))
                wall = time.time() - t0
                computed = sum(o.get("timings", {}).get("prompt_n", a.L) for o in outs)
                row = {"phi": phi, "prefix_tokens": P, "wall_s": round(wall, 2),
                       "prompt_tokens_computed": computed, "gen_tok_s": round(a.N * a.D / wall, 2)}
            rows.append(row)
            print(json.dumps(row), file=sys.stderr)
    finally:
        srv.terminate()
        srv.wait()
    keys = list(rows[0].keys())
    print("| " + " | ".join(keys) + " |\n|" + "---|" * len(keys))
    for row in rows:
        print("| " + " | ".join(str(row[k]) for k in keys) + " |")
    if a.csv:
        os.makedirs(os.path.dirname(a.csv) or ".", exist_ok=True)
        with open(a.csv, "w", newline="") as f:
            w = csv.DictWriter(f, fieldnames=keys)
            w.writeheader()
            w.writerows(rows)


if __name__ == "__main__":
    main()
