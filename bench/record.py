#!/usr/bin/env python3
"""Run one benchmark and keep its raw results in bench/results/, with where they came from.

The benchmark writes a CSV somewhere (its own --csv / -o option), or prints JSON lines
(--json-stdout); this script runs it, then copies that CSV (or the JSON lines as CSV
rows) to bench/results/NAME-YYYY-MM-DD.csv (or the --dest you give) behind a header of `# key: value` comment lines:

  date, commit (git rev-parse --short HEAD of --tree, the work tree the binary was built
  from; "+dirty" if its src/ differs from HEAD), cpu
  (/proc/cpuinfo model name, family, model), isa (the kernel path the binary itself reports: the "isa"
  field of `trellis bench roofline --quick --json`) and cpu_flags (the AVX-512 / AVX2
  flags /proc/cpuinfo lists), cores (os.cpu_count), threads, command (the exact argv),
  plus any --note KEY=VALUE lines (e.g. the llama.cpp commit).

bench/render_tables.py reads these files to regenerate the tables in docs/BENCHMARKS.md.

  bench/record.py --name prefix-ttft --csv /tmp/p/ttft.csv --threads 2 -- \\
      build/trellis bench prefix -m /tmp/tinyllama-q4_0.gguf --only ttft -r 3 -o /tmp/p
"""
import argparse, csv, datetime, json, os, shlex, shutil, subprocess, sys

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), ".."))


def git(tree, *args):
    return subprocess.run(["git", "-C", tree, *args], capture_output=True, text=True, check=True).stdout.strip()


def cpu_model():
    """'model name' plus family/model numbers (a VM may show only 'AMD EPYC')."""
    info = {}
    with open("/proc/cpuinfo") as f:
        for line in f:
            k, _, v = line.partition(":")
            info.setdefault(k.strip(), v.strip())
    return f"{info.get('model name', 'unknown')} (cpu family {info.get('cpu family', '?')}, model {info.get('model', '?')})"


def cpu_flags():
    want = ["avx512f", "avx512bw", "avx512vl", "avx512_vnni", "avx512_bf16", "avx_vnni", "avx2", "fma", "f16c"]
    with open("/proc/cpuinfo") as f:
        for line in f:
            if line.startswith("flags"):
                have = set(line.split(":", 1)[1].split())
                return " ".join(x for x in want if x in have)
    return ""


def binary_isa(trellis):
    """The kernel family the binary picks on this CPU (honours TRELLIS_ISA like the run)."""
    out = subprocess.run([trellis, "bench", "roofline", "--quick", "--json"], capture_output=True, text=True,
                         check=True).stdout
    return json.loads(out.splitlines()[0])["isa"]


def metadata(tree, trellis, threads, command, notes):
    dirty = subprocess.run(["git", "-C", tree, "diff", "--quiet", "HEAD", "--", "src", "include", "CMakeLists.txt"])
    meta = {
        "date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
        "commit": git(tree, "rev-parse", "--short", "HEAD") + ("+dirty" if dirty.returncode else ""),
        "cpu": cpu_model(),
        "isa": binary_isa(trellis),
        "cpu_flags": cpu_flags(),
        "cores": str(os.cpu_count()),
        "threads": str(threads),
        "command": shlex.join(command),
    }
    for n in notes:
        k, _, v = n.partition("=")
        meta[k.strip()] = v.strip()
    return meta


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--name", required=True, help="results file stem, e.g. compare_llamacpp, prefix-ttft")
    src = ap.add_mutually_exclusive_group(required=True)
    src.add_argument("--csv", help="the CSV the command writes")
    src.add_argument("--json-stdout", action="store_true",
                     help="the command prints JSON objects, one a line (e.g. --json): each becomes a CSV row, "
                          "lists joined by spaces; run several commands with `sh -c '...; ...'` for several rows")
    ap.add_argument("--dest", help="default: bench/results/NAME-DATE.csv")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--tree", default=ROOT, help="git work tree the benchmarked binary was built from")
    ap.add_argument("--trellis", help="the benchmarked trellis binary (default: TREE/build/trellis)")
    ap.add_argument("--note", action="append", default=[], help="extra KEY=VALUE header line")
    ap.add_argument("--keep-failed", action="store_true",
                    help="record the results of a command that exits non-zero too (a check that failed is a result: "
                         "the chaos run), with its exit status in the header")
    ap.add_argument("command", nargs=argparse.REMAINDER, help="-- then the benchmark command")
    a = ap.parse_args()
    cmd = a.command[1:] if a.command[:1] == ["--"] else a.command
    if not cmd:
        ap.error("no command")
    trellis = a.trellis or os.path.join(a.tree, "build", "trellis")
    meta = metadata(a.tree, trellis, a.threads, cmd, a.note)  # before the run: the commit it ran at
    if a.csv and os.path.exists(a.csv):
        os.remove(a.csv)  # benchmarks that append must not mix in an older run
    run = subprocess.run(cmd, check=not a.keep_failed, stdout=subprocess.PIPE if a.json_stdout else None, text=True)
    if run.returncode != 0:
        meta["exit_status"] = str(run.returncode)
    day = meta["date"][:10]
    dest = a.dest or os.path.join(ROOT, "bench", "results", f"{a.name}-{day}.csv")
    os.makedirs(os.path.dirname(dest), exist_ok=True)
    with open(dest, "w", newline="") as out:
        for k, v in meta.items():
            out.write(f"# {k}: {v}\n")
        if a.csv:
            with open(a.csv) as src:
                shutil.copyfileobj(src, out)
        else:
            rows = [json.loads(l) for l in run.stdout.splitlines() if l.startswith("{")]
            keys = list(dict.fromkeys(k for r in rows for k in r))
            w = csv.DictWriter(out, fieldnames=keys)
            w.writeheader()
            for r in rows:
                w.writerow({k: " ".join(str(x) for x in v) if isinstance(v, list) else v for k, v in r.items()})
    print(f"record: {dest}", file=sys.stderr)


if __name__ == "__main__":
    main()
