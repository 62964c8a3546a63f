"""The model's CPU time under each sharing rule, side by side: the cost of shared links.

For each paper topology (1024 NPUs) and policy, one all-reduce of --size in --chunks chunks on the
model under ``ideal``, ``fair``, ``packet`` (the default) and ``store-forward``, repeated
--repeats times with the rules interleaved; prints the median CPU ms per run and the ratios of
``fair`` and ``packet`` to ``ideal`` (target: fair within 3x) and of ``packet`` to ``fair``, and
writes ``bench_network.json`` into --out.

    python scripts/bench_network.py --out results/bench-network
"""

from __future__ import annotations

import argparse
import os
import time

from themis_mpi.collectives import Collective
from themis_mpi.config import RunConfig
from themis_mpi.output import write_json
from themis_mpi.results import median
from themis_mpi.run.collective import model_collective
from themis_mpi.topology import parse_topology
from themis_mpi.units import parse_size

TOPOLOGIES = (
    "3D-SW_SW_SW_hetero",
    "3D-FC_Ring_SW",
    "4D-Ring_SW_SW_SW",
    "4D-Ring_FC_Ring_SW",
    "HGX-H100-SW_SW_SW",
)
POLICIES = (("baseline", "fifo"), ("themis", "scf"))
RULES = ("ideal", "fair", "packet", "store-forward")
TARGET = 3.0  # fair's CPU over ideal's


def main(argv: list[str] | None = None) -> int:
    """Print the table; write the JSON; exit 1 when fair misses the target somewhere."""
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--size", default="64M", help="bytes per NPU (64M)")
    ap.add_argument("--chunks", type=int, default=64, help="chunks (64)")
    ap.add_argument("--repeats", type=int, default=7, help="runs per cell, rules interleaved (7)")
    ap.add_argument("--out", default=os.path.join("results", "bench-network"), help="output directory")
    args = ap.parse_args(argv)
    size = parse_size(args.size)
    rows, ok = [], True
    print(f"# model CPU per all-reduce of {args.size} in {args.chunks} chunks, median of {args.repeats}")
    print(
        f"#{'topology':>20} {'policy':>8} "
        + " ".join(f"{r + '_ms':>16}" for r in RULES)
        + " fair/ideal packet/ideal packet/fair"
    )
    for name in TOPOLOGIES:
        topo = parse_topology(name)
        coll = Collective("all_reduce", size // 4, "float32", args.chunks, tuple(range(len(topo.dims))))
        for policy, intra in POLICIES:
            cpu: dict[str, list[float]] = {r: [] for r in RULES}
            times = {}
            for _ in range(args.repeats):
                for rule in RULES:
                    t0 = time.process_time()
                    result, _ = model_collective(topo, coll, policy, RunConfig(intra=intra, network=rule))
                    cpu[rule].append((time.process_time() - t0) * 1e3)
                    times[rule] = result.time_us
            ms = {r: median(v) for r, v in cpu.items()}
            ratio = ms["fair"] / ms["ideal"]
            packet = ms["packet"] / ms["ideal"]
            packet_fair = ms["packet"] / ms["fair"]
            ok &= ratio <= TARGET
            rows.append(
                {
                    "topology": name,
                    "policy": policy,
                    "cpu_ms": ms,
                    "time_us": times,
                    "fair_over_ideal": ratio,
                    "packet_over_ideal": packet,
                    "packet_over_fair": packet_fair,
                }
            )
            print(
                f" {name:>20} {policy:>8} "
                + " ".join(f"{ms[r]:>16.2f}" for r in RULES)
                + f" {ratio:>9.2f}x {packet:>11.2f}x {packet_fair:>10.2f}x"
            )
    os.makedirs(args.out, exist_ok=True)
    path = os.path.join(args.out, "bench_network.json")
    write_json(
        path,
        {"size_bytes": size, "chunks": args.chunks, "repeats": args.repeats, "target": TARGET, "rows": rows},
    )
    print(f"# fair within {TARGET:g}x of ideal everywhere: {'yes' if ok else 'NO'}; wrote {path}")
    return 0 if ok else 1


if __name__ == "__main__":
    raise SystemExit(main())
