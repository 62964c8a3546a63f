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
import os
import statistics
from collections import defaultdict
from collections.abc import Sequence

from .collectives import AR_EVERY_DIM, Collective
from .config import RunConfig
from .cost import ASTRA_ENDPOINT_DELAY_NS, ASTRA_SIM_1_0, ASTRA_SIM_2
from .engine import Engine, Transport
from .errors import UsageError
from .policies.base import baseline_order, fixed_schedule
from .results import astra_busy_pct
from .run.collective import model_collective
from .timing.planner import Run, each_npu, plan
from .timing.rules import IDEAL, STORE_FORWARD
from .topology import Topology, from_link_bandwidths, parse_topology

# The issue's bounds: relative finish-time error per policy class, busy share in points.
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


def read_rows(path: str, columns: Sequence[str], what: str) -> list[dict]:
    """A CSV's rows as dicts of strings; a file without the columns is refused in one line naming `what`."""
    try:
        with open(path, newline="") as f:
            rows = list(csv.DictReader(f))
    except OSError as exc:
        raise UsageError(f"cannot read {path}: {exc.strerror}") from None
    missing = set(columns) - set(rows[0] if rows else ())
    if missing:
        raise UsageError(f"{path}: not {what} (missing {', '.join(sorted(missing))})")
    return rows


def reference_rows(path: str) -> list[dict]:
    """The 1.0 reference CSV's rows (`COLUMNS`)."""
    return read_rows(path, COLUMNS, "an ASTRA-sim reference table")


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


def _by_group(results: Sequence[dict], keys: Sequence[str]) -> list[tuple[dict, list[dict]]]:
    """The rows grouped by the values of `keys`, groups in sorted order, each with its key as a dict."""
    groups: dict[tuple, list[dict]] = defaultdict(list)
    for r in results:
        groups[tuple(r[k] for k in keys)].append(r)
    return [(dict(zip(keys, key)), rs) for key, rs in sorted(groups.items())]


def error_summary(results: Sequence[dict], keys: Sequence[str]) -> list[dict]:
    """Max and median |finish-time error| and max busy error per group of `keys`."""
    out = []
    for key, rs in _by_group(results, keys):
        errs = [abs(r["time_err"]) for r in rs]
        out.append(
            {
                **key,
                "rows": len(rs),
                "max_time_err_pct": 100 * max(errs),
                "median_time_err_pct": 100 * statistics.median(errs),
                "max_busy_err_pct": max(r["busy_err_pct"] for r in rs),
            }
        )
    return out


# --- ASTRA-sim 2.x (tests/data/astra-sim-reference-2) -------------------------------------------

COLUMNS_2 = (
    "run_id",
    "section",
    "backend",
    "binary_variant",
    "topology",
    "collectives",
    "size_bytes",
    "scheduling_policy",
    "collective_optimization",
    "active_chunks_per_dim",
    "splits",
    "implementation",
    "finish_ns",
    "node0_end_ns",
    "node1_end_ns",
)
RUNS_2 = "runs.csv"  # 1-D congestion-aware runs, and every section of both backends
RUNS_2_MULTIDIM = "runs-multidim.csv"  # multi-dim congestion-aware runs (an unmerged branch), 64 MiB
ALGORITHMS_2 = {"ring": "ring", "direct": "direct", "halvingDoubling": "halving_doubling"}
BACKENDS_2 = {"congestion_unaware": IDEAL, "congestion_aware": STORE_FORWARD}
OPTIMIZATIONS_2 = {"localBWAware": True, "baseline": AR_EVERY_DIM}  # `Schedule.fuse_last`


def reference_rows_2(path: str) -> list[dict]:
    """A 2.x run table's rows (`COLUMNS_2`) as dicts of strings.

    Both tables of the folder have the same columns: `RUNS_2` and `RUNS_2_MULTIDIM` (section
    ``X_multidim_branch_allreduce_grid``, ``binary_variant`` ``multidim_branch``), and
    `compare_row_2` models a row of either.
    """
    return read_rows(path, COLUMNS_2, "an ASTRA-sim 2.x run table")


