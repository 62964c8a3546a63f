"""Timing analysis of a finished collective: per-dim busy time, bytes, utilization, bandwidths.

Bandwidths are in GB/s with 1 GB = 2^30 bytes. algbw is ``size / time``; busbw scales it by
nccl-tests' factor (``2 (N-1)/N`` for all-reduce, ``(N-1)/N`` otherwise) so that it compares with
the per-NPU link bandwidth. Utilization is ``ideal / actual`` (THEMIS.md); a dim's utilization is
its busy time over the collective time.
"""

from __future__ import annotations

import math

from .cost import CostModel, ideal_time_us
from .engine import CollectiveRun
from .topology import BYTES_PER_GB, Topology


def busbw_factor(op: str, npus: int) -> float:
    """nccl-tests' bus-bandwidth factor for an op over npus NPUs."""
    if npus <= 1:
        return 0.0
    return 2.0 * (npus - 1) / npus if op == "all_reduce" else (npus - 1) / npus


def involved_npus(topology: Topology, dims) -> int:
    """NPUs in one group of the involved dims."""
    return math.prod(topology.dims[d].npus for d in dims)


def summarize(run: CollectiveRun, topology: Topology, cost: CostModel) -> dict:
    """The result row of one collective: times, bandwidths, utilization, per-dim figures."""
    coll = run.collective
    time_us = (run.end_ns - run.issued_ns) / 1e3
    ideal_us = ideal_time_us(coll.op, coll.size_bytes, topology, coll.dims)
    dims = []
    for d in range(len(topology.dims)):
        mine = [r for r in run.runs if r.stage.dim == d]
        busy_us = sum(r.end_ns - r.start_ns for r in mine) / 1e3
        sent = sum(cost.stage_bytes(d, r.stage.op, r.stage.full_elems) for r in mine)
        dims.append({
            "dim": d,
            "busy_us": busy_us,
            "bytes": int(sent),
            "stages": len(mine),
            "utilization": busy_us / time_us if time_us > 0 else 0.0,
        })
    return {
        "op": coll.op,
        "size_bytes": coll.size_bytes,
        "count": coll.count,
        "dtype": coll.dtype,
        "redop": coll.redop,
        "chunks": coll.n_chunks,
        "time_us": time_us,
        "ideal_us": ideal_us,
        **bandwidths(coll.op, coll.size_bytes, time_us, involved_npus(topology, coll.dims)),
        "utilization": ideal_us / time_us if time_us > 0 else 1.0,
        "dims": dims,
    }


def bandwidths(op: str, size_bytes: int, time_us: float, npus: int) -> dict:
    """Algbw and busbw in GB/s (2^30 B) of a collective of size_bytes that took time_us."""
    if time_us <= 0:
        return {"algbw_gbps": 0.0, "busbw_gbps": 0.0}
    algbw = size_bytes / (time_us * 1e-6) / BYTES_PER_GB
    return {"algbw_gbps": algbw, "busbw_gbps": algbw * busbw_factor(op, npus)}


def format_size(n_bytes: int) -> str:
    """Bytes with a binary suffix, as nccl-tests prints sizes: 64M, 1G, 512."""
    for suffix, scale in (("G", 2**30), ("M", 2**20), ("K", 2**10)):
        if n_bytes >= scale and n_bytes % scale == 0:
            return f"{n_bytes // scale}{suffix}"
    return str(n_bytes)


def format_table(rows: list[dict], n_dims: int, clock: str) -> str:
    """An nccl-tests-like table, one line per row, units in the header."""
    dim_cols = "".join(f" {'dim' + str(d) + '%':>6}" for d in range(n_dims))
    head = (
        f"#{'size':>10} {'count':>11} {'type':>7} {'policy':>8} {'intra':>5} {'chunks':>6} "
        f"{'time_us':>12} {'ideal_us':>12} {'algbw':>8} {'busbw':>8} {'util%':>6} "
        f"{'#wrong':>7}{dim_cols} {'wall_s':>9}"
    )
    unit = (
        f"#{'(B)':>10} {'(elements)':>11} {'':>7} {'':>8} {'':>5} {'':>6} "
        f"{'(' + clock + ')':>12} {'':>12} {'(GB/s)':>8} {'(GB/s)':>8} {'':>6} {'':>7}"
        f"{'':>{7 * n_dims}} {'(median)':>9}"
    )
    lines = [head, unit]
    for r in rows:
        dim_vals = "".join(f" {100 * d['utilization']:6.1f}" for d in r["dims"])
        wrong = "N/A" if r["wrong"] is None else str(r["wrong"])
        lines.append(
            f" {r['size_bytes']:>10} {r['count']:>11} {r['dtype']:>7} {r['policy']:>8} "
            f"{r['intra']:>5} {r['chunks']:>6} {r['time_us']:>12.2f} {r['ideal_us']:>12.2f} "
            f"{r['algbw_gbps']:>8.2f} {r['busbw_gbps']:>8.2f} {100 * r['utilization']:>6.2f} "
            f"{wrong:>7}{dim_vals} {r['wall_s']:>9.4f}"
        )
    return "\n".join(lines)
