"""Timing analysis of a finished collective: per-dim busy time, bytes, utilization, bandwidths.

Bandwidths are in GB/s with 1 GB = 2^30 bytes. algbw is ``size / time``; busbw scales it by
nccl-tests' factor (``2 (N-1)/N`` for all-reduce, ``(N-1)/N`` otherwise) so that it compares with
the per-NPU link bandwidth. Utilization is ``ideal / actual`` (THEMIS.md); a dim's utilization is
its busy time over the collective time.
"""

from __future__ import annotations

import math
import os
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass

import numpy as np

from .cost import CostModel, ideal_time_us
from .engine import CollectiveRun, StageRun
from .topology import BYTES_PER_GB, Topology


def busbw_factor(op: str, npus: int) -> float:
    """nccl-tests' bus-bandwidth factor for an op over npus NPUs."""
    if npus <= 1:
        return 0.0
    return 2.0 * (npus - 1) / npus if op == "all_reduce" else (npus - 1) / npus


ASTRA_WINDOW_NS = 10_000.0  # ASTRA-sim's report_percentage(10000): 10 us windows


@dataclass
class DimResult:
    """One dim's share of a run on one NPU: busy time, bytes sent, stages served.

    `utilization` is busy time over the run's time; `astra_busy_pct` is ASTRA-sim's figure (a dim
    counts as busy while a stage is queued or running, averaged over complete 10 us windows; None
    when the run is shorter than one window), see `astra_busy_pct`.
    """

    dim: int
    busy_us: float
    bytes: int
    stages: int
    utilization: float
    astra_busy_pct: float | None = None

    def to_dict(self) -> dict:
        """Plain values for JSON."""
        return asdict(self)


@dataclass
class CollectiveResult:
    """One collective's outcome, the same on every rank (a row of `run` and `model`).

    Times are virtual microseconds except `wall_s` (the slowest rank's wall seconds); under the
    wall clock `time_us` is the measured wall time divided by the time scale and `virtual_us`
    keeps the virtual one. `wrong` is summed over ranks (None when not checked, and in the model).
    `dim_bound_us` is the per-dim bound of the schedule that ran, ``max_d(bytes_d / B_d)``;
    `schedule` names what the policy chose (e.g. ``themis-lat/scf/16`` under predictive) and
    `decision_s` is the coordinator's time to choose it.
    """

    op: str
    involved: list[int]
    issued_us: float
    size_bytes: int
    count: int
    dtype: str
    redop: str
    chunks: int
    time_us: float
    ideal_us: float
    algbw_gbps: float
    busbw_gbps: float
    utilization: float
    dims: list[DimResult]
    policy: str = ""
    intra: str = ""
    clock: str = "model"
    wrong: int | None = None
    wall_s: float = 0.0
    virtual_us: float | None = None
    topology: str = ""
    npus: int = 0
    iters: int = 1
    time_scale: float = 1.0
    dim_bound_us: float = 0.0
    schedule: str = ""
    decision_s: float = 0.0

    def to_dict(self) -> dict:
        """Plain values for JSON (dims as a list of dicts)."""
        return asdict(self)


@dataclass
class TrainingResult:
    """Training iterations of a workload under one policy (a row of `train`)."""

    policy: str
    intra: str
    chunks: int
    transport: str
    iterations: int
    total_us: float
    iteration_us: float
    last_iteration_us: float
    compute_us: float
    exposed_comm_us: float
    collectives: int
    dims: list[DimResult]
    wrong: int | None = None
    wall_s: float = 0.0
    speedup: float | None = None
    workload: str = ""
    topology: str = ""
    npus: int = 0
    decision_s: float = 0.0

    def to_dict(self) -> dict:
        """Plain values for JSON (dims as a list of dicts)."""
        return asdict(self)


def dim_results(
    records: list[StageRun],
    topology: Topology,
    cost: Callable[[int], CostModel],
    time_us: float,
    span_ns: tuple[float, float] = (0.0, 0.0),
) -> list[DimResult]:
    """Per dim: busy time, bytes and stages of the given stage runs, and busy share of time_us.

    `span_ns` (virtual start and end) gives ASTRA-sim's windowed busy share as well.
    """
    astra = astra_busy_pct(records, len(topology.dims), span_ns[1], start_ns=span_ns[0])
    out = []
    for d, mine in enumerate(runs_by_dim(records, len(topology.dims))):
        busy_us = sum([r.end_ns - r.start_ns for r in mine]) / 1e3
        shapes = Counter([(r.stage.itemsize, r.stage.op, r.stage.full_elems) for r in mine])
        sent = sum(cost(size).stage_bytes(d, op, elems) * n for (size, op, elems), n in shapes.items())
        utilization = busy_us / time_us if time_us > 0 else 0.0
        out.append(DimResult(d, busy_us, int(sent), len(mine), utilization, _finite(astra[d])))
    return out


