"""Timing analysis of recorded traces: per-dim busy and idle time, bytes, queueing delay.

The figures of `analyze`: each collective of a trace recomputed from its stage events, on one
rank or averaged over ranks, and the side-by-side comparison of several. Under a sharing rule the
trace also holds one NPU's physical links (bytes, busy time); a dim's utilization is then its
busiest link's, as in the run's own result, since stages that share a dim cannot make it busier
than 100 %.
"""

from __future__ import annotations

import os

import numpy as np

from .results import ASTRA_WINDOW_NS, bandwidths, finite_or_none, percentile, window_busy_pct
from .units import format_size


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
                    "astra_busy_pct": finite_or_none(
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
        links = trace.links[trace.links["collective"] == cid]
        for entry in dims:  # under a sharing rule a dim is as busy as its busiest link (as in `results`)
            on_links = links[links["dim"] == entry["dim"]]
            if len(on_links):
                entry["utilization"] = float(on_links["busy_pct"].max()) / 100
                entry["idle_us"] = time_us - float(on_links["busy_us"].max())
        row = trace.collective_row(cid)
        involved = [d for d in range(len(topo.dims)) if row["dims_mask"] >> d & 1]
        out.append(
            {
                "trace": trace.path,
                "topology": topo.label(),
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
                "network": trace.network,
                "links": [
                    {
                        "name": x["link"].decode(),
                        "dim": int(x["dim"]),
                        "bytes": float(x["bytes"]),
                        "busy_us": float(x["busy_us"]),
                        "busy_pct": float(x["busy_pct"]),
                    }
                    for x in links
                ],
            }
        )
    return out


SAME_RUN = ("op", "size_bytes", "topology", "chunks")  # what a row and its baseline share


def baseline_row(rows: list[dict], i: int) -> int | None:
    """The index of row i's baseline: the first baseline row of its op, size, topology and chunks."""
    key = tuple(rows[i].get(k) for k in SAME_RUN)
    matches = (
        j
        for j, r in enumerate(rows)
        if r["policy"] == "baseline" and tuple(r.get(k) for k in SAME_RUN) == key
    )
    return next(matches, None)


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
        if r.get("links"):
            lines.append(f"# links of one NPU under --network {r['network']}")
            lines.append(f"#{'link':>15} {'busy_us':>12} {'busy%':>7} {'bytes':>14}")
            for x in r["links"]:
                lines.append(
                    f" {x['name']:>15} {x['busy_us']:>12.2f} {x['busy_pct']:>7.2f} {x['bytes']:>14.0f}"
                )
    if len(rows) > 1:
        lines.append(
            "# side by side (GB/s with 1 GB = 2^30 B); speedup: the time of this row's baseline (the first "
            "baseline row of the same op, size, topology and chunks, #ref) over this one"
        )
        lines.append(
            f"#{'row':>4} {'trace':>30} {'coll':>4} {'policy':>8} {'intra':>5} {'size':>8} {'time_us':>12} "
            f"{'util%':>7} {'busbw':>8} {'speedup':>12}"
        )
        for i, r in enumerate(rows):
            ref = baseline_row(rows, i)
            speedup = (
                "ref"
                if ref == i
                else "-"
                if ref is None
                else f"{rows[ref]['time_us'] / r['time_us'] if r['time_us'] else 0:.2f}x vs #{ref}"
            )
            lines.append(
                f" {i:>4} {os.path.basename(r['trace']):>30} {r['collective']:>4} {r['policy']:>8} "
                f"{r['intra']:>5} {format_size(r['size_bytes']):>8} {r['time_us']:>12.2f} "
                f"{100 * r['utilization']:>7.2f} {r['busbw_gbps']:>8.2f} {speedup:>12}"
            )
    return "\n".join(lines)
