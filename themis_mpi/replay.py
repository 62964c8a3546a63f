"""Replay a trace: the recorded chunk orders and sizes, again, on the same or a changed network.

Without mpiexec the model replays; under mpiexec (one rank per NPU) the emulator replays on real
data. An unchanged replay must reproduce every recorded event time exactly, and says whether it
did; a changed topology (another preset with the same dim sizes, or per-dim bandwidth, latency or
algorithm overrides) answers a what-if question about the same schedule.
"""

from __future__ import annotations

import numpy as np

from .collectives import Collective
from .errors import UsageError
from .launch import under_mpiexec
from .topology import parse_topology
from .trace import Trace, TraceRecorder


def recorded_collectives(trace: Trace):
    """(Collective, policy, intra, orders) of every collective in the trace, in order."""
    n = len(trace.topology_table)
    for c in trace.collectives["collective"].tolist():
        row = trace.collective_row(c)
        dims = tuple(d for d in range(n) if row["dims_mask"] >> d & 1)
        coll = Collective(row["op"], row["count"], row["dtype"], row["chunks"], dims, row["redop"])
        yield coll, row["policy"], row["intra"], trace.orders(c)


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


def replay(args) -> int:
    """Run the replay described by the CLI arguments; rank 0 prints and writes."""
    from .cli import _topology, _write_json

    trace = Trace(args.trace)
    recorded_topo = trace.topology()
    topo = _topology(args, parse_topology(args.topology) if args.topology else recorded_topo)
    if topo.shape != recorded_topo.shape:
        raise UsageError(f"replay needs the recorded dim sizes {'x'.join(map(str, recorded_topo.shape))}, "
                         f"got {'x'.join(map(str, topo.shape))}")
    unchanged = topo.dims == recorded_topo.dims
    active = int(trace.attrs.get("active_per_dim", 1))
    delay = float(trace.attrs.get("endpoint_delay_ns", 0.0))
    use_mpi = under_mpiexec()
    recorder = TraceRecorder(topo, "mpi" if use_mpi else "model", clock="virtual", time_scale=1.0,
                             active_per_dim=active, endpoint_delay_ns=delay)
    rows, rank, events = [], 0, None
    if use_mpi:
        from mpi4py import MPI

        from .emulator import CartGrid, run_collective

        with CartGrid(MPI.COMM_WORLD, topo) as grid:
            rank = grid.rank
            for coll, policy, intra, orders in recorded_collectives(trace):
                row, engine = run_collective(grid, coll, policy, intra, active, endpoint_delay_ns=delay,
                                             orders=orders, timeout_s=args.timeout_s)
                rows.append(row)
                recorder.add_run(row, engine, rank)
            events = recorder.gather_events(grid.cart)
    else:
        from .model import model_collective

        for coll, policy, intra, orders in recorded_collectives(trace):
            row, engine = model_collective(topo, coll, policy, intra, active, delay, orders=orders)
            rows.append(row)
            recorder.add_run(row, engine)
        events = np.concatenate(recorder.events)
        recorded_ranks = np.unique(trace.events["rank"])
        if len(recorded_ranks) > 1:  # the model's NPU stands for every recorded rank
            events = np.concatenate([_with_rank(events, r) for r in recorded_ranks])
    if rank != 0:
        return 0
    diff = compare_events(trace.events, events)
    out = []
    print(f"# replay of {args.trace} ({trace.attrs['transport']}, {trace.attrs['topology_label']}) on "
          f"{'the emulator' if use_mpi else 'the model'}, topology {topo.label()}"
          + ("" if unchanged else " (changed)"))
    print(f"#{'coll':>4} {'op':>14} {'policy':>8} {'size_bytes':>12} {'recorded_us':>12} {'replay_us':>12} "
          f"{'change%':>8}  per-dim busy_us recorded -> replay")
    for c, row in enumerate(rows):
        old = trace.collective_row(c)
        old_dims = trace.summary[trace.summary["collective"] == c]
        busy = "  ".join(f"d{d['dim']}:{o:.2f}->{d['busy_us']:.2f}"
                         for d, o in zip(row["dims"], old_dims["busy_us"]))
        change = 100 * (row["time_us"] / old["time_us"] - 1) if old["time_us"] else 0.0
        print(f" {c:>4} {row['op']:>14} {row['policy']:>8} {row['size_bytes']:>12} {old['time_us']:>12.3f} "
              f"{row['time_us']:>12.3f} {change:>8.2f}  {busy}")
        out.append({"collective": c, "recorded_us": old["time_us"], "replay_us": row["time_us"],
                    "change": change / 100, "row": row})
    if unchanged:
        verdict = (f"reproduces all {len(events)} recorded stage events exactly" if diff == 0
                   else f"DIFFERS from the recording: max |dt| = {diff:.6g} us")
        print(f"# topology unchanged: the replay {verdict}")
    if args.json:
        _write_json(args.json, {"unchanged": unchanged,
                                "max_event_diff_us": diff if np.isfinite(diff) else None,
                                "collectives": out})
    if args.out_trace:
        recorder.write(args.out_trace, events)
    return 0 if (not unchanged or diff == 0) else 1


