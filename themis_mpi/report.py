"""The tables commands print: the `run`/`model` rows and the `train` rows, with their headers."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace

from .config import RunConfig
from .results import CollectiveResult, TrainingResult
from .topology import Topology
from .units import format_size


def run_header(topo: Topology, command: str, config: RunConfig) -> str:
    """The lines above a table: the topology, dim by dim, and the settings that change times."""
    lines = [f"# themis-mpi {command}: topology {topo.label()}, {topo.npus} NPUs"]
    for d, dim in enumerate(topo.dims):
        lines.append(
            f"#   dim {d}: {dim.kind:<14} npus {dim.npus:>4}  {dim.bandwidth_gbps:g} GB/s  "
            f"{dim.latency_ns:g} ns/hop  {dim.algorithm}"
        )
    if config.endpoint_delay_ns or config.compat:
        lines.append(
            f"#   endpoint delay {config.endpoint_delay_ns:g} ns"
            + (f", compat {config.compat}" if config.compat else "")
        )
    if config.network != "ideal":
        lines.append(f"#   network {config.network}: stages that run at once share the links")
    if config.endpoint.on:
        e = config.endpoint
        lines.append(
            f"#   endpoint model: HBM {e.hbm_gbps:g} GB/s, compute share {e.compute_share:g}, "
            + ("ACE (one read and one write per chunk)" if e.ace else "reductions and copies on the NPU")
        )
    return "\n".join(lines)


def table_header(n_dims: int, clock: str) -> str:
    """The two header lines of the `run`/`model` table (units on the second)."""
    dim_cols = "".join(f" {'dim' + str(d) + '%':>6}" for d in range(n_dims))
    head = (
        f"#{'size':>9} {'count':>11} {'type':>7} {'policy':>10} {'intra':>5} {'chunks':>6} "
        f"{'time_us':>12} {'ideal_us':>12} {'dimbound_us':>12} {'algbw':>8} {'busbw':>8} {'util%':>6} "
        f"{'#wrong':>7}{dim_cols} {'wall_s':>9}"
    )
    unit = (
        f"#{'':>9} {'(elements)':>11} {'':>7} {'':>10} {'':>5} {'':>6} "
        f"{'(' + clock + ')':>12} {'':>12} {'':>12} {'(GB/s)':>8} {'(GB/s)':>8} {'':>6} {'':>7}"
        f"{'':>{7 * n_dims}} {'(median)':>9}"
    )
    return f"{head}\n{unit}"


def table_row(r: CollectiveResult) -> str:
    """One row of the `run`/`model` table: percentages for utilization, GB/s = 2^30 B/s."""
    dim_vals = "".join(f" {100 * d.utilization:6.1f}" for d in r.dims)
    wrong = "N/A" if r.wrong is None else str(r.wrong)
    return (
        f" {format_size(r.size_bytes):>9} {r.count:>11} {r.dtype:>7} {r.policy:>10} "
        f"{r.intra:>5} {r.chunks:>6} {r.time_us:>12.2f} {r.ideal_us:>12.2f} {r.dim_bound_us:>12.2f} "
        f"{r.algbw_gbps:>8.2f} {r.busbw_gbps:>8.2f} {100 * r.utilization:>6.2f} "
        f"{wrong:>7}{dim_vals} {r.wall_s:>9.4f}"
    )


def with_speedups(rows: Sequence[TrainingResult]) -> list[TrainingResult]:
    """The rows with their speedup over the baseline's row (None without one)."""
    base = next((r for r in rows if r.policy == "baseline"), None)
    return [
        replace(r, speedup=base.iteration_us / r.iteration_us if base and r.iteration_us else None)
        for r in rows
    ]


def training_table(rows: Sequence[TrainingResult], n_dims: int) -> str:
    """The rows of `train` (with their speedups, see `with_speedups`)."""
    dim_cols = "".join(f" {'dim' + str(d) + '%':>6}" for d in range(n_dims))
    lines = [
        f"#{'policy':>9} {'intra':>5} {'iteration_us':>13} {'compute_us':>11} {'exposed_us':>11} "
        f"{'colls':>6} {'#wrong':>7}{dim_cols} {'speedup':>8}"
    ]
    for r in rows:
        wrong = "N/A" if r.wrong is None else r.wrong
        speed = f"{r.speedup:.3f}x" if r.speedup else "-"
        lines.append(
            f" {r.policy:>9} {r.intra:>5} {r.iteration_us:>13.2f} {r.compute_us:>11.2f} "
            f"{r.exposed_comm_us:>11.2f} {r.collectives:>6} {wrong:>7}"
            + "".join(f" {100 * d.utilization:>6.1f}" for d in r.dims)
            + f" {speed:>8}"
        )
    return "\n".join(lines)
