#!/usr/bin/env python3
"""test_report: the end of scripts/test.sh: stage wall times, the ten slowest tests, the budget.

usage: test_report.py REPORT_DIR --budget SECONDS --elapsed SECONDS --rc CODE

REPORT_DIR holds stages.tsv (name, seconds, exit code per stage, in order) and one JUnit
file per ctest stage (ctest --output-junit). Prints both tables, then the last lines of
each failed test's output (at most three tests); exits 1 when the run
passed but took longer than the budget (0: no budget), else 0.
"""
import argparse
import glob
import os
import sys
import xml.etree.ElementTree as ET


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("report")
    ap.add_argument("--budget", type=int, required=True)
    ap.add_argument("--elapsed", type=int, required=True)
    ap.add_argument("--rc", type=int, required=True)
    a = ap.parse_args()

    stages = []
    path = os.path.join(a.report, "stages.tsv")
    if os.path.exists(path):
        for line in open(path):
            name, seconds, rc = line.rstrip("\n").split("\t")
            stages.append((name, int(seconds), int(rc)))

    tests = []  # (seconds, stage, name, status)
    failures = []  # (stage, name, the last lines of its output)
    for xml in sorted(glob.glob(os.path.join(a.report, "*.xml"))):
        stage = os.path.basename(xml)[:-4].replace("_", " ")
        try:
            root = ET.parse(xml).getroot()
        except ET.ParseError as e:
            print(f"test_report: {xml}: {e}", file=sys.stderr)
            continue
        for tc in root.iter("testcase"):
            tests.append((float(tc.get("time", "0")), stage, tc.get("name", "?"), tc.get("status", "?")))
            if tc.get("status") == "fail":
                out = tc.findtext("system-out") or ""
                failures.append((stage, tc.get("name", "?"), out.rstrip("\n").splitlines()[-25:]))

    print("\n== stage times (wall)")
    for name, seconds, rc in stages:
        mark = "" if rc == 0 else f"   FAILED (exit {rc})"
        print(f"  {name:<18} {seconds:6d} s  {seconds / 60:5.1f} min{mark}")
    print(f"  {'total':<18} {a.elapsed:6d} s  {a.elapsed / 60:5.1f} min"
          + (f"   (budget {a.budget} s = {a.budget / 60:.0f} min)" if a.budget else ""))

    if tests:
        by_stage = {}
        for t in tests:
            by_stage.setdefault(t[1], []).append(t)
        print(f"\n== the ten slowest of {len(tests)} tests")
        for seconds, stage, name, status in sorted(tests, reverse=True)[:10]:
            print(f"  {seconds:7.1f} s  {stage:<16} {name}")
        print("  (sum of test times per stage: "
              + ", ".join(f"{s} {sum(t[0] for t in ts):.0f} s" for s, ts in by_stage.items()) + ")")

    # Last, so a summary cut to the run's tail still shows why each test failed (ctest
    # prints the whole output of a failed test earlier, among the rest).
    for stage, name, lines in failures[:3]:
        print(f"\n== the end of {name}'s output ({stage})")
        for line in lines:
            print("  " + line[:300])

    if a.rc == 0 and a.budget and a.elapsed > a.budget:
        print(f"\ntest.sh: FAILED: the run took {a.elapsed} s, over its budget of {a.budget} s "
              "(TRELLIS_TEST_BUDGET). Find the time above; move exhaustive cases to label full.",
              file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
