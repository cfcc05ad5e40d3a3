#!/usr/bin/env python3
"""A/B of two trellis binaries on `trellis bench speed`: alternating rounds, medians.

This machine is shared and noisy (docs/ROOFLINE.md: the same binary reads 0.51 and 0.60 of
the int8 peak in consecutive minutes), so a change is judged by running the binary before
it (A) and after it (B) in alternation, A B / B A / A B ..., so that drift in the host hits
both alike, and comparing their medians. Every session did this by hand; this does it the
same way each time.

Each run is `BIN bench speed ARGS --json`; the figures compared are the tokens/s of each
test the run has (pp, tg, the batched sessions), their fractions with --limits, and with
--budget every phase's k cycles per layer (`pp:attention`, `tg_batched:logits`, ...).
Prints a table (every round's value, both medians, B/A of the medians) and, with --csv,
writes one row per round, binary and figure.

usage: bench/ab.py --a BIN --b BIN [--rounds N] [--csv FILE] [--env-a K=V ...] [--env-b K=V ...]
                   [--only SUBSTRING ...] -- ARGS...
e.g.   bench/ab.py --a /tmp/base/trellis --b build/trellis --rounds 4 -- \\
           -m tinyllama-q4_0.gguf -t 2 -p 512 -n 0 -r 2 --budget
"""
import argparse
import csv
import json
import os
import statistics
import subprocess
import sys


def figures(run):
    """The comparable numbers of one `bench speed --json` result, by name."""
    out = {}
    for test in ("pp", "tg", "tg_batched"):
        if run.get(f"{test}_tok_s"):  # absent or 0: the run had no such test
            out[f"{test}_tok_s"] = float(run[f"{test}_tok_s"])
            if f"{test}_fraction" in run:
                out[f"{test}_fraction"] = float(run[f"{test}_fraction"])
    for test, budget in (run.get("budget") or {}).items():
        if not budget.get("passes"):
            continue
        for phase in budget["phases"]:
            out[f"{test}:{phase['phase']}"] = phase["cycles_per_layer"] / 1000.0
    return out


def num(x):
    return f"{x:.1f}" if abs(x) >= 10 else f"{x:.3g}"


def run_once(binary, args, env_extra):
    env = dict(os.environ, **env_extra)
    p = subprocess.run([binary, "bench", "speed", *args, "--json"], capture_output=True, text=True, env=env)
    if p.returncode != 0:
        sys.exit(f"ab.py: {binary} bench speed failed (exit {p.returncode}): {p.stderr.strip()}")
    lines = [l for l in p.stdout.splitlines() if l.startswith("{")]
    if len(lines) != 1:
        sys.exit(f"ab.py: expected one JSON line from {binary} (use one model, no --thread-sweep), got {len(lines)}")
    return json.loads(lines[0])


def parse_env(pairs):
    env = {}
    for pair in pairs or []:
        key, sep, value = pair.partition("=")
        if not sep or not key:
            sys.exit(f"ab.py: --env-a/--env-b take KEY=VALUE, not '{pair}'")
        env[key] = value
    return env


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--a", required=True, help="the binary before the change")
    ap.add_argument("--b", required=True, help="the binary after it")
    ap.add_argument("--rounds", type=int, default=3, help="rounds of A and B each (default 3)")
    ap.add_argument("--csv", help="write round,binary,figure,value rows here")
    ap.add_argument("--env-a", action="append", help="KEY=VALUE for A's runs only")
    ap.add_argument("--env-b", action="append", help="KEY=VALUE for B's runs only")
    ap.add_argument("--only", action="append", help="keep the figures whose name contains this")
    ap.add_argument("args", nargs=argparse.REMAINDER, help="-- then the bench speed arguments")
    o = ap.parse_args()
    args = o.args[1:] if o.args[:1] == ["--"] else o.args
    if o.rounds < 1:
        sys.exit("ab.py: --rounds must be at least 1")
    if "--json" in args or "--thread-sweep" in args:
        sys.exit("ab.py: give the bench speed arguments without --json or --thread-sweep")
    for binary in (o.a, o.b):
        if not (os.path.isfile(binary) and os.access(binary, os.X_OK)):
            sys.exit(f"ab.py: '{binary}' is not an executable file")
    sides = {"A": (o.a, parse_env(o.env_a)), "B": (o.b, parse_env(o.env_b))}

    values = {"A": {}, "B": {}}  # side -> figure -> [value per round]
    rows = []
    header = None
    for r in range(o.rounds):
        for side in ("A", "B") if r % 2 == 0 else ("B", "A"):
            binary, env = sides[side]
            run = run_once(binary, args, env)
            if header is None:
                header = f"{run.get('cpu', '?')}, {run.get('isa', '?')}, {run.get('threads', '?')} threads, {run.get('model', '?')}"
            for name, v in figures(run).items():
                if o.only and not any(s in name for s in o.only):
                    continue
                values[side].setdefault(name, []).append(v)
                rows.append((r + 1, side, name, v))
            print(f"round {r + 1} {side} done", file=sys.stderr)

    names = [n for n in values["A"] if n in values["B"]]
    print(f"A: {o.a}\nB: {o.b}\n{header}; {o.rounds} alternating rounds (A B, B A, ...); "
          f"bench speed {' '.join(args)}\n")
    print("| figure | A rounds | B rounds | A median | B median | B/A |")
    print("|---|---|---|---|---|---|")
    for n in names:
        a, b = values["A"][n], values["B"][n]
        ma, mb = statistics.median(a), statistics.median(b)
        ratio = f"{mb / ma:.3f}" if ma else ""
        print(f"| {n} | {' / '.join(map(num, a))} | {' / '.join(map(num, b))} | {num(ma)} | {num(mb)} | {ratio} |")
    if o.csv:
        with open(o.csv, "w", newline="") as f:
            w = csv.writer(f)
            w.writerow(["round", "binary", "figure", "value"])
            for r, side, name, v in rows:
                w.writerow([r, o.a if side == "A" else o.b, name, v])


if __name__ == "__main__":
    main()
