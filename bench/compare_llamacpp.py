#!/usr/bin/env python3
"""Side-by-side speed: `trellis bench speed` against llama.cpp's llama-bench.

Runs both on the same GGUF files and threads, alternating rounds so that the machine's
drifting memory bandwidth hits both equally, and reports medians of all runs plus the
ratio. llama.cpp is not part of Trellis: build it yourself, outside this repository,
and pass --llama-bench PATH.

  bench/compare_llamacpp.py --llama-bench ~/llama.cpp/build/bin/llama-bench \\
      --models tinyllama-q4_0.gguf tinyllama-q4_k_m.gguf --rounds 3 --csv results/compare.csv

With -d N both run their tests after N cached tokens (long contexts: attention over the
cache dominates there). With --kv T both keep K and V as T (trellis -ctk/-ctv, llama-bench
-ctk/-ctv; give llama.cpp '-fa 1' too, which a quantized V needs).
"""
import argparse, csv, json, os, statistics, subprocess, sys


# The CPU model and kernel path trellis reports (bench speed --json), for every CSV row.
TRELLIS_INFO = {}


def run_trellis(trellis, model, threads, pp, tg, reps, depth, extra, kv):
    out = subprocess.run([trellis, "bench", "speed", "-m", model, "-t", str(threads), "-p", str(pp), "-n", str(tg),
                          "-r", str(reps), "-d", str(depth), "--cache-type-k", kv, "--cache-type-v", kv, "--json"],
                         check=True, capture_output=True, text=True).stdout
    j = json.loads(out.strip().splitlines()[-1])
    TRELLIS_INFO.update({"cpu": j.get("cpu", "?"), "isa": j.get("isa", "?")})
    return j["pp_runs"], j["tg_runs"]


def run_llamacpp(llama_bench, model, threads, pp, tg, reps, depth, extra, kv):
    pp_runs, tg_runs = [], []
    out = subprocess.run([llama_bench, "-m", model, "-t", str(threads), "-p", str(pp), "-n", str(tg), "-r", str(reps),
                          "-d", str(depth), "-ctk", kv, "-ctv", kv, "-o", "json", *extra],
                         check=True, capture_output=True, text=True).stdout
    for rec in json.loads(out):
        samples = rec.get("samples_ts") or [rec["avg_ts"]]
        if rec.get("n_prompt", 0) > 0 and rec.get("n_gen", 0) == 0:
            pp_runs += samples
        elif rec.get("n_gen", 0) > 0 and rec.get("n_prompt", 0) == 0:
            tg_runs += samples
    return pp_runs, tg_runs


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--trellis", default=os.path.join(os.path.dirname(__file__), "..", "build", "trellis"))
    ap.add_argument("--llama-bench", required=True)
    ap.add_argument("--models", nargs="+", required=True)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("-p", type=int, default=512)
    ap.add_argument("-n", type=int, default=64)
    ap.add_argument("-d", "--depth", type=int, nargs="+", default=[0],
                    help="tokens already in the KV cache before each test (llama-bench -d; trellis bench speed -d); "
                         "several give one row per depth")
    ap.add_argument("--kv", nargs="+", default=["f16"], help="K/V cache types (f16, q8_0, q4_0): one row per type")
    ap.add_argument("--llama-args", default="", help="extra llama-bench arguments, space-separated (e.g. '-fa 1')")
    ap.add_argument("--reps", type=int, default=3, help="repetitions per tool per round")
    ap.add_argument("--rounds", type=int, default=3, help="alternating rounds")
    ap.add_argument("--csv")
    a = ap.parse_args()
    rows = []
    for model, kv, depth in [(m, k, d) for m in a.models for k in a.kv for d in a.depth]:
        runs = {"trellis": ([], []), "llama.cpp": ([], [])}
        for r in range(a.rounds):
            order = [("trellis", run_trellis, a.trellis), ("llama.cpp", run_llamacpp, a.llama_bench)]
            if r % 2:
                order.reverse()
            for name, fn, exe in order:
                pp, tg = fn(exe, model, a.threads, a.p, a.n, a.reps, depth, a.llama_args.split(), kv)
                runs[name][0].extend(pp)
                runs[name][1].extend(tg)
                print(f"# {os.path.basename(model)} kv {kv} d{depth} round {r + 1} {name}: pp {statistics.median(pp):.1f} "
                      f"tg {statistics.median(tg):.1f}", file=sys.stderr)
        med = {k: (statistics.median(v[0]), statistics.median(v[1])) for k, v in runs.items()}
        rows.append({"model": os.path.basename(model), "threads": a.threads, "depth": depth, "kv": kv,
                     "llama_args": a.llama_args or "-",
                     "cpu": TRELLIS_INFO.get("cpu", "?"), "trellis_isa": TRELLIS_INFO.get("isa", "?"),
                     "trellis_isa_env": " ".join(f"{k}={os.environ[k]}" for k in ("TRELLIS_ISA", "TRELLIS_AVXVNNI")
                                                 if k in os.environ) or "-",
                     f"trellis_pp{a.p}": round(med["trellis"][0], 2), f"llamacpp_pp{a.p}": round(med["llama.cpp"][0], 2),
                     "pp_ratio": round(med["trellis"][0] / med["llama.cpp"][0], 3),
                     f"trellis_tg{a.n}": round(med["trellis"][1], 2), f"llamacpp_tg{a.n}": round(med["llama.cpp"][1], 2),
                     "tg_ratio": round(med["trellis"][1] / med["llama.cpp"][1], 3),
                     "runs_each": len(runs["trellis"][0]), "model_bytes": os.path.getsize(model),
                     # every run, space-separated, so the medians can be checked from the file
                     **{f"{k.replace('.', '')}_{t}_runs": " ".join(f"{x:.2f}" for x in runs[k][i])
                        for k in runs for i, t in ((0, "pp"), (1, "tg"))}})
    keys = list(rows[0].keys())
    print("| " + " | ".join(keys) + " |")
    print("|" + "---|" * len(keys))
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
