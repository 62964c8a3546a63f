"""The property-based and fuzzing suites at length: many more random cases than CI runs.

Usage::

    python scripts/properties_long.py [--out results]

Runs tests/test_properties.py, tests/test_fuzz.py and tests/test_properties_mpi.py with the
Hypothesis profile `long` (2000 examples per serial rule, 60 randomized mpiexec jobs, random
seeds) and prints, per rule, how many cases passed, failed or were discarded; writes
properties_long.json into --out (default results/).
"""

import argparse
import os
import re
import subprocess
import sys
import time

from themis_mpi.output import write_json

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default="results", help="output folder (default results)")
    args = ap.parse_args()
    env = dict(os.environ, THEMIS_HYPOTHESIS_PROFILE="long")
    t0 = time.perf_counter()
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "pytest",
            "-q",
            "-p",
            "no:cacheprovider",
            "--hypothesis-show-statistics",
            "tests/test_properties.py",
            "tests/test_fuzz.py",
            "tests/test_properties_mpi.py",
        ],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
    )
    elapsed = time.perf_counter() - t0
    rows, current = [], None
    for line in proc.stdout.splitlines():
        name = re.match(r"^tests/(\S+)::(\S+):$", line.strip())
        if name:
            current = name.group(2)
        counts = re.search(r"(\d+) passing, (\d+) failing, and (\d+) invalid", line)
        if counts and current:
            rows.append(
                {
                    "rule": current,
                    "passing": int(counts.group(1)),
                    "failing": int(counts.group(2)),
                    "invalid": int(counts.group(3)),
                }
            )
    print(f"# Hypothesis profile 'long', {elapsed:.0f} s; pytest exit {proc.returncode}")
    print(f"#{'rule':>70} {'passing':>8} {'failing':>8} {'invalid':>8}")
    for r in rows:
        print(f" {r['rule']:>70} {r['passing']:>8} {r['failing']:>8} {r['invalid']:>8}")
    passed, failed = sum(r["passing"] for r in rows), sum(r["failing"] for r in rows)
    print(f"# total: {passed} cases passed, {failed} failed")
    if proc.returncode:
        print(proc.stdout[-4000:])
    os.makedirs(args.out, exist_ok=True)
    write_json(
        os.path.join(args.out, "properties_long.json"),
        {"elapsed_s": elapsed, "exit": proc.returncode, "rules": rows},
    )
    sys.exit(proc.returncode)


if __name__ == "__main__":
    main()