def _with_rank(events: np.ndarray, rank: int) -> np.ndarray:
    out = events.copy()
    out["rank"] = rank
    return out



def replay_workload(args) -> int:
    """Training iterations of a workload under each policy; prints the table and the speedup."""
    from .cli import _policies, _topology, _write_json
    from .training import model_training, mpi_training
    from .workload import parse_workload

    wl = parse_workload(args.workload)
    topo = _topology(args, parse_topology(args.topology or "2x2x2"))
    if args.chunks < 1:
        raise UsageError(f"chunks must be >= 1, got {args.chunks}")
    kw = dict(chunks=args.chunks, dtype=args.dtype, iterations=args.iterations,
              compute_scale=args.compute_scale, comm_scale=args.comm_scale,
              active_per_dim=args.active_chunks_per_dim,
              endpoint_delay_ns=args.endpoint_delay_ns)
    rows, rank = [], 0
    if under_mpiexec():
        from mpi4py import MPI

        from .emulator import CartGrid

        with CartGrid(MPI.COMM_WORLD, topo) as grid:
            rank = grid.rank
            rows = [mpi_training(grid, wl, policy, intra, timeout_s=args.timeout_s, **kw)
                    for policy, intra in _policies(args)]
    else:
        rows = [model_training(wl, topo, policy, intra, **kw) for policy, intra in _policies(args)]
    if rank != 0:
        return 0
    base = next((r for r in rows if r["policy"] == "baseline"), None)
    for r in rows:
        r["speedup"] = base["iteration_us"] / r["iteration_us"] if base and r["iteration_us"] else None
        r.update(workload=args.workload, topology=topo.label(), npus=topo.npus)
    print(f"# workload {args.workload}: {wl.parallelism}, {len(wl.layers)} layers; topology {topo.label()}, "
          f"{topo.npus} NPUs; {args.iterations} iterations, {args.chunks} chunks per collective, "
          f"{'emulator' if rows and rows[0]['transport'] == 'mpi' else 'model'}")
    dim_cols = "".join(f" {'dim' + str(d) + '%':>6}" for d in range(len(topo.dims)))
    print(f"#{'policy':>9} {'intra':>5} {'iteration_us':>13} {'compute_us':>11} {'exposed_us':>11} "
          f"{'colls':>6} {'#wrong':>7}{dim_cols} {'speedup':>8}")
    for r in rows:
        wrong = "N/A" if r["wrong"] is None else r["wrong"]
        speed = f"{r['speedup']:.3f}x" if r["speedup"] else "-"
        print(f" {r['policy']:>9} {r['intra']:>5} {r['iteration_us']:>13.2f} {r['compute_us']:>11.2f} "
              f"{r['exposed_comm_us']:>11.2f} {r['collectives']:>6} {wrong:>7}"
              + "".join(f" {100 * d['utilization']:>6.1f}" for d in r["dims"]) + f" {speed:>8}")
    if args.json:
        _write_json(args.json, rows)
    return 0