def runs_by_dim(runs: Sequence[StageRun], n_dims: int) -> list[list[StageRun]]:
    """The runs of each dim, in their order (one pass)."""
    by_dim: list[list[StageRun]] = [[] for _ in range(n_dims)]
    for r in runs:
        by_dim[r.stage.dim].append(r)
    return by_dim


def _finite(value: float) -> float | None:
    return value if math.isfinite(value) else None


def summarize(
    run: CollectiveRun, topology: Topology, cost: Callable[[int], CostModel], time_us: float | None = None
) -> CollectiveResult:
    """The result of one collective: times, bandwidths, utilization, per-dim figures.

    `time_us` overrides the engine's (virtual) collective time, as the wall clock measures its own.
    """
    coll = run.collective
    if time_us is None:
        time_us = (run.end_ns - run.issued_ns) / 1e3
    ideal_us = ideal_time_us(coll.op, coll.size_bytes, topology, coll.dims)
    algbw, busbw = bandwidths(coll.op, coll.size_bytes, time_us, topology.group_npus(coll.dims))
    dims = dim_results(run.runs, topology, cost, time_us, (run.issued_ns, run.end_ns))
    return CollectiveResult(
        op=coll.op,
        involved=list(coll.dims),
        issued_us=run.issued_ns / 1e3,
        size_bytes=coll.size_bytes,
        count=coll.count,
        dtype=coll.dtype,
        redop=coll.redop,
        chunks=len(run.bounds) - 1,
        time_us=time_us,
        ideal_us=ideal_us,
        algbw_gbps=algbw,
        busbw_gbps=busbw,
        utilization=ideal_us / time_us if time_us > 0 else 1.0,
        dims=dims,
        dim_bound_us=dim_bound_us(dims, topology),
    )


def dim_bound_us(dims: Sequence[DimResult], topology: Topology) -> float:
    """The per-dim bound of a schedule: ``max_d(bytes_d / B_d)`` in us (bytes one NPU sent on d)."""
    return max(
        (d.bytes / topology.dims[d.dim].bandwidth_bytes_per_ns / 1e3 for d in dims),
        default=0.0,
    )


def bandwidths(op: str, size_bytes: int, time_us: float, npus: int) -> tuple[float, float]:
    """Algbw and busbw in GB/s (2^30 B) of a collective of size_bytes that took time_us."""
    if time_us <= 0:
        return 0.0, 0.0
    algbw = size_bytes / (time_us * 1e-6) / BYTES_PER_GB
    return algbw, algbw * busbw_factor(op, npus)


