"""Replay a trace: the recorded chunk orders and sizes, again, on the same or a changed network.

On the model backend the model replays; on the MPI backend (one rank per NPU) the emulator
replays on real data. An unchanged replay must reproduce every recorded event time exactly, and
says whether it did; a changed topology (another preset with the same dim sizes, or per-dim
bandwidth, latency or algorithm overrides) answers a what-if question about the same schedule.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field

import numpy as np

from .collectives import Collective
from .config import RunConfig
from .errors import UsageError
from .policies import Schedule, inter_class, is_inter
from .progress import Progress, tell
from .results import CollectiveResult
from .run.backend import Backend
from .run.collective import run_collective
from .timing.packet import recorded_mtu
from .timing.rules import PACKET, check_rule
from .topology import Topology
from .trace import Trace, TraceRecorder
from .units import format_size


def recorded_collectives(trace: Trace) -> Iterator[tuple[Collective, str, str, Schedule]]:
    """(Collective, policy, intra, schedule) of every collective in the trace, in order.

    Traces written before chunk bounds were recorded get the nominal chunks and the policy's
    fused rule.
    """
    n = len(trace.topology_table)
    for c in trace.collectives["collective"].tolist():
        row = trace.collective_row(c)
        dims = tuple(d for d in range(n) if row["dims_mask"] >> d & 1)
        coll = Collective(
            row["op"], row["count"], row["dtype"], row["chunks"], dims, row["redop"], row["size_bytes"]
        )
        recorded = trace.bounds_and_fused(c)
        if recorded is None:
            policy = row["policy"]
            fused = is_inter(policy) and inter_class(policy).fuses_last_dim
            recorded = coll.chunk_bounds(), fused
        bounds, fused = recorded
        yield (
            coll,
            row["policy"],
            row["intra"],
            Schedule(bounds, trace.orders(c), fused, row["intra"], "replay"),
        )


def compare_events(recorded: np.ndarray, replayed: np.ndarray) -> float:
    """Largest |difference| in us of queued/start/end times, event by event.

    Returns inf when the two tables differ in number or identity of events.
    """
    if len(recorded) != len(replayed):
        return float("inf")
    key = ("rank", "collective", "chunk", "stage")
    a, b = np.sort(recorded, order=key), np.sort(replayed, order=key)
    if any((a[k] != b[k]).any() for k in (*key, "dim")):
        return float("inf")
    return max(float(np.abs(a[k] - b[k]).max(initial=0.0)) for k in ("queued_us", "start_us", "end_us"))


@dataclass
class ReplayResult:
    """What a replay gave, on rank 0 (the other ranks get an empty one).

    Attributes:
        results: one result per replayed collective.
        recorder: the replay's own trace (events of every rank in `events`).
        events: every rank's replayed events (rank 0 only).
        unchanged: the replay ran on the recorded topology under the recorded sharing rule.
        max_event_diff_us: largest event time difference against the recording (inf: not comparable).
    """

    results: list[CollectiveResult] = field(default_factory=list)
    recorder: TraceRecorder | None = None
    events: np.ndarray | None = None
    unchanged: bool = True
    max_event_diff_us: float = float("inf")

    @property
    def reproduced(self) -> bool:
        """An unchanged replay gave every recorded event time exactly."""
        return self.unchanged and self.max_event_diff_us == 0

    def to_dict(self, trace: Trace) -> dict:
        """Plain values for JSON: per collective, the recorded and the replayed time."""
        out = []
        for c, r in enumerate(self.results):
            old = trace.collective_row(c)["time_us"]
            out.append(
                {
                    "collective": c,
                    "recorded_us": old,
                    "replay_us": r.time_us,
                    "change": r.time_us / old - 1 if old else 0.0,
                    "row": r.to_dict(),
                }
            )
        diff = self.max_event_diff_us
        return {
            "unchanged": self.unchanged,
            "max_event_diff_us": diff if np.isfinite(diff) else None,
            "collectives": out,
        }


def replay_trace(
    trace: Trace,
    topology: Topology,
    backend: Backend,
    timeout_s: float,
    network: str | None = None,
    mtu_bytes: int | None = None,
    progress: Progress | None = None,
) -> ReplayResult:
    """Run the trace's collectives with their recorded orders and settings on `topology`.

    `network` replays under another sharing rule (None: the recorded one) and `mtu_bytes` with
    another packet (None: the recorded one, under the packet rule); a changed rule or packet is
    a what-if, like a changed topology. `progress` is told each collective replayed.

    Raises:
        UsageError: the topology's dim sizes differ from the recorded ones.
    """
    recorded_topo = trace.topology()
    if topology.shape != recorded_topo.shape:
        raise UsageError(
            f"replay needs the recorded dim sizes {'x'.join(map(str, recorded_topo.shape))}, "
            f"got {'x'.join(map(str, topology.shape))}"
        )
    active = int(trace.attrs.get("active_per_dim", 1))
    delay = float(trace.attrs.get("endpoint_delay_ns", 0.0))
    compat = str(trace.attrs.get("compat", ""))
    network = trace.network if network is None else network
    check_rule(topology, network)
    if mtu_bytes is None and network == PACKET and trace.mtu_bytes:
        mtu_bytes = trace.mtu_bytes
    recorder = TraceRecorder(
        topology,
        backend.name,
        clock="virtual",
        time_scale=1.0,
        active_per_dim=active,
        endpoint_delay_ns=delay,
        compat=compat,
        network=network,
        mtu_bytes=recorded_mtu(topology, network, mtu_bytes),
    )
    results = []
    total = len(trace.collectives)
    for coll, policy, intra, schedule in recorded_collectives(trace):
        config = RunConfig(
            intra=intra,
            active_per_dim=active,
            endpoint_delay_ns=delay,
            timeout_s=timeout_s,
            compat=compat,
            network=network,
            mtu_bytes=mtu_bytes,
        )
        result, engine = run_collective(backend.transport(config), coll, policy, schedule=schedule)
        results.append(result)
        recorder.add_run(result, engine, backend.rank)
        tell(progress, len(results), total)
    events = backend.gather(recorder.my_events())
    if events is None:
        return ReplayResult()
    recorded_ranks = np.unique(trace.events["rank"])
    if backend.name == "model" and len(recorded_ranks) > 1:  # the model's NPU stands for every rank
        events = np.concatenate([_with_rank(events, int(r)) for r in recorded_ranks])
    compared = events
    if len(recorded_ranks) == 1 and backend.name == "mpi":  # a model trace: its NPU is rank 0
        compared = events[events["rank"] == recorded_ranks[0]]
    unchanged = (
        topology.dims == recorded_topo.dims
        and network == trace.network
        and recorded_mtu(topology, network, mtu_bytes) == trace.mtu_bytes
    )
    return ReplayResult(results, recorder, events, unchanged, compare_events(trace.events, compared))


def _with_rank(events: np.ndarray, rank: int) -> np.ndarray:
    out = events.copy()
    out["rank"] = rank
    return out


def replay_header(
    trace: Trace, topology: Topology, backend: str, network: str | None = None, mtu_bytes: int | None = None
) -> str:
    """The replay's first line, known before it runs: what is replayed, where, and what changed."""
    network = trace.network if network is None else network
    unchanged = (
        topology.dims == trace.topology().dims
        and network == trace.network
        and (mtu_bytes is None or recorded_mtu(topology, network, mtu_bytes) == trace.mtu_bytes)
    )
    return (
        f"# replay of {trace.path} ({trace.attrs['transport']}, {trace.attrs['topology_label']}) on "
        f"{'the emulator' if backend == 'mpi' else 'the model'}, topology {topology.label()}"
        + (f", network {network} (recorded {trace.network})" if network != trace.network else "")
        + ("" if unchanged else " (changed)")
    )


