#!/usr/bin/env python3
"""`trellis bench serve` side by side: trellis serve and llama.cpp's llama-server under the
same workload, alternating (trellis, llama.cpp -np 4, llama.cpp -np 1, then again), each
run on a freshly started server; prints the median of each metric per server as a
markdown table and keeps every run's JSON in OUT/runs.jsonl.

Both servers render the same chat prompt: trellis serve uses zephyr (the model has no
chat template) and llama-server is given TinyLlama-Chat's own Jinja template
(tests/data/templates/TinyLlama-1.1B-Chat-v1.0.jinja), which renders the identical text.
(`--chat-template zephyr` is no substitute: with Jinja on, the default, llama-server takes
the name as the template text itself; with --no-jinja its built-in zephyr writes
<|endoftext|> where TinyLlama's template writes </s>.) llama-server gets --ban-bytes
(logit_bias on ids 0..258): with random weights it answers HTTP 500 otherwise.

  bench/serve_compare.py --trellis build/trellis --llama-server ~/llama.cpp/build/bin/llama-server \\
      -m tinyllama-q4_0.gguf -C 4 -R 3 -S 400 -M 32 --rounds 3 -o results/serve-compare
"""
import argparse, json, os, statistics, subprocess, sys, time, urllib.request

HERE = os.path.dirname(os.path.abspath(__file__))
TEMPLATE = os.path.join(HERE, "..", "tests", "data", "templates", "TinyLlama-1.1B-Chat-v1.0.jinja")


def bench(a, extra, label):
    cmd = [a.trellis, "bench", "serve", "-C", str(a.C), "-R", str(a.R), "-S", str(a.S), "-M", str(a.M),
           "--label", label, "-o", a.out, "--json"] + extra
    print("$ " + " ".join(cmd), file=sys.stderr, flush=True)
    p = subprocess.run(cmd, capture_output=True, text=True)
    if not p.stdout.strip():
        sys.exit(f"bench serve failed: {p.stderr}")
    j = json.loads(p.stdout.strip().splitlines()[-1])
    print(f"  {label}: {j['req_s']:.3f} req/s, TTFT p50 {j['ttft_ms_p50']:.0f} ms p99 {j['ttft_ms_p99']:.0f} ms, "
          f"cached {j['cached_share']}, errors {j['errors']}", file=sys.stderr, flush=True)
    return j


def run_trellis(a):
    return bench(a, ["-m", a.model, "-t", str(a.threads)], "trellis")


def run_llama(a, n_parallel):
    cmd = [a.llama_server, "-m", a.model, "-t", str(a.threads), "-c", str(a.ctx), "-np", str(n_parallel),
           "--host", "127.0.0.1", "--port", str(a.port), "--no-webui", "--jinja", "--chat-template-file", TEMPLATE]
    print("$ " + " ".join(cmd), file=sys.stderr, flush=True)
    log = open(os.path.join(a.out, f"llama-server-np{n_parallel}.log"), "w")
    srv = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT)
    try:
        for _ in range(600):
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{a.port}/health", timeout=1) as r:
                    if r.status == 200:
                        break
            except Exception:
                time.sleep(0.2)
        else:
            sys.exit("llama-server did not become healthy")
        return bench(a, ["--url", f"http://127.0.0.1:{a.port}", "--ban-bytes"], f"llama.cpp -np {n_parallel}")
    finally:
        srv.terminate()
        srv.wait(timeout=30)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--trellis", default=os.path.join(HERE, "..", "build", "trellis"))
    ap.add_argument("--llama-server", required=True)
    ap.add_argument("-m", "--model", required=True)
    ap.add_argument("-C", type=int, default=4)
    ap.add_argument("-R", type=int, default=3)
    ap.add_argument("-S", type=int, default=400)
    ap.add_argument("-M", type=int, default=32)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--ctx", type=int, default=16384, help="llama-server -c (shared by its slots)")
    ap.add_argument("--parallel", default="4,1", help="llama-server -np values to run")
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--port", type=int, default=18932)
    ap.add_argument("-o", "--out", default="results/serve-compare")
    a = ap.parse_args()
    os.makedirs(a.out, exist_ok=True)
    runs = {}
    with open(os.path.join(a.out, "runs.jsonl"), "a") as f:
        for _ in range(a.rounds):
            for name, fn in [("trellis", run_trellis)] + [
                    (f"llama.cpp -np {n}", (lambda a, n=int(n): run_llama(a, n))) for n in a.parallel.split(",")]:
                j = fn(a)
                f.write(json.dumps(j) + "\n")
                f.flush()
                runs.setdefault(name, []).append(j)
    med = lambda rs, k: statistics.median(r[k] for r in rs)
    print(f"C = {a.C} clients x R = {a.R} requests, system prompt {runs['trellis'][0]['system_tokens']} tokens, "
          f"max_tokens {a.M}, {a.threads} threads; median of {a.rounds} alternating runs\n")
    print("| server | requests/s | generated tok/s | TTFT p50 ms | TTFT p90 ms | TTFT p99 ms | inter-token ms "
          "| cached share | prompt tokens | generated tokens | errors |")
    print("|---|---|---|---|---|---|---|---|---|---|---|")
    for name, rs in runs.items():
        share = [r["cached_share"] for r in rs if r["cached_share"] is not None]
        print(f"| {name} | {med(rs, 'req_s'):.3f} | {med(rs, 'gen_tok_s'):.2f} | {med(rs, 'ttft_ms_p50'):.0f} "
              f"| {med(rs, 'ttft_ms_p90'):.0f} | {med(rs, 'ttft_ms_p99'):.0f} | {med(rs, 'itl_ms_mean'):.1f} "
              f"| {'%.1f%%' % (100 * statistics.median(share)) if share else 'n/a'} | {rs[0]['prompt_tokens']} "
              f"| {rs[0]['completion_tokens']} | {sum(r['errors'] for r in rs)} |")


if __name__ == "__main__":
    main()
