#!/usr/bin/env python3
"""Instructions one MatMul executes on the aarch64 NEON paths, packed against row-major.

This project has no ARM hardware; qemu-user runs the aarch64 build exactly, one guest
instruction per translation block (-singlestep), and logs every block it executes
(-d exec), filtered to the kernels' code (the address range of libtrellis_kernels'
functions in the non-PIE kernel_icount binary). A MatMul's count is the count at reps 2
minus the count at reps 1, so loading, packing and first-time paths cancel. Counts are
not cycles: they say how much work each path issues, not how fast an ARM core retires it.

usage: bench/neon_icount.py [--types q4_0,q4_K,...] [--tokens 1,8] [--csv FILE]
Runs on x86-64 with g++-aarch64-linux-gnu and qemu-user-static (scripts/setup.sh installs
both); builds build-aarch64/kernel_icount first. Two qemu runs at a time (~30 s each).
"""
import argparse
import collections
import concurrent.futures
import csv
import os
import subprocess
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
BUILD = os.path.join(ROOT, "build-aarch64")
BINARY = os.path.join(BUILD, "kernel_icount")
TYPES = ["q4_0", "q5_0", "q5_1", "q8_0", "iq4_nl", "q4_K", "q5_K", "q6_K"]
ROWS, COLS = 256, 2048  # kernel_icount's matrix


def kernel_range():
    """[lo, hi] of the text of libtrellis_kernels' functions inside kernel_icount."""
    lib = os.path.join(BUILD, "src", "kernels", "libtrellis_kernels.a")
    names = set()
    for line in subprocess.run(["aarch64-linux-gnu-nm", "--defined-only", lib], check=True,
                               capture_output=True, text=True).stdout.splitlines():
        parts = line.split()
        if len(parts) == 3 and parts[1] in "tT":
            names.add(parts[2])
    syms = []
    for line in subprocess.run(["aarch64-linux-gnu-nm", "-n", BINARY], check=True,
                               capture_output=True, text=True).stdout.splitlines():
        parts = line.split()
        if len(parts) == 3 and parts[1] in "tTwW":
            syms.append((int(parts[0], 16), parts[2]))
    inside = [i for i, (_, name) in enumerate(syms) if name in names]
    if not inside:
        sys.exit("neon_icount: no kernel symbols in kernel_icount")
    last = inside[-1]
    hi = syms[last + 1][0] - 1 if last + 1 < len(syms) else syms[last][0] + 0x10000
    return syms[inside[0]][0], hi


def singlestep_flag():
    help_text = subprocess.run(["qemu-aarch64-static", "--help"], capture_output=True, text=True).stdout
    return "-one-insn-per-tb" if "one-insn-per-tb" in help_text else "-singlestep"


def count(rng, flag, type_name, packed, tokens, reps):
    """Per-symbol counts of executed kernel instructions for one run."""
    with tempfile.TemporaryDirectory() as tmp:
        fifo = os.path.join(tmp, "log")
        os.mkfifo(fifo)
        proc = subprocess.Popen(["qemu-aarch64-static", flag, "-d", "exec,nochain", "-dfilter",
                                 f"{rng[0]:#x}..{rng[1]:#x}", "-D", fifo, BINARY, type_name,
                                 str(int(packed)), str(tokens), str(reps)],
                                stdout=subprocess.PIPE, text=True)
        counts = collections.Counter()
        with open(fifo, encoding="utf-8", errors="replace") as log:
            for line in log:
                if line.startswith("Trace"):
                    counts[line.rsplit(" ", 1)[-1].strip()] += 1
        out = proc.communicate()[0]
        if proc.returncode != 0:
            sys.exit(f"neon_icount: kernel_icount {type_name} {packed} {tokens} failed")
        if "neon (dotprod)" not in out:
            sys.exit(f"neon_icount: expected the NEON dotprod path, got: {out.strip()}")
    return counts


def per_matmul(rng, flag, type_name, packed, tokens):
    one = count(rng, flag, type_name, packed, tokens, 1)
    two = count(rng, flag, type_name, packed, tokens, 2)
    return sum(two.values()) - sum(one.values())


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--types", default=",".join(TYPES))
    ap.add_argument("--tokens", default="1,8")
    ap.add_argument("--csv")
    args = ap.parse_args()
    subprocess.run([os.path.join(ROOT, "scripts", "build.sh"), "aarch64", "kernel_icount"], check=True,
                   stdout=subprocess.DEVNULL)
    rng, flag = kernel_range(), singlestep_flag()
    jobs = [(t, p, int(n)) for t in args.types.split(",") for n in args.tokens.split(",") for p in (False, True)]
    with concurrent.futures.ThreadPoolExecutor(max_workers=2) as pool:
        results = dict(zip(jobs, pool.map(lambda j: per_matmul(rng, flag, *j), jobs)))
    rows = []
    print(f"Instructions per MatMul, {ROWS} x {COLS} weights, NEON dotprod under qemu-user (kernels only)")
    print(f"{'type':8} {'tokens':>6} {'row-major':>11} {'packed':>11} {'ratio':>6} {'packed/sdot':>11}")
    for t in args.types.split(","):
        for n in map(int, args.tokens.split(",")):
            row_major, packed = results[(t, False, n)], results[(t, True, n)]
            sdots = ROWS * COLS * n // 16  # 16 products per sdot
            rows.append({"type": t, "tokens": n, "row_major": row_major, "packed": packed,
                         "ratio": round(row_major / packed, 2), "packed_per_sdot": round(packed / sdots, 2)})
            r = rows[-1]
            print(f"{t:8} {n:>6} {row_major:>11} {packed:>11} {r['ratio']:>6} {r['packed_per_sdot']:>11}")
    if args.csv:
        with open(args.csv, "w", newline="") as f:
            w = csv.DictWriter(f, fieldnames=list(rows[0]))
            w.writeheader()
            w.writerows(rows)


if __name__ == "__main__":
    main()
