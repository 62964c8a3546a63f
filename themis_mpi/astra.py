"""ASTRA-sim 1.0's own runs, read and compared row by row with the model in compat mode.

The reference CSV (tests/data/astra-sim-reference/allreduce-small.csv, 384 runs) has one row per
All-Reduce: ``topology``, ``inline_topology`` (this project's syntax), ``policy``, ``intra``,
``chunks``, ``alg_map`` (``paper``: halving-doubling on every Switch dim; ``allring``: ring on
every dim), ``size_bytes`` per NPU, ``time_us`` (finish time), ``avg_chunk_latency_per_dim_us``
and ``dim_busy_pct_node0`` (space-separated, dim 0 first). ASTRA-sim ran with a 10 ns endpoint
delay and one active chunk per dim; the model runs with ``compat="astra-sim-1.0"``.
"""

from __future__ import annotations

import csv
import statistics
from collections import defaultdict
from collections.abc import Sequence

from .collectives import Collective
from .config import RunConfig
from .cost import ASTRA_ENDPOINT_DELAY_NS, ASTRA_SIM_1_0
from .errors import UsageError
from .results import astra_busy_pct
from .run.collective import model_collective
from .topology import Topology, parse_topology

# The bounds: relative finish-time error per policy class, busy share in points.
TIME_BOUNDS = {("baseline", "fifo"): 0.005, ("themis", "scf"): 0.005, ("themis", "fifo"): 0.03}
BUSY_BOUND_PCT = 1.0
COLUMNS = (
    "topology",
    "inline_topology",
    "policy",
    "intra",
    "chunks",
    "alg_map",
    "size_bytes",
    "time_us",
    "avg_chunk_latency_per_dim_us",
    "dim_busy_pct_node0",
)


def reference_rows(path: str) -> list[dict]:
    """The CSV rows as dicts of strings; a file without the columns is refused in one line."""
    try:
        with open(path, newline="") as f:
            rows = list(csv.DictReader(f))
    except OSError as exc:
        raise UsageError(f"cannot read {path}: {exc.strerror}") from None
    missing = set(COLUMNS) - set(rows[0] if rows else ())
    if missing:
        raise UsageError(f"{path}: not an ASTRA-sim reference table (missing {', '.join(sorted(missing))})")
    return rows


def topology_of(row: dict) -> Topology:
    """The row's network with its algorithm map applied."""
    topo = parse_topology(row["inline_topology"])
    if row["alg_map"] == "allring":
        algorithms = ["ring"] * len(topo.dims)
    else:  # paper: halving-doubling on every Switch dim, the kind's default elsewhere
        algorithms = ["halving_doubling" if d.kind == "Switch" else d.algorithm for d in topo.dims]
    return topo.with_overrides(algorithms=algorithms)


def compare_row(row: dict) -> dict:
    """Model one reference row; the model's and ASTRA-sim's figures side by side, with errors."""
    topo = topology_of(row)
    size = int(row["size_bytes"])
    coll = Collective("all_reduce", size // 4, "float32", int(row["chunks"]), tuple(range(len(topo.dims))))
    config = RunConfig(intra=row["intra"], endpoint_delay_ns=ASTRA_ENDPOINT_DELAY_NS, compat=ASTRA_SIM_1_0)
    result, engine = model_collective(topo, coll, row["policy"], config)
    run = engine.collectives[0]
    ref_us = float(row["time_us"])
    busy = astra_busy_pct(run.runs, len(topo.dims), run.end_ns)
    ref_busy = [float(x) for x in row["dim_busy_pct_node0"].split()]
    latency = []
    for d in range(len(topo.dims)):
        mine = [r.end_ns - r.start_ns for r in run.runs if r.stage.dim == d]
        latency.append(sum(mine) / len(mine) / 1e3 if mine else 0.0)
    return {
        "topology": row["topology"],
        "policy": row["policy"],
        "intra": row["intra"],
        "chunks": int(row["chunks"]),
        "alg_map": row["alg_map"],
        "size_bytes": size,
        "time_us": result.time_us,
        "ref_time_us": ref_us,
        "time_err": (result.time_us - ref_us) / ref_us,
        "busy_pct": busy,
        "ref_busy_pct": ref_busy,
        "busy_err_pct": max(abs(a - b) for a, b in zip(busy, ref_busy)),
        "chunk_latency_us": latency,
        "ref_chunk_latency_us": [float(x) for x in row["avg_chunk_latency_per_dim_us"].split()],
    }


def error_summary(results: Sequence[dict], keys: Sequence[str]) -> list[dict]:
    """Max and median |finish-time error| and max busy error per group of `keys`."""
    groups: dict[tuple, list[dict]] = defaultdict(list)
    for r in results:
        groups[tuple(r[k] for k in keys)].append(r)
    out = []
    for key, rs in sorted(groups.items()):
        errs = [abs(r["time_err"]) for r in rs]
        out.append(
            {
                **dict(zip(keys, key)),
                "rows": len(rs),
                "max_time_err_pct": 100 * max(errs),
                "median_time_err_pct": 100 * statistics.median(errs),
                "max_busy_err_pct": max(r["busy_err_pct"] for r in rs),
            }
        )
    return out