def format_size(n_bytes: int) -> str:
    """The one size format of every table and plot: binary units, e.g. 64 MiB, 1.5 KiB, 512 B."""
    for suffix, scale in (("TiB", 2**40), ("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if n_bytes >= scale:
            value = n_bytes / scale
            return f"{value:.0f} {suffix}" if n_bytes % scale == 0 else f"{value:.3g} {suffix}"
    return f"{n_bytes} B"


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


def flat_row(row: dict) -> dict:
    """A result's dict with its per-dim list spread into columns (dim0_busy_us, ...), for CSV."""
    out = {k: v for k, v in row.items() if k != "dims"}
    out["involved"] = " ".join(map(str, out.get("involved", []))) if "involved" in out else None
    for d in row.get("dims", []):
        for key, value in d.items():
            if key != "dim":
                out[f"dim{d['dim']}_{key}"] = value
    return {k: v for k, v in out.items() if v is not None or k != "involved"}


def queue_levels(queued_us: np.ndarray, started_us: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Stages waiting in a queue after each instant at which it changes: (times, levels).

    Changes at one instant are applied together, so a stage queued and started at the same time
    never shows, and the level is never negative.
    """
    times = np.concatenate([queued_us, started_us])
    steps = np.concatenate([np.ones(len(queued_us)), -np.ones(len(started_us))])
    unique, index = np.unique(times, return_inverse=True)
    levels = np.cumsum(np.bincount(index, weights=steps, minlength=len(unique)))
    return unique, levels


def median(values: Sequence[float]) -> float:
    """The median, in plain Python: `numpy.median` imports `numpy.ma` (25 ms of CPU on every rank)."""
    ordered = sorted(values)
    n = len(ordered)
    return (ordered[n // 2] + ordered[(n - 1) // 2]) / 2


def percentile(values, q: float) -> float:
    """The q-th percentile (0-100) of values, 0 for none."""
    return float(np.percentile(values, q)) if len(values) else 0.0


def analyze_trace(trace, rank: int | None = 0) -> list[dict]:
    """Per collective of a trace: times, bandwidths and per-dim figures recomputed from events.

    Args:
        trace: a `trace.Trace`.
        rank: whose events give busy time and bytes (None: the mean over ranks); queueing delays
            always pool every rank's stages.
    """
    topo = trace.topology()
    ev = trace.events
    out = []
    for c in trace.collectives:
        cid = int(c["collective"])
        mine = ev[ev["collective"] == cid]
        ranks = np.unique(mine["rank"])
        sel = mine if rank is None else mine[mine["rank"] == rank]
        n_ranks = len(ranks) if rank is None else 1
        time_us = float(sel["end_us"].max()) if len(sel) else 0.0
        dims = []
        for d in range(len(topo.dims)):
            on_dim = sel[sel["dim"] == d]
            busy = float((on_dim["end_us"] - on_dim["start_us"]).sum()) / n_ranks
            pooled = mine[mine["dim"] == d]
            wait = pooled["start_us"] - pooled["queued_us"]
            dims.append(
                {
                    "dim": d,
                    "busy_us": busy,
                    "idle_us": time_us - busy,
                    "bytes": int(on_dim["bytes"].sum() // n_ranks),
                    "stages": int(len(on_dim) // n_ranks),
                    "utilization": busy / time_us if time_us > 0 else 0.0,
                    "queue_mean_us": float(wait.mean()) if len(wait) else 0.0,
                    "queue_p50_us": percentile(wait, 50),
                    "queue_p99_us": percentile(wait, 99),
                    "astra_busy_pct": _finite(
                        window_busy_pct(
                            list(zip(on_dim["queued_us"] * 1e3, on_dim["end_us"] * 1e3)),
                            0.0,
                            time_us * 1e3,
                            ASTRA_WINDOW_NS,
                        )
                    )
                    if rank is not None
                    else None,
                }
            )
        row = trace.collective_row(cid)
        involved = [d for d in range(len(topo.dims)) if row["dims_mask"] >> d & 1]
        out.append(
            {
                "trace": trace.path,
                "collective": cid,
                "op": row["op"],
                "policy": row["policy"],
                "intra": row["intra"],
                "size_bytes": row["size_bytes"],
                "chunks": row["chunks"],
                "time_us": time_us,
                "ideal_us": row["ideal_us"],
                "utilization": row["ideal_us"] / time_us if time_us > 0 else 1.0,
                **dict(
                    zip(
                        ("algbw_gbps", "busbw_gbps"),
                        bandwidths(row["op"], row["size_bytes"], time_us, topo.group_npus(involved)),
                    )
                ),
                "wrong": None if row["wrong"] < 0 else row["wrong"],
                "ranks": int(len(ranks)),
                "dims": dims,
            }
        )
    return out


def format_analysis(rows: list[dict]) -> str:
    """The `analyze` table: one block per collective, one line per dim."""
    lines = []
    for r in rows:
        wrong = "N/A" if r["wrong"] is None else r["wrong"]
        lines.append(
            f"# {r['trace']} #{r['collective']}: {r['op']} {format_size(r['size_bytes'])}, {r['policy']}/"
            f"{r['intra']}, {r['chunks']} chunks, {r['ranks']} rank(s): time {r['time_us']:.2f} us, "
            f"ideal {r['ideal_us']:.2f} us, utilization {100 * r['utilization']:.2f} %, algbw "
            f"{r['algbw_gbps']:.2f} GB/s, busbw {r['busbw_gbps']:.2f} GB/s, #wrong {wrong}"
        )
        lines.append(
            f"#{'dim':>4} {'busy_us':>12} {'idle_us':>12} {'util%':>7} {'astra%':>7} {'bytes':>14} "
            f"{'stages':>7} {'queue_mean_us':>14} {'queue_p50_us':>13} {'queue_p99_us':>13}"
        )
        for d in r["dims"]:
            astra = "-" if d["astra_busy_pct"] is None else f"{d['astra_busy_pct']:.2f}"
            lines.append(
                f" {d['dim']:>4} {d['busy_us']:>12.2f} {d['idle_us']:>12.2f} "
                f"{100 * d['utilization']:>7.2f} {astra:>7} {d['bytes']:>14} {d['stages']:>7} "
                f"{d['queue_mean_us']:>14.2f} {d['queue_p50_us']:>13.2f} {d['queue_p99_us']:>13.2f}"
            )
    if len(rows) > 1:
        lines.append(
            "# side by side (GB/s with 1 GB = 2^30 B); speedup: the time of the first row of the same op and "
            "size (#ref) over this one"
        )
        lines.append(
            f"#{'row':>4} {'trace':>30} {'coll':>4} {'policy':>8} {'intra':>5} {'size':>8} {'time_us':>12} "
            f"{'util%':>7} {'busbw':>8} {'speedup':>12}"
        )
        reference: dict[tuple, int] = {}
        for i, r in enumerate(rows):
            ref = reference.setdefault((r["op"], r["size_bytes"]), i)
            speedup = (
                "ref"
                if ref == i
                else f"{rows[ref]['time_us'] / r['time_us'] if r['time_us'] else 0:.2f}x vs #{ref}"
            )
            lines.append(
                f" {i:>4} {os.path.basename(r['trace']):>30} {r['collective']:>4} {r['policy']:>8} "
                f"{r['intra']:>5} {format_size(r['size_bytes']):>8} {r['time_us']:>12.2f} "
                f"{100 * r['utilization']:>7.2f} {r['busbw_gbps']:>8.2f} {speedup:>12}"
            )
    return "\n".join(lines)


def astra_busy_pct(
    runs: Sequence[StageRun],
    n_dims: int,
    end_ns: float,
    window_ns: float = ASTRA_WINDOW_NS,
    since: str = "queued",
    start_ns: float = 0.0,
) -> list[float]:
    """Per-dim utilization as ASTRA-sim 1.0 reports it for one NPU, in percent.

    ASTRA-sim's ``SchedulerUnit`` counts the chunks in a dim's queue (``active_Streams``: waiting
    or running) and its ``UsageTracker`` marks the dim busy while that count is above zero
    (``notify_stream_added`` / ``notify_stream_removed`` in Sys.cc). ``report_percentage(10000)``
    (Workload.cc, UsageTracker.cc) cuts ``[start, end)`` into 10 us windows and reports the busy
    share of every *complete* window (a last partial window is dropped); the mean is the figure.

    Args:
        runs: the stage records of one NPU.
        n_dims: dims of the topology.
        end_ns: the report time (the collective's end).
        window_ns: window length (ASTRA-sim: 10000 cycles of 1 ns).
        since: "queued" (ASTRA-sim: a queued stage makes its dim busy) or "start".
        start_ns: where the first window starts (the collective's issue).

    Returns:
        One percentage per dim; NaN when no window is complete.
    """
    by_dim = runs_by_dim(runs, n_dims)
    if since == "queued":
        spans = [[(r.queued_ns, r.end_ns) for r in mine] for mine in by_dim]
    else:
        spans = [[(r.start_ns, r.end_ns) for r in mine] for mine in by_dim]
    return [window_busy_pct(s, start_ns, end_ns, window_ns) for s in spans]


def window_busy_pct(
    spans: Sequence[tuple[float, float]], start_ns: float, end_ns: float, window_ns: float
) -> float:
    """Mean busy share (percent) of the complete windows of [start, end) covered by the union of spans.

    Every complete window counts equally, so the mean of their shares is the busy time within
    the complete windows over their total length: one pass over the merged spans.
    """
    n_windows = int((end_ns - start_ns) // window_ns)
    if n_windows <= 0:
        return math.nan
    lo, hi = start_ns, start_ns + n_windows * window_ns
    busy, reach = 0.0, lo  # reach: how far the union of the spans seen so far extends
    for a, b in sorted(spans):
        if a < reach:  # (comparisons, not max/min: this loop runs once per stage)
            a = reach
        if b > hi:
            b = hi
        if b > a:
            busy += b - a
            reach = b
    return 100.0 * busy / (hi - lo)
