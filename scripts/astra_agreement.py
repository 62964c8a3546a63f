"""The model in ASTRA-sim compat mode against ASTRA-sim 1.0's and 2.x's own runs, row by row.

Models every row of the reference CSV (default: tests/data/astra-sim-reference/allreduce-small.csv)
with ``compat="astra-sim-1.0"`` and a 10 ns endpoint delay, and prints per topology, policy and
chunk count the max and median relative error of the finish time and the max error of ASTRA-sim's
per-dim utilization (``dim_busy_pct_node0``) in percentage points, then one line per policy class
against the bounds. Then every row of the 2.x set (default: tests/data/astra-sim-reference-2)
with ``compat="astra-sim-2"``: per section, network, backend, algorithm, active chunks and splits
the rows exact to the ns and the max and median error (ns and %); then the same for the multi-dim
congestion-aware runs of that folder (``runs-multidim.csv``, an unmerged branch of 2.x's network
backend). Writes ``agreement.json`` (every row), ``summary.json``, ``agreement-2.json``,
``summary-2.json``, ``agreement-2-multidim.json`` and ``summary-2-multidim.json`` into ``--out``.

    python scripts/astra_agreement.py --out results/astra-agreement
"""

from __future__ import annotations

import argparse
import os
import sys

from themis_mpi.astra import (
    BUSY_BOUND_PCT,
    RUNS_2,
    RUNS_2_MULTIDIM,
    TIME_BOUNDS,
    compare_row,
    compare_row_2,
    error_summary,
    error_summary_2,
    reference_rows,
    reference_rows_2,
)
from themis_mpi.output import write_json

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
DEFAULT_CSV = os.path.join(ROOT, "tests", "data", "astra-sim-reference", "allreduce-small.csv")
DEFAULT_DIR_2 = os.path.join(ROOT, "tests", "data", "astra-sim-reference-2")
KEYS_2 = ("section", "topology", "backend", "implementation", "active", "splits")


def print_2(results: list[dict], title: str) -> int:
    """Print a 2.x table, per group and per section and backend; returns the rows not exact."""
    print(f"# model (compat astra-sim-2) vs {title}: rows exact to the ns, finish/end error")
    print(
        f"#{'section':>36} {'topology':>14} {'backend':>18} {'algorithm':>15} {'act':>3} {'splits':>6} "
        f"{'exact':>9} {'max_ns':>8} {'max_err%':>9} {'med_err%':>9}"
    )
    for t in error_summary_2(results, KEYS_2):
        print(
            f" {t['section']:>36} {t['topology']:>14} {t['backend']:>18} {t['implementation']:>15} "
            f"{t['active']:>3} {t['splits']:>6} {t['exact']:>4}/{t['rows']:<4} {t['max_err_ns']:>8} "
            f"{t['max_time_err_pct']:>9.4f} {t['median_time_err_pct']:>9.4f}"
        )
    print("# per section and backend")
    for t in error_summary_2(results, ("section", "backend", "variant")):
        print(
            f" {t['section']:>36} {t['backend']:>18} {t['variant']:>16} exact {t['exact']:>4}/{t['rows']:<4} "
            f"max {t['max_err_ns']} ns ({t['max_time_err_pct']:.4f} %)"
        )
    return sum(r["err_ns"] != 0 for r in results)


def main(argv: list[str] | None = None) -> int:
    """Print the agreement tables, write JSON into --out; exit 1 if a bound is broken or a 2.x row is off."""
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--csv", default=DEFAULT_CSV, help="reference CSV")
    ap.add_argument("--dir2", default=DEFAULT_DIR_2, help="2.x reference folder (runs.csv, network/)")
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
    tables = ((RUNS_2, "ASTRA-sim 2.x", "-2"), (RUNS_2_MULTIDIM, "its multi-dim branch", "-2-multidim"))
    for csv_name, title, suffix in tables:
        rows_2 = reference_rows_2(os.path.join(args.dir2, csv_name))
        results_2 = [compare_row_2(row, os.path.join(args.dir2, "network")) for row in rows_2]
        broken += print_2(results_2, title)
        write_json(os.path.join(args.out, f"agreement{suffix}.json"), results_2)
        summary = {"groups": error_summary_2(results_2, KEYS_2)}
        write_json(os.path.join(args.out, f"summary{suffix}.json"), summary)
    return 1 if broken else 0


if __name__ == "__main__":
    sys.exit(main())
