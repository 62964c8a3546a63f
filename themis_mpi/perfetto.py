"""Chrome trace-event JSON from a trace, for ui.perfetto.dev or chrome://tracing.

One process per NPU rank (pid = rank), one thread per dim and active slot
(tid = dim * slots + slot), one complete event ("X") per stage with ``ts``/``dur`` in
microseconds, and flow events ("s"/"f") linking each chunk's consecutive stages.
"""

from __future__ import annotations

import json

import numpy as np

from .errors import UsageError
from .output import atomic_path


def to_perfetto(trace, ranks=None, window_us=None, collectives=None) -> dict:
    """The trace-event document of a trace, optionally filtered by rank, time window, collective.

    Collectives are laid end to end on one time axis (1 us apart); the window is on that axis,
    the one the exported file shows. A selection that keeps no stage is refused.
    """
    offsets = {}  # collectives laid end to end on one time axis
    t = 0.0
    for row in trace.collectives:
        offsets[int(row["collective"])] = t
        t += float(row["time_us"]) + 1.0
    ev = trace.events
    if ranks is not None:
        ev = ev[np.isin(ev["rank"], list(ranks))]
    if collectives is not None:
        ev = ev[np.isin(ev["collective"], list(collectives))]
    if window_us is not None:
        lo, hi = window_us
        shift = np.array([offsets[int(c)] for c in ev["collective"]])
        ev = ev[(ev["end_us"] + shift > lo) & (ev["start_us"] + shift < hi)]
    if not len(ev):
        raise UsageError("the selection (ranks, window, collective) keeps no stage of the trace")
    slots = int(ev["slot"].max()) + 1 if len(ev) else 1
    out = []
    topo = trace.topology_table
    for rank in sorted(set(ev["rank"].tolist())):
        out.append(
            {
                "ph": "M",
                "name": "process_name",
                "pid": rank,
                "tid": 0,
                "ts": 0,
                "args": {"name": f"NPU {rank}"},
            }
        )
        for d in range(len(topo)):
            for s in range(slots):
                out.append(
                    {
                        "ph": "M",
                        "name": "thread_name",
                        "pid": rank,
                        "tid": d * slots + s,
                        "ts": 0,
                        "args": {
                            "name": f"dim {d} ({topo['kind'][d].decode()})"
                            + (f" slot {s}" if slots > 1 else "")
                        },
                    }
                )
    order = np.lexsort((ev["stage"], ev["chunk"], ev["collective"], ev["rank"]))
    previous = None
    for e in ev[order]:
        coll, chunk, rank = int(e["collective"]), int(e["chunk"]), int(e["rank"])
        ts = offsets[coll] + float(e["start_us"])
        tid = int(e["dim"]) * slots + int(e["slot"])
        op = e["op"].decode()
        out.append(
            {
                "ph": "X",
                "name": f"{op} c{chunk}",
                "cat": op,
                "pid": rank,
                "tid": tid,
                "ts": ts,
                "dur": float(e["end_us"] - e["start_us"]),
                "args": {
                    "collective": coll,
                    "chunk": chunk,
                    "stage": int(e["stage"]),
                    "bytes": int(e["bytes"]),
                    "queued_us": float(e["queued_us"]),
                    "wait_us": float(e["start_us"] - e["queued_us"]),
                },
            }
        )
        key = (rank, coll, chunk)
        if previous is not None and previous[0] == key:
            flow_id = f"{rank}.{coll}.{chunk}.{int(e['stage'])}"
            out.append(
                {
                    "ph": "s",
                    "name": "chunk",
                    "cat": "flow",
                    "id": flow_id,
                    "pid": rank,
                    "tid": previous[1],
                    "ts": previous[2],
                }
            )
            out.append(
                {
                    "ph": "f",
                    "bp": "e",
                    "name": "chunk",
                    "cat": "flow",
                    "id": flow_id,
                    "pid": rank,
                    "tid": tid,
                    "ts": ts,
                }
            )
        previous = (key, tid, offsets[coll] + float(e["end_us"]) - 1e-3)
    return {
        "traceEvents": out,
        "displayTimeUnit": "ns",
        "otherData": {"topology": trace.attrs["topology"], "source": trace.path},
    }


def write_perfetto(doc: dict, path: str) -> None:
    """Write the document as JSON (complete or not at all)."""
    with atomic_path(path) as tmp, open(tmp, "w") as f:
        json.dump(doc, f)
