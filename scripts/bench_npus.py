"""The per-NPU model's cost (issue 33 item 3): CPU time against NPU count, with one late NPU.

Usage::

    python scripts/bench_npus.py [--shapes 4x4x4,8x4x4,8x8x4,8x8x8,16x8x8,16x16x8,16x16x16]
        [--chunks 16,64] [--out results]

Each row is one all-reduce (64 MiB float32, Themis with scf) on a 3-dim topology of Ring,
FullyConnected and Switch dims (100, 200, 50 GB/s), with NPU 5 late by 50 us, on the model,
which then times every NPU at once (`themis_mpi.npus.stage_times`, equal to running every NPU:
tests/test_stragglers.py), in this process: its CPU time (``time.process_time``), the stage
steps every NPU ran, and CPU per NPU-step. The same collective on the one-NPU model
without the late NPU gives the closed-form check ``time = on-time + 50 us`` (column ``+50``),
which must hold on every row. Targets (issue 33): 1024 NPUs, 64 chunks under 10 s. Prints a
table and writes bench_npus.json and bench_npus.png (CPU against NPUs, log-log) into --out.
"""

from __future__ import annotations

import argparse
import os
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

from themis_mpi.collectives import Collective  # noqa: E402
from themis_mpi.config import RunConfig  # noqa: E402
from themis_mpi.output import write_json  # noqa: E402
from themis_mpi.run.collective import model_collective  # noqa: E402
from themis_mpi.topology import parse_topology  # noqa: E402

DELAY_NS = 50_000.0


def topology(shape: str):
    """Ring x FullyConnected x Switch with the given NPUs per dim."""
    a, b, c = (int(x) for x in shape.split("x"))
    return parse_topology(f"Ring({a},100,500)_FC({b},200,500)_SW({c},50,1000)")


def row(shape: str, chunks: int) -> dict:
    """One measured row."""
    topo = topology(shape)
    coll = Collective("all_reduce", 2**24, "float32", chunks, tuple(range(3)))
    on_time, _ = model_collective(topo, coll, "themis", RunConfig(intra="scf"))
    cpu0 = time.process_time()
    late, engine = model_collective(
        topo, coll, "themis", RunConfig(intra="scf", npu_delay_ns=((5, DELAY_NS),))
    )
    cpu_s = time.process_time() - cpu0
    steps = topo.npus * sum(len(engine.transport.cost(4).run_steps_ns(r)) for r in engine.records)
    return {
        "topology": topo.spec(),
        "npus": topo.npus,
        "chunks": chunks,
        "time_us": late.time_us,
        "closed_form_ok": abs(late.time_us - on_time.time_us - DELAY_NS / 1e3) < 1e-6,
        "cpu_s": cpu_s,
        "npu_steps": steps,
        "cpu_us_per_npu_step": cpu_s / steps * 1e6,
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument(
        "--shapes", default="4x4x4,8x4x4,8x8x4,8x8x8,16x8x8,16x16x8,16x16x16", help="NPUs per dim, a list"
    )
    ap.add_argument("--chunks", default="16,64", help="chunk counts (16,64)")
    ap.add_argument("--out", default="results", help="output folder (default results)")
    args = ap.parse_args()
    os.makedirs(args.out, exist_ok=True)
    rows = []
    print(
        f"{'topology':>36} {'npus':>6} {'chunks':>6} {'time_us':>10} {'+50':>4} {'cpu_s':>8} "
        f"{'us/npu-step':>11}"
    )
    for chunks in (int(c) for c in args.chunks.split(",")):
        for shape in args.shapes.split(","):
            r = row(shape, chunks)
            rows.append(r)
            print(
                f"{r['topology']:>36} {r['npus']:>6} {chunks:>6} {r['time_us']:>10.2f} "
                f"{'ok' if r['closed_form_ok'] else 'NO':>4} {r['cpu_s']:>8.2f} "
                f"{r['cpu_us_per_npu_step']:>11.2f}",
                flush=True,
            )
            write_json(os.path.join(args.out, "bench_npus.json"), {"rows": rows})
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from themis_mpi.output import atomic_path

    fig, ax = plt.subplots(figsize=(5, 3.5))
    for chunks in sorted({r["chunks"] for r in rows}):
        pts = [(r["npus"], r["cpu_s"]) for r in rows if r["chunks"] == chunks]
        ax.loglog(*zip(*pts), marker="o", label=f"{chunks} chunks")
    ax.set_xlabel("NPUs")
    ax.set_ylabel("CPU s (one late NPU)")
    ax.legend()
    with atomic_path(os.path.join(args.out, "bench_npus.png")) as tmp:
        fig.savefig(tmp, format="png", dpi=110)
    if not all(r["closed_form_ok"] for r in rows):
        sys.exit(1)


if __name__ == "__main__":
    main()
