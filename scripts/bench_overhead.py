"""Emulator against MPI's own Allreduce, side by side in one run: time ratio and CPU per stage.

Usage::

    mpiexec -n 8 python -m mpi4py scripts/bench_overhead.py [-t 2x2x2] [-b 1M] [-e 256M] [-f 4]
        [-c 1,8,64] [--iters 5] [--out results]

Sizes go from -b to -e, multiplied by -f (nccl-tests' vocabulary). For every size and chunk
count, on the same ranks and float64 buffer size, --iters rounds of two variants, interleaved
(their order alternates from one round to the next, so machine noise and cache state hit both
alike):

- native: ``COMM_WORLD.Allreduce`` in place, after a barrier, the slowest rank's wall time;
- emulator: ``run_collective``, baseline order, virtual clock (no injected delays), unchecked;
  its ``wall_s`` (the slowest rank's, from the barrier that starts it, checks excluded).

One untimed warm-up round precedes them; its emulator run is checked (#wrong must be 0). CPU per
stage is each rank's ``time.process_time`` over one emulator run divided by the stages it served,
averaged over ranks (the median over rounds is shown); ``cpu_per_wall`` is the CPU of all ranks
divided by the cores and by the wall time: near 1 the run is CPU-bound, so fewer CPU seconds per
stage are what makes it faster on an oversubscribed machine.

Targets (issue 18), emulator/native at most: 1.2 from 64 MiB, 2 from 16 MiB, 8 below, at every
chunk count up to 64 (the issue states them for 64 chunks below 64 MiB; fewer chunks means fewer
stages for the same data). Prints a table; writes bench_overhead.json into --out (default results/).
"""

import argparse
import os
import statistics
import time

import numpy as np
from mpi4py import MPI

from themis_mpi.cli import parse_size, size_sweep
from themis_mpi.collectives import Collective
from themis_mpi.driver import RunConfig, run_collective
from themis_mpi.mpi.grid import CartGrid
from themis_mpi.mpi.transport import MpiTransport
from themis_mpi.output import write_json
from themis_mpi.topology import parse_topology

MIB = 2**20


def target_ratio(size_bytes: int) -> float:
    """The largest emulator/native time ratio issue 18 accepts at this size."""
    if size_bytes >= 64 * MIB:
        return 1.2
    if size_bytes >= 16 * MIB:
        return 2.0
    return 8.0


def native_s(grid: CartGrid, buf: np.ndarray) -> float:
    """MPI's own in-place Allreduce of `buf` over every rank: the slowest rank's wall seconds."""
    buf.fill(1.0)
    grid.wait(grid.cart.Ibarrier(), "the barrier before the native all-reduce")
    t0 = MPI.Wtime()
    MPI.COMM_WORLD.Allreduce(MPI.IN_PLACE, buf)
    return float(grid.watchdog.allreduce([MPI.Wtime() - t0], MPI.MAX)[0])


def emulator(
    grid: CartGrid, transport: MpiTransport, coll: Collective, check: bool
) -> tuple[float, float, float, int]:
    """One emulated all-reduce: wall seconds, mean CPU us per stage, CPU s of all ranks, #wrong."""
    cpu0_s = time.process_time()
    result, engine = run_collective(transport, coll, "baseline", check=check)
    cpu_s = time.process_time() - cpu0_s
    stages = max(1, len(engine.records))
    per_stage_us, total_s = grid.watchdog.allreduce([1e6 * cpu_s / stages, cpu_s], MPI.SUM)
    return result.wall_s, float(per_stage_us) / grid.size, float(total_s), result.wrong or 0