def topology_of_2(row: dict, network_dir: str) -> Topology:
    """The row's network YAML (bandwidth per link) with the row's algorithm on every dim."""
    topo = from_link_bandwidths(parse_topology(os.path.join(network_dir, f"net_{row['topology']}.yml")))
    return topo.with_overrides(algorithms=[ALGORITHMS_2[row["implementation"]]] * len(topo.dims))


def run_row_2(row: dict, network_dir: str) -> list[Engine]:
    """Model one 2.x row: its collectives on one engine under ``compat="astra-sim-2"``.

    Where the congestion-aware backend's links carry uneven loads (`timing.routes.uneven_dims`),
    every NPU runs its engine on its own links and all the engines are returned, by rank;
    otherwise one NPU stands for all (the one engine). The planner says which.
    """
    topo = topology_of_2(row, network_dir)
    config = RunConfig(
        active_per_dim=int(row["active_chunks_per_dim"]),
        endpoint_delay_ns=ASTRA_ENDPOINT_DELAY_NS,
        compat=ASTRA_SIM_2,
        network=BACKENDS_2[row["backend"]],
        compat_concurrent=row["binary_variant"] == "hwres_multi_comm",
        compat_fifo=row["scheduling_policy"] == "FIFO",
    )
    dependent = "->" in row["collectives"]
    ops = row["collectives"].replace("->", "+").split("+")
    dims = tuple(range(len(topo.dims)))
    splits = int(row["splits"])
    colls = []
    for op, size in zip(ops, row["size_bytes"].split("|")):
        op = op.lower()
        n_bytes = max(int(size), splits * topo.npus)  # a chunk has at least total_npus bytes
        coll = Collective(op, n_bytes // 4, "float32", splits, dims)
        fuse = OPTIMIZATIONS_2[row["collective_optimization"]] if op == "all_reduce" else False
        colls.append((coll, fixed_schedule(coll, [baseline_order(op, len(dims))] * splits, fuse, "fifo")))

    def play(transport: Transport) -> Engine:
        engine = Engine(topo, transport, config)

        def workload():
            for coll, schedule in colls:
                run = engine.issue(coll, schedule)
                if dependent:
                    yield run

        engine.process(workload())
        engine.run()
        return engine

    return each_npu(plan(Run(topo, config)), config, play)


def compare_row_2(row: dict, network_dir: str) -> dict:
    """Model one 2.x row; finish and per-collective ends (the last NPU's) beside ASTRA-sim's, errors in ns."""
    engines = run_row_2(row, network_dir)
    ends = [max(int(e.collectives[i].end_ns) for e in engines) for i in range(len(engines[0].collectives))]
    ref_ends = [int(row[f"node{i}_end_ns"]) for i in range(len(ends))]
    finish, ref = max(ends), int(row["finish_ns"])
    return {
        "run_id": row["run_id"],
        "section": row["section"],
        "backend": row["backend"],
        "variant": row["binary_variant"],
        "topology": row["topology"],
        "implementation": row["implementation"],
        "optimization": row["collective_optimization"],
        "active": int(row["active_chunks_per_dim"]),
        "splits": int(row["splits"]),
        "finish_ns": finish,
        "ref_finish_ns": ref,
        "ends_ns": ends,
        "ref_ends_ns": ref_ends,
        "err_ns": max(abs(finish - ref), *(abs(a - b) for a, b in zip(ends, ref_ends))),
        "time_err": (finish - ref) / ref,
    }


def error_summary_2(results: Sequence[dict], keys: Sequence[str]) -> list[dict]:
    """Rows exact to the ns, max error in ns and max and median |finish-time error| per group of `keys`."""
    out = []
    for key, rs in _by_group(results, keys):
        errs = [abs(r["time_err"]) for r in rs]
        out.append(
            {
                **key,
                "rows": len(rs),
                "exact": sum(r["err_ns"] == 0 for r in rs),
                "max_err_ns": max(r["err_ns"] for r in rs),
                "max_time_err_pct": 100 * max(errs),
                "median_time_err_pct": 100 * statistics.median(errs),
            }
        )
    return out
