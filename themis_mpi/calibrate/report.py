"""What calibrate prints: the fitted machine, the command that predicts the log, the error per size."""

from __future__ import annotations

import math

from .alphabeta import Fit
from .logs import NcclLog
from .ncclfit import PARAM_DOC, NcclFit


def _pct(value: float) -> str:
    return f"{value:.1f}" if math.isfinite(value) else "n/a"


def summary_line(s: dict[str, float]) -> str:
    """The issue's figures of one run, in words."""
    judged = "held-out sizes" if s["held_out"] else "all sizes (a partial run)"
    return (
        f"|time error| on the {judged} from 64 KiB: median {_pct(s['median_pct'])} %, 90th percentile "
        f"{_pct(s['p90_pct'])} %, worst {_pct(s['worst_from_64KiB_pct'])} % (from 64 MiB "
        f"{_pct(s['worst_from_64MiB_pct'])} %); worst of all sizes {_pct(s['worst_all_pct'])} %"
    )


def nccl_fit_header(log: NcclLog) -> str:
    """The NCCL-like fit's first lines, known before it runs: the log's tables and their notes."""
    runs = log.runs or [log]
    head = f"# calibrate {log.path}: {len(runs)} table(s); fitted together: " + "; ".join(
        f"{r.label} ({r.op} from the {r.op_source}, NPUs from the {r.npus_source})" for r in runs
    )
    return "\n".join([head, *(f"# note: {n}" for r in runs for n in r.notes)])


def format_nccl_fit(log: NcclLog, result: NcclFit, header: bool = True) -> str:
    """The machine, the fitted parameters, the command that predicts each run, and its error per size.

    It starts with `nccl_fit_header` (without `header`: the command printed it before the fit).
    """
    runs = log.runs or [log]
    lines = [
        *([nccl_fit_header(log)] if header else []),
        *(f"# machine: {s}" for s in result.machine),
        f"# NCCL-like model fitted on the even-indexed sizes (*) of each run (all sizes of a run with fewer "
        f"than 6), judged on the others; {len(result.fitted)} parameters, each within its bounds:",
        *(f"#   {k:<12} {v:>12g}  {PARAM_DOC[k]}" for k, v in result.fitted.items()),
        *(
            f"# warning: {k} ended on its bound {v:g}: the log asks for more than the bounds allow"
            for k, v in result.on_bounds.items()
        ),
        f"topology {result.topology}",
    ]
    for run, out in zip(runs, result.runs):
        lines += [
            f"# {out['label']}",
            f"# predict: themis-mpi model -t '{out['topology']}' -c {result.chunks} -o {run.op} "
            f"-d {result.dtype} -b SIZE -p baseline",
            "# busbw in nccl-tests' GB/s (1e9 B/s), measured busbw recomputed from the measured time",
            f"#{'size':>11} {'fit':>3} {'meas_us':>9} {'model_us':>9} {'time_err%':>9} {'meas_busbw':>10} "
            f"{'model_busbw':>11} {'algorithm':>9} {'protocol':>8}",
        ]
        for r in out["rows"]:
            lines.append(
                f" {r['size_bytes']:>11} {'*' if r['fitted'] else '':>3} {r['measured_us']:>9.2f} "
                f"{r['model_us']:>9.2f} {r['time_error_pct']:>9.1f} {r['measured_busbw']:>10.2f} "
                f"{r['model_busbw']:>11.2f} {r['algorithm']:>9} {r['protocol']:>8}"
            )
        lines.append("# " + summary_line(out["summary"]))
    if result.prediction:
        lines.append(
            f"# predicted from the base fit and the NIC's nominal rate: {result.prediction['topology']}"
        )
        lines.append(
            f"#{'size':>11} {'meas_us':>9} {'pred_us':>9} {'time_err%':>9} {'algorithm':>9} {'protocol':>8}"
        )
        for r in result.prediction["rows"]:
            lines.append(
                f"# {r['size_bytes']:>10} {r['measured_us']:>9.2f} {r['model_us']:>9.2f} "
                f"{r['time_error_pct']:>9.1f} {r['algorithm']:>9} {r['protocol']:>8}"
            )
    return "\n".join(lines)


def fit_header(log: NcclLog) -> str:
    """The one-dim fit's first line, known before it runs: the log's op, NPUs and sizes."""
    return (
        f"# calibrate {log.path}: {log.op} ({'from the ' + log.op_source}), {log.npus} NPUs, "
        f"{len(log.rows)} sizes, type {log.rows[0].type}"
    )


def format_fit(log: NcclLog, result: Fit, header: bool = True) -> str:
    """The fitted topology, the command that predicts the table, and the error per size.

    It starts with `fit_header` (without `header`: the command printed it before the fit).
    """
    last = log.rows[-1].size_bytes
    lines = [
        *([fit_header(log)] if header else []),
        f"# fitted on the sizes >= {result.min_size} B by least squares on time (absolute residuals: "
        "large sizes set the bandwidth, smaller ones the latency)",
        f"# latency {result.latency_ns:g} ns/hop, bandwidth {result.bandwidth_gbps:g} GB/s (2^30 B/s) = "
        f"{result.bandwidth_gbps * 2**30 / 1e9:.1f} GB/s (1e9 B/s), {result.chunks} chunk(s)",
        f"topology {result.topology}",
        f"# predict: themis-mpi model -t '{result.topology}' -c {result.chunks} -o {log.op} "
        f"-d {result.dtype} -b {log.rows[0].size_bytes} -e {last} -f 2 -p baseline --format nccl",
        "# busbw in nccl-tests' GB/s (1e9 B/s); measured busbw recomputed from the measured time",
        f"#{'size':>11} {'fit':>3} {'meas_us':>9} {'model_us':>9} {'time_err%':>9} "
        f"{'meas_busbw':>10} {'model_busbw':>11} {'busbw_err%':>10}",
    ]
    for r in result.rows:
        lines.append(
            f" {r['size_bytes']:>11} {'*' if r['fitted'] else '':>3} {r['measured_us']:>9.2f} "
            f"{r['model_us']:>9.2f} {r['time_error_pct']:>9.1f} {r['measured_busbw_exact']:>10.2f} "
            f"{r['model_busbw']:>11.2f} {r['busbw_error_pct']:>10.1f}"
        )
    big = [r for r in result.rows if r["size_bytes"] >= 64 * 2**20]
    if big:
        worst = max(abs(r["busbw_error_pct"]) for r in big)
        lines.append(f"# sizes >= 64 MiB: largest busbw error {worst:.1f} %")
    return "\n".join(lines)
