"""The tables commands print: the `run`/`model` rows and the `train` rows, with their headers."""

from __future__ import annotations

import os
import time
from collections.abc import Sequence
from dataclasses import replace
from typing import TYPE_CHECKING

from .config import RunConfig
from .msccl.ir import read_algorithm, summary
from .results import CollectiveResult, TrainingResult, busbw_factor
from .topology import Topology
from .units import format_size

if TYPE_CHECKING:  # `run` loads no workload code
    from .workloads.training import TrainingSpec


def measured_on() -> str:
    """Where and when a study's timings were measured (they are quoted, never compared)."""
    return f"measured on a {os.cpu_count()}-core machine, {time.strftime('%Y-%m-%d', time.gmtime())}"


def custom_lines(topo: Topology, command: str) -> list[str]:
    """What a custom algorithm the dims name is, and what is done with it before it runs."""
    out = []
    for spec in dict.fromkeys(d.custom for d in topo.dims if d.custom):
        what = "checked, then run on real data" if command == "run" else "checked and proved, then timed"
        if spec.startswith("msccl:"):  # (a dim's stages may name two files: msccl:RS.xml+AG.xml)
            out += [f"#   msccl:{p}: {summary(read_algorithm(p))}; {what}" for p in spec[6:].split("+")]
        else:
            out.append(f"#   {spec}: per size, the file whose window holds it ({what}), else the built-in")
    return out


def custom_role(topo: Topology, spec: str) -> str:
    """What a dim's custom algorithm runs: its stages (files of the dim's size), or the collective."""
    if spec.startswith("msccl:") and (
        "+" in spec or read_algorithm(spec[len("msccl:") :]).ngpus != topo.npus
    ):
        return "its stages"
    return "the collective"


def run_header(topo: Topology, command: str, config: RunConfig) -> str:
    """The lines above a table: the topology, dim by dim, and the settings that change times."""
    lines = [f"# themis-mpi {command}: topology {topo.label()}, {topo.npus} NPUs"]
    for d, dim in enumerate(topo.dims):
        lines.append(
            f"#   dim {d}: {dim.kind:<14} npus {dim.npus:>4}  {dim.bandwidth_gbps:g} GB/s  "
            f"{dim.latency_ns:g} ns/hop  {dim.algorithm}"
            + (f" ({custom_role(topo, dim.custom)}: {dim.custom})" if dim.custom else "")
        )
    lines += custom_lines(topo, command)
    if config.endpoint_delay_ns or config.compat:
        lines.append(
            f"#   endpoint delay {config.endpoint_delay_ns:g} ns"
            + (f", compat {config.compat}" if config.compat else "")
        )
    for port in topo.ports:
        lines.append(
            f"#   {port.spec()}: dims {' and '.join(map(str, port.dims))} leave each NPU through one port of "
            f"{port.bandwidth_gbps:g} GB/s each way"
        )
    if config.network != "ideal":
        lines.append(f"#   network {config.network}: stages that run at once share the links")
    elif (config.active_per_dim > 1 or topo.ports) and not topo.flat:  # what ideal leaves out, said once
        lines.append(
            "#   network ideal: stages that run at once share nothing, so a link or port may carry more "
            "than its rate (the default, --network packet, shares them)"
        )
    if config.asymmetric:
        lines.append(stragglers_line(config))
    if config.endpoint.on:
        e = config.endpoint
        lines.append(
            f"#   endpoint model: HBM {e.hbm_gbps:g} GB/s, compute share {e.compute_share:g}, "
            + ("ACE (one read and one write per chunk)" if e.ace else "reductions and copies on the NPU")
        )
    return "\n".join(lines)


def stragglers_line(config: RunConfig, spec: TrainingSpec | None = None) -> str:
    """What makes NPUs differ (late NPUs, scaled links, compute paces), in one header line."""
    items = [f"NPU {rank} late by {ns / 1e3:g} us" for rank, ns in config.npu_delay_ns]
    items += [f"NPU {rank}'s dim-{d} links at {f:g}x" for d, rank, f in config.link_scale]
    if spec is not None:
        items += [f"NPU {rank} computes at {f:g}x the time" for rank, f in spec.npu_compute_scale]
        if spec.compute_jitter:
            items.append(f"compute jitter lognormal sigma {spec.compute_jitter:g} (seed {spec.seed})")
    return (
        f"#   stragglers: {', '.join(items)}; times span every NPU, each dim starts its stages in one "
        "agreed order"
    )


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


