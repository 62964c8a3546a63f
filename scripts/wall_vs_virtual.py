"""Wall-clock mode against the virtual clock: does really waiting the delays reproduce the times?

Run under mpiexec, e.g. ``mpiexec -n 8 python scripts/wall_vs_virtual.py --target-s 3``. For each
policy the virtual-clock time T is measured first (checked); the time scale is then chosen so the
wall run lasts about --target-s seconds, and the wall-derived emulated time is compared with T.
The wall run is not checked: the driver's wall time includes the check, which would add to the
error (its ``wrong`` is null). Prints a table and writes wall_vs_virtual.json into --out (default
results/).
"""

import argparse
import os

from mpi4py import MPI

from themis_mpi.collectives import Collective
from themis_mpi.config import RunConfig
from themis_mpi.mpi.grid import CartGrid
from themis_mpi.mpi.transport import MpiTransport
from themis_mpi.output import write_json
from themis_mpi.run.collective import run_collective
from themis_mpi.topology import parse_topology


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("-t", "--topology", default="2x2x2")
    ap.add_argument("-b", "--size-mib", type=int, default=64)
    ap.add_argument("-c", "--chunks", type=int, default=64)
    ap.add_argument("--target-s", type=float, default=3.0)
    ap.add_argument("--out", default="results", help="output folder (default results)")
    args = ap.parse_args()
    topo = parse_topology(args.topology)
    rows = []
    with CartGrid(MPI.COMM_WORLD, topo) as grid:
        coll = Collective(
            "all_reduce", args.size_mib * 2**20 // 8, "float64", args.chunks, tuple(range(len(topo.dims)))
        )
        for policy, intra in (("baseline", "fifo"), ("themis", "scf")):
            ideal = RunConfig(intra=intra, network="ideal")  # (the wall clock runs ideal: like with like)
            virtual, _ = run_collective(MpiTransport(grid, ideal), coll, policy)
            scale = args.target_s / (virtual.time_us * 1e-6)
            config = RunConfig(intra=intra, clock="wall", time_scale=scale)
            wall, _ = run_collective(MpiTransport(grid, config), coll, policy, check=False)
            rows.append(
                {
                    "policy": policy,
                    "virtual_us": virtual.time_us,
                    "time_scale": scale,
                    "wall_s": wall.wall_s,
                    "wall_us": wall.time_us,
                    "error": wall.time_us / virtual.time_us - 1,
                    "wrong": [virtual.wrong, wall.wrong],
                }
            )
    if grid.rank == 0:
        print(f"# {topo.label()}, {topo.npus} ranks, {args.size_mib} MiB all-reduce, {args.chunks} chunks")
        print(
            f"#{'policy':>9} {'virtual_us':>11} {'scale':>10} {'wall_s':>8} {'wall_us':>11} "
            f"{'error%':>7} {'#wrong':>7}"
        )
        for r in rows:
            print(
                f" {r['policy']:>9} {r['virtual_us']:>11.2f} {r['time_scale']:>10.0f} "
                f"{r['wall_s']:>8.3f} {r['wall_us']:>11.2f} {100 * r['error']:>7.2f} "
                f"{sum(w for w in r['wrong'] if w is not None):>7}"
            )
        os.makedirs(args.out, exist_ok=True)
        write_json(os.path.join(args.out, "wall_vs_virtual.json"), rows)


if __name__ == "__main__":
    main()