def measure(grid: CartGrid, transport: MpiTransport, coll: Collective, iters: int) -> dict:
    """Interleaved native and emulator rounds of one size and chunk count; medians and samples."""
    buf = np.empty(coll.count)
    native, emu, cpu_us, cpu_total = [], [], [], []
    _, _, _, wrong = emulator(grid, transport, coll, check=True)  # warm-up, checked
    native_s(grid, buf)
    for it in range(iters):
        for variant in ("native", "emulator") if it % 2 == 0 else ("emulator", "native"):
            if variant == "native":
                native.append(native_s(grid, buf))
            else:
                wall_s, per_stage_us, total_s, _ = emulator(grid, transport, coll, check=False)
                emu.append(wall_s)
                cpu_us.append(per_stage_us)
                cpu_total.append(total_s / (os.cpu_count() or 1) / wall_s)
    del buf
    native_med, emu_med = statistics.median(native), statistics.median(emu)
    size = coll.size_bytes
    ratio = emu_med / native_med
    return {
        "size_bytes": size,
        "chunks": coll.chunks,
        "ranks": grid.size,
        "native_s": native_med,
        "emulator_s": emu_med,
        "ratio": ratio,
        "cpu_us_per_stage": statistics.median(cpu_us),
        "cpu_per_wall": statistics.median(cpu_total),
        "target": target_ratio(size),
        "pass": ratio <= target_ratio(size),
        "wrong": wrong,
        "samples": {"native_s": native, "emulator_s": emu, "cpu_us_per_stage": cpu_us},
    }


def print_table(rows: list[dict], header: str) -> None:
    """The table of the rows, one per size and chunk count."""
    print(header)
    print(
        f"#{'size':>10} {'chunks':>6} {'native_s':>9} {'emulator_s':>10} {'ratio':>7} "
        f"{'us/stage':>9} {'cpu/wall':>8} {'target':>6} {'pass':>5} {'#wrong':>6}"
    )
    for r in rows:
        print(
            f" {r['size_bytes']:>10} {r['chunks']:>6} {r['native_s']:>9.4f} {r['emulator_s']:>10.4f} "
            f"{r['ratio']:>7.2f} {r['cpu_us_per_stage']:>9.1f} {r['cpu_per_wall']:>8.2f} "
            f"{r['target']:>6g} {'yes' if r['pass'] else 'NO':>5} {r['wrong']:>6}"
        )


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("-t", "--topology", default="2x2x2")
    ap.add_argument("-b", "--minbytes", default="1M", help="smallest size per rank (default 1M)")
    ap.add_argument("-e", "--maxbytes", default="256M", help="largest size per rank (default 256M)")
    ap.add_argument("-f", "--stepfactor", type=float, default=4, help="size multiplier (default 4)")
    ap.add_argument("-c", "--chunks", default="1,8,64", help="chunk counts (default 1,8,64)")
    ap.add_argument("--iters", type=int, default=5, help="timed rounds per row (default 5)")
    ap.add_argument("--out", default="results", help="output folder (default results)")
    args = ap.parse_args()
    topo = parse_topology(args.topology)
    sizes = size_sweep(parse_size(args.minbytes), parse_size(args.maxbytes), args.stepfactor)
    chunk_counts = [int(c) for c in args.chunks.split(",")]
    dims = tuple(range(len(topo.dims)))
    rows = []
    with CartGrid(MPI.COMM_WORLD, topo) as grid:
        transport = MpiTransport(grid, RunConfig())  # keeps its buffers from one run to the next
        for size in sizes:
            for chunks in chunk_counts:
                coll = Collective("all_reduce", size // 8, "float64", chunks, dims)
                rows.append(measure(grid, transport, coll, args.iters))
        rank = grid.rank
    if rank == 0:
        header = (
            f"# {MPI.COMM_WORLD.Get_size()} ranks on {os.cpu_count()} cores, topology {topo.label()}, "
            f"float64 all-reduce, medians of {args.iters} interleaved rounds; "
            f"{MPI.Get_library_version().splitlines()[0].strip()}"
        )
        print_table(rows, header)
        os.makedirs(args.out, exist_ok=True)
        write_json(os.path.join(args.out, "bench_overhead.json"), {"header": header, "rows": rows})


if __name__ == "__main__":
    main()