def format_replay(
    trace: Trace, replay: ReplayResult, topology: Topology, backend: str, header: bool = True
) -> str:
    """The replay table: recorded and replayed time and per-dim busy time of every collective.

    Its first line is `replay_header` (without `header`: the command printed it before the run).
    """
    network = replay.results[0].network if replay.results else None
    lines = [replay_header(trace, topology, backend, network)] if header else []
    lines += [
        f"#{'coll':>4} {'op':>14} {'policy':>8} {'size':>12} {'recorded_us':>12} {'replay_us':>12} "
        f"{'change%':>8}  per-dim busy_us recorded -> replay",
    ]
    for c, r in enumerate(replay.results):
        old = trace.collective_row(c)
        old_dims = trace.summary[trace.summary["collective"] == c]
        busy = "  ".join(f"d{d.dim}:{o:.2f}->{d.busy_us:.2f}" for d, o in zip(r.dims, old_dims["busy_us"]))
        change = 100 * (r.time_us / old["time_us"] - 1) if old["time_us"] else 0.0
        lines.append(
            f" {c:>4} {r.op:>14} {r.policy:>8} {format_size(r.size_bytes):>12} {old['time_us']:>12.3f} "
            f"{r.time_us:>12.3f} {change:>8.2f}  {busy}"
        )
    if replay.unchanged:
        n = 0 if replay.events is None else len(replay.events)
        verdict = (
            f"reproduces all {n} recorded stage events exactly"
            if replay.reproduced
            else f"DIFFERS from the recording: max |dt| = {replay.max_event_diff_us:.6g} us"
        )
        lines.append(f"# topology unchanged: the replay {verdict}")
    return "\n".join(lines)
