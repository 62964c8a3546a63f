"""Emulator data-path overhead against MPI's own Allreduce, measured side by side in one run.

Usage::

    mpiexec -n 8 python -m mpi4py scripts/bench_overhead.py [-t 2x2x2] [-b 1M] [-e 256M] [--iters 5]

For every size, on the same ranks and dtype (float64), each repeated --iters times with the three
variants interleaved (so machine noise hits them alike):

- native: ``COMM_WORLD.Allreduce`` (in place);
- emulator: ``run_collective``, baseline order, virtual clock (no injected delays), all
  bookkeeping on, unchecked in the timed iterations; the untimed warm-up round is checked
  (wrong must be 0);
- emulator+trace: the same, plus the per-rank event table a trace is built from.

Prints medians and the emulator/native ratio per size; writes bench_overhead.json into --out
(default results/).
"""

import argparse
import os
import statistics

import numpy as np
from mpi4py import MPI

from themis_mpi.cli import parse_size
from themis_mpi.collectives import Collective
from themis_mpi.driver import RunConfig, run_collective
from themis_mpi.mpi.grid import CartGrid
from themis_mpi.mpi.transport import MpiTransport
from themis_mpi.output import write_json
from themis_mpi.topology import parse_topology
from themis_mpi.trace import TraceRecorder


def native_s(grid: CartGrid, comm: MPI.Comm, buf: np.ndarray) -> float:
    buf.fill(1.0)
    grid.wait(comm.Ibarrier(), "the barrier before the native all-reduce")
    t0 = MPI.Wtime()
    comm.Allreduce(MPI.IN_PLACE, buf)
    return float(grid.watchdog.allreduce([MPI.Wtime() - t0], MPI.MAX)[0])


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("-t", "--topology", default="2x2x2")
    ap.add_argument("-b", "--minbytes", default="1M")
    ap.add_argument("-e", "--maxbytes", default="256M")
    ap.add_argument("-f", "--stepfactor", type=int, default=4)
    ap.add_argument("-c", "--chunks", type=int, default=8)
    ap.add_argument("--iters", type=int, default=5)
    ap.add_argument("--out", default="results", help="output folder (default results)")
    args = ap.parse_args()
    topo = parse_topology(args.topology)
    comm = MPI.COMM_WORLD
    sizes, size = [], parse_size(args.minbytes)
    while size <= parse_size(args.maxbytes):
        sizes.append(size)
        size *= args.stepfactor
    rows = []
    with CartGrid(comm, topo) as grid:
        transport = MpiTransport(grid, RunConfig())  # keeps its buffers from one run to the next
        dims = tuple(range(len(topo.dims)))
        for size in sizes:
            coll = Collective("all_reduce", size // 8, "float64", args.chunks, dims)
            buf = np.ones(coll.count)
            times = {"native": [], "emulator": [], "emulator+trace": []}
            wrong = 0
            for it in range(args.iters + 1):  # the first round warms up, checked
                check = it == 0
                times["native"].append(native_s(grid, comm, buf))
                result, engine = run_collective(transport, coll, "baseline", check=check)
                times["emulator"].append(result.wall_s)
                wrong += result.wrong or 0
                grid.wait(grid.cart.Ibarrier(), "the barrier before the traced run")
                t0 = MPI.Wtime()
                result, engine = run_collective(transport, coll, "baseline", check=check)
                TraceRecorder(topo, "mpi").add_run(result, engine, grid.rank)
                elapsed = grid.watchdog.allreduce([MPI.Wtime() - t0], MPI.MAX)
                times["emulator+trace"].append(float(elapsed[0]))
                wrong += result.wrong or 0
            med = {k: statistics.median(v[1:]) for k, v in times.items()}
            rows.append(
                {
                    "size_bytes": size,
                    "chunks": args.chunks,
                    "ranks": comm.Get_size(),
                    "native_s": med["native"],
                    "emulator_s": med["emulator"],
                    "emulator_trace_s": med["emulator+trace"],
                    "ratio": med["emulator"] / med["native"],
                    "ratio_trace": med["emulator+trace"] / med["native"],
                    "wrong": wrong,
                    "samples": {k: v[1:] for k, v in times.items()},
                }
            )
    if comm.Get_rank() == 0:
        print(
            f"# {comm.Get_size()} ranks, topology {topo.label()}, float64 all-reduce, {args.chunks} "
            f"chunks, medians of {args.iters} interleaved iterations; "
            f"{MPI.Get_library_version().splitlines()[0]}"
        )
        print(
            f"#{'size':>10} {'native_s':>10} {'emulator_s':>11} {'emu+trace_s':>12} {'ratio':>7} "
            f"{'ratio_tr':>8} {'#wrong':>7}"
        )
        for r in rows:
            print(
                f" {r['size_bytes']:>10} {r['native_s']:>10.4f} {r['emulator_s']:>11.4f} "
                f"{r['emulator_trace_s']:>12.4f} {r['ratio']:>7.2f} {r['ratio_trace']:>8.2f} "
                f"{r['wrong']:>7}"
            )
        os.makedirs(args.out, exist_ok=True)
        write_json(os.path.join(args.out, "bench_overhead.json"), rows)


if __name__ == "__main__":
    main()
