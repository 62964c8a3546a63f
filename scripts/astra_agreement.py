"""The model in ASTRA-sim 1.0 compat mode against ASTRA-sim 1.0's own runs, row by row.

Models every row of the reference CSV (default: tests/data/astra-sim-reference/allreduce-small.csv)
with ``compat="astra-sim-1.0"`` and a 10 ns endpoint delay, and prints per topology, policy and
chunk count the max and median relative error of the finish time and the max error of ASTRA-sim's
per-dim utilization (``dim_busy_pct_node0``) in percentage points, then one line per policy class
against the bounds. Writes ``agreement.json`` (every row) and ``summary.json`` into ``--out``.

    python scripts/astra_agreement.py --out results/astra-agreement
"""

from __future__ import annotations

import argparse
import os
import sys

from themis_mpi.astra import BUSY_BOUND_PCT, TIME_BOUNDS, compare_row, error_summary, reference_rows
from themis_mpi.output import write_json

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
DEFAULT_CSV = os.path.join(ROOT, "tests", "data", "astra-sim-reference", "allreduce-small.csv")


def main(argv: list[str] | None = None) -> int:
    """Print the agreement table and write JSON into --out; exit 1 if a bound is broken."""
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--csv", default=DEFAULT_CSV, help="reference CSV")
    ap.add_argument("--out", default=os.path.join("results", "astra-agreement"), help="output directory")
    args = ap.parse_args(argv)
    results = [compare_row(row) for row in reference_rows(args.csv)]
    table = error_summary(results, ("topology", "policy", "intra", "chunks"))
    classes = error_summary(results, ("policy", "intra"))
    print("# model (compat astra-sim-1.0) vs ASTRA-sim 1.0: finish-time error (%), busy error (points)")
    print(
        f"#{'topology':>24} {'policy':>8} {'intra':>5} {'chunks':>6} {'rows':>4} "
        f"{'max_err%':>9} {'med_err%':>9} {'busy_pp':>8}"
    )
    for t in table:
        print(
            f" {t['topology']:>24} {t['policy']:>8} {t['intra']:>5} {t['chunks']:>6} {t['rows']:>4} "
            f"{t['max_time_err_pct']:>9.4f} {t['median_time_err_pct']:>9.4f} {t['max_busy_err_pct']:>8.3f}"
        )
    print("# per policy class")
    broken = 0
    for c in classes:
        bound = TIME_BOUNDS[(c["policy"], c["intra"])]
        ok = c["max_time_err_pct"] <= 100 * bound and c["max_busy_err_pct"] <= BUSY_BOUND_PCT
        broken += not ok
        print(
            f" {c['policy']:>8} {c['intra']:>5} rows {c['rows']:>3} max {c['max_time_err_pct']:.4f} % "
            f"median {c['median_time_err_pct']:.4f} % (bound {100 * bound:g} %), busy max "
            f"{c['max_busy_err_pct']:.3f} pp (bound {BUSY_BOUND_PCT:g}) {'ok' if ok else 'BROKEN'}"
        )
    os.makedirs(args.out, exist_ok=True)
    write_json(os.path.join(args.out, "agreement.json"), results)
    write_json(os.path.join(args.out, "summary.json"), {"groups": table, "classes": classes})
    return 1 if broken else 0


if __name__ == "__main__":
    sys.exit(main())