def _beyond(beyond_physics: bool) -> str:
    """The mark after a row's utilization: ``!`` where it is beyond physics (`results.beyond_physics`)."""
    return "!" if beyond_physics else " "


def table_row(r: CollectiveResult) -> str:
    """One row of the `run`/`model` table: percentages for utilization, GB/s = 2^30 B/s."""
    dim_vals = "".join(f" {100 * d.utilization:6.1f}" for d in r.dims)
    wrong = "N/A" if r.wrong is None else str(r.wrong)
    return (
        f" {format_size(r.size_bytes):>9} {r.count:>11} {r.dtype:>7} {r.policy:>10} "
        f"{r.intra:>5} {r.chunks:>6} {r.time_us:>12.2f} {r.ideal_us:>12.2f} {r.dim_bound_us:>12.2f} "
        f"{r.algbw_gbps:>8.2f} {r.busbw_gbps:>8.2f} {100 * r.utilization:>6.2f}{_beyond(r.beyond_physics)}"
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
    """The rows of `train` (with their speedups, see `with_speedups`).

    `exposed_us` is the communication beyond the slowest NPU's compute; where NPUs compute
    unequally (a pipeline's stages, stragglers) a line per row below says how (`waits`).
    """
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
            + f"{_beyond(r.beyond_physics)}{speed:>8}"
        )
    return "\n".join(lines + [w for r in rows if (w := waits(r))])


def waits(r: TrainingResult) -> str:
    """A row's unequal compute in one line: per pipeline stage, the slowest NPU's, the wait ('' if equal)."""
    if r.wait_us <= 0 and len(r.stage_compute_us) <= 1:
        return ""
    stages = " ".join(f"{us:.2f}" for us in r.stage_compute_us)
    return (
        f"#   {r.policy}: compute per pipeline stage {stages} us, the slowest NPU's "
        f"{r.max_compute_us:.2f} us; waited for it {r.wait_us:.2f} us (iteration = compute + wait + exposed)"
    )


NCCL_TYPE_OF_DTYPE = {"float32": "float", "float64": "double", "int32": "int32", "int64": "int64"}


def _nccl_time(us: float) -> str:
    """nccl-tests' time column: 2 decimals below 100 us, 1 below 10 ms, none above."""
    if us < 100:
        return f"{us:.2f}"
    if us < 10000:
        return f"{us:.1f}"
    return f"{us:.0f}"


NCCL_HALF_HEADER = f" {'time':>8} {'algbw':>7} {'busbw':>7} {'#wrong':>6}"
NCCL_HALF_UNITS = f" {'(us)':>8} {'(GB/s)':>7} {'(GB/s)':>7} {'':>6}"


def format_nccl(rows: Sequence[CollectiveResult], npus: int) -> str:
    """Rows of `run`/`model` as nccl-tests prints them (GB/s of 1e9 B), one block per policy.

    The emulator and the model have no in-place variant: the in-place columns repeat the
    out-of-place ones.
    """
    lines = []
    policies = list(dict.fromkeys(r.policy for r in rows))
    for policy in policies:
        lines += [
            f"# policy {policy}; GB/s are nccl-tests' (1e9 B/s); in-place repeats out-of-place",
            f"#{'out-of-place':>74}{'in-place':>31}",
            f"#{'size':>11} {'count':>13} {'type':>9} {'redop':>7} {'root':>7}" + NCCL_HALF_HEADER * 2,
            (f"#{'(B)':>11} {'(elements)':>13} {'':>9} {'':>7} {'':>7}" + NCCL_HALF_UNITS * 2).rstrip(),
        ]
        for r in rows:
            if r.policy != policy:
                continue
            algbw = r.size_bytes / r.time_us / 1e3 if r.time_us > 0 else 0.0
            busbw = algbw * busbw_factor(r.op, npus)
            redop = r.redop if r.op in ("all_reduce", "reduce_scatter") else "none"
            wrong = "N/A" if r.wrong is None else str(r.wrong)
            half = f"{_nccl_time(r.time_us):>8} {algbw:>7.2f} {busbw:>7.2f} {wrong:>6}"
            lines.append(
                f"{r.size_bytes:>12} {r.count:>13} {NCCL_TYPE_OF_DTYPE.get(r.dtype, r.dtype):>9} {redop:>7} "
                f"{0 if r.op == 'broadcast' else -1:>7} {half} {half}"  # nccl-tests' root: 0 for broadcast
            )
    return "\n".join(lines)
