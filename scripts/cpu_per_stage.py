"""CPU time per stage: what splitting a collective into chunks costs each rank.

Usage::

    mpiexec -n 8 python -m mpi4py scripts/cpu_per_stage.py [-t 2x2x2] [--size-mib 1] [-c 1,8,64] [--iters 20]

For each chunk count, runs --iters all-reduces (baseline, virtual clock, unchecked) after one
warm-up and prints the wall time per collective, the CPU time per rank (``time.process_time``)
and the CPU summed over ranks divided by the cores: when that matches the wall time, the run is
CPU-bound. Writes cpu_per_stage.json into --out (default results/).
"""

import argparse
import os
import time

import numpy as np
from mpi4py import MPI

from themis_mpi.collectives import Collective
from themis_mpi.driver import RunConfig, run_collective
from themis_mpi.mpi.grid import CartGrid
from themis_mpi.mpi.transport import MpiTransport
from themis_mpi.output import write_json
from themis_mpi.topology import parse_topology


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("-t", "--topology", default="2x2x2")
    ap.add_argument("--size-mib", type=float, default=1.0)
    ap.add_argument("-c", "--chunks", default="1,8,64")
    ap.add_argument("--iters", type=int, default=20)
    ap.add_argument("--out", default="results", help="output folder (default results)")
    args = ap.parse_args()
    topo = parse_topology(args.topology)
    comm = MPI.COMM_WORLD
    cores = os.cpu_count() or 1
    rows = []
    with CartGrid(comm, topo) as grid:
        transport = MpiTransport(grid, RunConfig())  # keeps its buffers from one run to the next
        dims = tuple(range(len(topo.dims)))
        for chunks in [int(c) for c in args.chunks.split(",")]:
            coll = Collective("all_reduce", int(args.size_mib * 2**20) // 8, "float64", chunks, dims)
            _, engine = run_collective(transport, coll, "baseline", check=False)
            stages = len(engine.records)
            cpu0, wall0 = time.process_time(), time.perf_counter()
            for _ in range(args.iters):
                run_collective(transport, coll, "baseline", check=False)
            cpu = (time.process_time() - cpu0) / args.iters
            wall = (time.perf_counter() - wall0) / args.iters
            cpus = comm.gather(cpu, root=0)
            if comm.Get_rank() == 0:
                rows.append(
                    {
                        "chunks": chunks,
                        "stages_per_rank": stages,
                        "wall_ms": 1e3 * wall,
                        "cpu_ms_per_rank": 1e3 * float(np.mean(cpus)),
                        "cpu_ms_total_per_core": 1e3 * float(np.sum(cpus)) / cores,
                        "cpu_us_per_stage": 1e6 * float(np.mean(cpus)) / stages,
                    }
                )
    if comm.Get_rank() == 0:
        yields = os.environ.get("THEMIS_MPI_YIELDS", "20")
        print(
            f"# {comm.Get_size()} ranks on {cores} cores, {topo.label()}, {args.size_mib:g} MiB "
            f"float64 all-reduce, means of {args.iters}; THEMIS_MPI_YIELDS={yields}"
        )
        print(
            f"#{'chunks':>7} {'stages':>7} {'wall_ms':>8} {'cpu_ms/rank':>12} {'cpu_ms/core':>12} "
            f"{'us/stage':>9}"
        )
        for r in rows:
            print(
                f" {r['chunks']:>7} {r['stages_per_rank']:>7} {r['wall_ms']:>8.1f} "
                f"{r['cpu_ms_per_rank']:>12.1f} {r['cpu_ms_total_per_core']:>12.1f} "
                f"{r['cpu_us_per_stage']:>9.1f}"
            )
        os.makedirs(args.out, exist_ok=True)
        write_json(os.path.join(args.out, "cpu_per_stage.json"), rows)


if __name__ == "__main__":
    main()
